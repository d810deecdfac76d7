"""Attention forward experiments: one shard of the grid in, tidy rows out.

A shard is one (experiment, dtype, head_dim, causal) combination with its list of sequence lengths and
implementations; ``run(spec)`` measures every (N, implementation) point of it with the harness and
returns one row per point, whatever happened to it. The shapes follow the experiment:

- ``fa2-setting`` (FlashAttention-2 paper): batch × seqlen = ``tokens`` (16384), heads = ``hidden`` /
  head_dim (2048 / d), so every point does the same work per token.
- ``memory`` (the second article's experiment 1): fixed ``batch`` and ``heads`` (1 × 16), N grows until
  the materialising implementations run out of memory.
- ``interpreter-check``: tiny, odd shapes run through Triton's interpreter on the CPU to check the
  kernel's output; nothing is timed (``timed`` is False in those rows).

The correctness gate compares each implementation's output with a float64 reference on a sample of
query rows (the first and last ``check_rows // 2`` of batch 0, every head), bounded by the error of
plain PyTorch at the same precision on the same rows (``kernels.tolerance``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable

import torch

from analysis import harness
from analysis.flops import attention_flops, tflops
from analysis.provenance import now_utc, row_provenance
from kernels import tolerance
from kernels.attention import reference

log = logging.getLogger(__name__)

IMPLS = ("ours-fa2", "naive", "sdpa-math", "sdpa-efficient", "sdpa-flash", "sdpa-cudnn")
EXPERIMENTS = ("fa2-setting", "memory", "interpreter-check")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclasses.dataclass
class Spec:
    """One shard of the attention grid (see ``workflow/config.yaml`` for what each field means)."""

    experiment: str
    dtype: str
    head_dim: int
    causal: bool
    seqlens: list[int]
    impls: list[str]
    tokens: int = 16384
    hidden: int = 2048
    batch: int = 1
    heads: int = 16
    seqlen_k: list[int] | None = None  # interpreter checks only: key lengths (default: = seqlens)
    check_rows: int = 128
    warmup_ms: float = harness.DEFAULT_WARMUP_MS
    rep_ms: float = harness.DEFAULT_REP_MS
    seed: int = 0

    def __post_init__(self):
        if self.experiment not in EXPERIMENTS:
            raise ValueError(f"unknown experiment {self.experiment!r}; known: {EXPERIMENTS}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; known: {list(DTYPES)}")
        unknown = set(self.impls) - set(IMPLS)
        if unknown:
            raise ValueError(f"unknown implementations {sorted(unknown)}; known: {IMPLS}")
        if self.seqlen_k is not None and len(self.seqlen_k) != len(self.seqlens):
            raise ValueError("seqlen_k must list one key length per entry of seqlens")

    def shape(self, index: int) -> tuple[int, int, int, int]:
        """(batch, heads, seqlen_q, seqlen_k) of the index-th point."""
        n = self.seqlens[index]
        nk = self.seqlen_k[index] if self.seqlen_k else n
        if self.experiment == "fa2-setting":
            if self.hidden % self.head_dim:
                raise ValueError(f"hidden {self.hidden} is not a multiple of head_dim {self.head_dim}")
            return max(1, self.tokens // n), self.hidden // self.head_dim, n, nk
        return self.batch, self.heads, n, nk


def implementation(name: str) -> Callable:
    """The callable ``f(q, k, v, causal) -> out`` benchmarked under ``name``."""
    if name == "ours-fa2":
        from kernels.attention import fa2

        return lambda q, k, v, causal: fa2.attention(q, k, v, causal=causal)
    if name == "naive":
        return lambda q, k, v, causal: reference.naive_attention(q, k, v, causal)
    if name.startswith("sdpa-"):
        backend = name.removeprefix("sdpa-")
        return lambda q, k, v, causal: reference.sdpa_attention(q, k, v, causal, backend=backend)
    raise ValueError(f"unknown implementation {name!r}")


def _kernel_config(name: str) -> str:
    if name == "ours-fa2":
        from kernels.attention import fa2

        cfg = fa2.last_config()
        return str(cfg) if cfg else ""
    return ""


def _check_rows(seqlen_q: int, n_rows: int) -> torch.Tensor:
    half = max(1, n_rows // 2)
    if seqlen_q <= 2 * half:
        return torch.arange(seqlen_q)
    # the first rows see the fewest keys under a causal mask, the last rows the most
    return torch.cat([torch.arange(half), torch.arange(seqlen_q - half, seqlen_q)])


def run(spec: Spec, env: dict, device: str = "cuda", log_line: Callable[[str], None] = log.info) -> list[dict]:
    """Measure every point of ``spec``; returns rows in ``analysis.tables`` format."""
    timed = spec.experiment != "interpreter-check"
    dtype = DTYPES[spec.dtype]
    prov = row_provenance(env)
    progress = harness.Progress(len(spec.seqlens) * len(spec.impls), log_line)
    rows: list[dict] = []
    gen = torch.Generator(device="cpu").manual_seed(spec.seed)

    for i in range(len(spec.seqlens)):
        b, h, nq, nk = spec.shape(i)
        base = {
            "experiment": spec.experiment,
            "family": "attention",
            "op": "attention",
            "dtype": spec.dtype,
            "mode": "fwd",
            "batch": b,
            "heads": h,
            "heads_kv": h,
            "seqlen_q": nq,
            "seqlen_k": nk,
            "head_dim": spec.head_dim,
            "causal": bool(spec.causal),
            "timed": timed,
            **prov,
        }
        shape_text = f"B={b} H={h} Nq={nq} Nk={nk} d={spec.head_dim} causal={spec.causal} {spec.dtype}"
        try:
            q, k, v = (
                torch.randn((b, h, n, spec.head_dim), generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
                for n in (nq, nk, nk)
            )
            sample = _check_rows(nq, spec.check_rows).to(device)
            ref = reference.reference_attention(q[:1], k[:1], v[:1], spec.causal, rows=sample)
            same_precision = reference.naive_attention_rows(q[:1], k[:1], v[:1], sample, spec.causal)
        except Exception as exc:  # inputs or the reference itself do not fit: every impl gets the status
            status, message = harness.classify(exc)
            for impl in spec.impls:
                rows.append(_row(base, impl, status, f"inputs/reference: {message}"))
                progress.step(f"{impl} {shape_text}", status)
            harness.release_memory()
            continue

        for impl in spec.impls:
            row = _measure(spec, impl, q, k, v, sample, ref, same_precision, dtype, base, timed, device)
            rows.append(row)
            extra = f" {row['tflops']:.1f} TFLOP/s" if row["status"] == "ok" and timed else ""
            progress.step(f"{impl} {shape_text}", row["status"] + extra + _short(row["message"]))
        del q, k, v, ref, same_precision
        harness.release_memory()
    return rows


def _short(message: str) -> str:
    return f" ({message[:120]})" if message else ""


def _row(base: dict, impl: str, status: str, message: str, **metrics) -> dict:
    row = {**base, "impl": impl, "status": status, "message": message, "timestamp": now_utc()}
    for key in ("ms_median", "ms_p20", "ms_p80", "tflops", "peak_mem_mib", "max_abs_err", "rms_err", "ref_err",
                "err_bound", "sm_clock_mhz", "mem_clock_mhz", "temp_c", "power_w"):  # fmt: skip
        row[key] = metrics.get(key, math.nan)
    row["kernel_config"] = metrics.get("kernel_config", "")
    return row


def _measure(spec, impl, q, k, v, sample, ref, same_precision, dtype, base, timed, device) -> dict:
    fn = implementation(impl)
    causal = spec.causal
    metrics: dict = {}
    try:
        out = fn(q, k, v, causal)  # first call: compiles and autotunes outside any timed region
        metrics["kernel_config"] = _kernel_config(impl)
        got = out[:1].index_select(2, sample)
        del out
        check = tolerance.check(f"{impl} output", got, ref, same_precision, dtype)
        metrics.update(max_abs_err=check.max_abs, rms_err=check.rms, ref_err=check.ref_err, err_bound=check.bound)
        if not check.ok:
            return _row(base, impl, "mismatch", check.describe(), **metrics)
        if not timed:
            return _row(base, impl, "ok", "", **metrics)
        metrics["peak_mem_mib"] = harness.peak_extra_memory_mib(lambda: fn(q, k, v, causal))
        with harness.Telemetry() as tel:
            timing = harness.time_gpu(lambda: fn(q, k, v, causal), spec.warmup_ms, spec.rep_ms)
        metrics.update(tel.summary())
        flops = attention_flops(base["batch"], base["heads"], base["seqlen_q"], base["seqlen_k"], spec.head_dim, causal)
        metrics.update(
            ms_median=timing.ms_median,
            ms_p20=timing.ms_p20,
            ms_p80=timing.ms_p80,
            tflops=tflops(flops, timing.ms_median),
        )
        return _row(base, impl, "ok", "", **metrics)
    except Exception as exc:
        status, message = harness.classify(exc)
        harness.release_memory()
        return _row(base, impl, status, message, **metrics)
