"""Compiled-kernel facts: registers, spills and SASS instruction counts of kernel variants, without a GPU.

Three experiments, each a list of kernel variants compiled with Triton for a ``GPUTarget`` and read with
``analysis.families.compiled.sass`` (registers, stack frame, shared memory; instruction counts of the whole
kernel, of its hot loop, the consumer's K/V tile, and of its load loop, the producer's):

- ``fa3-schedules``: the FA-3 kernel (``kernels/attention/fa3.py``) in each schedule of ``fa3.SCHEDULES``,
  per head dim: what each technique changes in the machine code.
- ``producer-registers``: the FA-3 kernel with TMA loads and with per-thread ``cp.async`` copies, its
  producer warpgroup given each register budget of the config (``setmaxnreg``; the two consumers get the
  rest, a multiple of 8 each, so the producer's budget moves in steps of 16):
  where the producer's own code (its load loop) starts to spill shows how many registers loading needs.
- ``mma-issue``: our FA-2 forward (``kernels/attention/fa2.py``), one tile configuration, compiled for
  sm_90 (warpgroup MMA, ``wgmma``) and for sm_80 (per-warp ``mma.sync``): MMA instructions per warp per
  K/V tile of the same size, and the hot loop's whole instruction mix by pipe with its floating-point work
  on the tensor pipe and off it (``sass.mix``, ``sass.flops``).

The rows are properties of the compiler and the code, not of a GPU: the same Triton on any machine gives
the same numbers, so the pipeline computes them on the CPU, once per run (a GPU-independent family) and the audit
reads them for the claims about TMA's registers, WGMMA's instruction issue and the inner loop's share of
tensor-core instructions. Not handled: timing.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from analysis.core.provenance import now_utc
from analysis.families.compiled import sass
from analysis.families.compiled.plan import CompiledSpec, jobs

log = logging.getLogger(__name__)

# FA-2's GPU tile at d=128 (fa2.default_configs' first: 128×128, 8 warps, 3 stages), compiled for both targets
FA2_TILE = "BLOCK_M=128,BLOCK_N=128,num_warps=8,num_stages=3"
_DTYPES = {"float16": "fp16", "bfloat16": "bf16"}


def fa3_kernel(
    head_dim: int, dtype: str, causal: bool, schedule: str = "fa3", producer_regs: int | None = None, fp8: bool = False
):
    """The FA-3 kernel variant compiled for sm_90 (its default tiles for the head dim); ``fp8``: e4m3 inputs
    (``dtype`` is then the output's)."""
    import torch
    from triton.experimental.gluon import language as gl

    from kernels.attention import fa3

    sched = fa3.schedule_of(schedule)
    config = fa3.default_config(head_dim, fp8)
    constexprs, options = fa3.kernel_specialisation(
        config, sched, causal, head_dim, producer_regs, fp8=fp8, p_scale=256.0
    )
    out_name, out_gl = _DTYPES[dtype], fa3.gl_dtype(getattr(torch, dtype))
    name, gdt = ("fp8e4nv", gl.float8e4nv) if fp8 else (out_name, out_gl)

    def desc(rows: int, cols: int, ty: str, gty) -> str:
        layout = gl.NVMMASharedLayout.get_default_for([1, 1, rows, cols], gty)
        return f"tensordesc<{ty}[1,1,{rows},{cols}],{layout!r}>"

    rows = fa3.q_tile_rows(config, sched)
    v_tile = (head_dim, config.block_n) if fp8 else (config.block_n, head_dim)
    kinds = {
        "q_desc": desc(rows, head_dim, name, gdt),
        "o_desc": desc(rows, head_dim, out_name, out_gl),
        "k_desc": desc(config.block_n, head_dim, name, gdt),
        "v_desc": desc(*v_tile, name, gdt),
        "q_ptr": f"*{name}",
        "k_ptr": f"*{name}",
        "v_ptr": f"*{name}",
        "lse_ptr": "*fp32",
        "qs_ptr": "*fp32",
        "ks_ptr": "*fp32",
        "vs_ptr": "*fp32",
        "qk_scale": "fp32",
    }
    return sass.compile_kernel(fa3.forward_kernel(), kinds, constexprs, 90, options, gluon=True), config


def fa2_kernel(head_dim: int, dtype: str, causal: bool, capability: int, tile: str = FA2_TILE):
    """Our FA-2 forward kernel for one tile configuration, aligned inputs and even tiles."""
    from kernels.attention import fa2

    cfg = fa2.FA2Config.parse(tile)
    name = _DTYPES[dtype]
    constexprs = dict(
        CU_Q=None,
        CU_K=None,
        stride_qd=1,
        stride_kd=1,
        stride_vd=1,
        stride_od=1,
        HEAD_DIM=head_dim,
        BLOCK_D=head_dim,
        IS_CAUSAL=causal,
        IS_FP32=False,
        IS_VARLEN=False,
        EAGER_RESCALE=False,
        EVEN_M=True,
        EVEN_N=True,
        EVEN_D=True,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
    )
    kinds = {"Q": f"*{name}", "K": f"*{name}", "V": f"*{name}", "Out": f"*{name}", "LSE": "*fp32", "sm_scale": "fp32"}
    options = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return sass.compile_kernel(fa2.forward_kernel(), kinds, constexprs, capability, options), cfg


def _row(
    experiment: str,
    kernel: str,
    target: str,
    head_dim: int,
    dtype: str,
    causal: bool,
    variant: str,
    compiled,
    tile_m: int,
    tile_n: int,
    **extra,
) -> dict:
    facts = sass.summary(sass.read(compiled.asm["cubin"]), compiled.metadata.shared)
    return {
        "experiment": experiment,
        "kernel": kernel,
        "target": target,
        "head_dim": head_dim,
        "dtype": dtype,
        "causal": causal,
        "variant": variant,
        "tile_m": tile_m,
        "tile_n": tile_n,
        **extra,
        **facts,
        "status": "ok",
        "message": "",
        "timestamp": now_utc(),
    }


def _failed(
    experiment: str,
    kernel: str,
    target: str,
    head_dim: int,
    dtype: str,
    causal: bool,
    variant: str,
    exc: Exception,
    **extra,
) -> dict:
    return {
        "experiment": experiment,
        "kernel": kernel,
        "target": target,
        "head_dim": head_dim,
        "dtype": dtype,
        "causal": causal,
        "variant": variant,
        **extra,
        "status": "error",
        "message": f"{type(exc).__name__}: {str(exc).splitlines()[-1][:300] if str(exc) else ''}",
        "timestamp": now_utc(),
    }


def run_job(job: tuple) -> dict:
    """One compiled variant as a row (a compile that fails is a row with status "error")."""
    experiment, d, dtype, causal, variant, regs = job
    extra = {"producer_regs": regs} if regs is not None else {}
    try:
        if experiment == "mma-issue":
            compiled, cfg = fa2_kernel(d, dtype, causal, int(variant.removeprefix("sm_")))
            return _row(experiment, "fa2", variant, d, dtype, causal, variant, compiled, cfg.block_m, cfg.block_n)
        compiled, cfg = fa3_kernel(d, dtype, causal, variant, regs)
        return _row(experiment, "fa3", "sm_90", d, dtype, causal, variant, compiled, 64, cfg.block_n, **extra)
    except Exception as exc:  # a variant that does not compile is a result, not a crashed step
        log.warning("%s %s d=%s %s: %s", experiment, variant, d, regs, exc)
        kernel = "fa2" if experiment == "mma-issue" else "fa3"
        target = variant if experiment == "mma-issue" else "sm_90"
        return _failed(experiment, kernel, target, d, dtype, causal, variant, exc, **extra)


def run(spec: CompiledSpec, env: dict, device: str, log_line: Callable[[str], None], files) -> list[dict]:
    """Every variant of ``spec``, each compiled in a process of its own (``spec.workers`` at a time): Triton
    compiles in the calling process, and a fresh interpreter per variant keeps the workflow step free of
    multiprocessing's re-import of its script. Nothing runs on a GPU (``device``, ``env`` and ``files`` are
    not used: the rows are the same on every machine)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, spec.workers)) as pool:
        rows = list(pool.map(_run_in_process, jobs(dataclasses.asdict(spec))))
    log_line(f"compiled {len(rows)} kernel variants ({sum(r['status'] != 'ok' for r in rows)} failed)")
    return rows


def _run_in_process(job: tuple) -> dict:
    import json
    import os
    import subprocess
    import sys

    from analysis.core.paths import ROOT

    root = str(ROOT)
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-m", "analysis.families.compiled.run", json.dumps(job)],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return _failed(
            job[0],
            "fa2" if job[0] == "mma-issue" else "fa3",
            job[4] if job[0] == "mma-issue" else "sm_90",
            job[1],
            job[2],
            job[3],
            job[4],
            RuntimeError(done.stderr.strip()[-300:] or "no output"),
            **({"producer_regs": job[5]} if job[5] is not None else {}),
        )
    return json.loads(lines[-1])


if __name__ == "__main__":  # one variant: python -m analysis.families.compiled.run '<job as JSON>'
    import json
    import sys

    print(json.dumps(run_job(tuple(json.loads(sys.argv[1])))), flush=True)
