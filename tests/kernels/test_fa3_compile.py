"""The FA-3 kernel compiled for sm_90 without a GPU, every head dim × schedule × mask, and its SASS read.

Gluon kernels do not run in Triton's interpreter, but ``triton.compile`` builds them for a ``GPUTarget`` on
any machine (``analysis.families.compiled.run.fa3_kernel``). One subprocess (Triton must not be in interpreter
mode) compiles every variant and prints ``sass.summary`` of each; the tests check that the machine
code holds what the design says: warpgroup MMAs (no per-warp MMA) left asynchronous by ptxas (at most two
waits a tile), TMA loads exactly where the schedule uses
TMA and per-thread asynchronous copies where it does not, ``setmaxnreg`` register moves with warp
specialisation, the turn-passing barriers of ping-pong, the wait for all but one wgmma group of the intra-
warpgroup overlap, no spills with TMA, and shared memory within Hopper's 227 KiB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import triton

ROOT = Path(__file__).resolve().parents[2]
HEAD_DIMS = (64, 128, 256)
SCHEDULES = ("fa3", "no-warp-specialize", "no-pingpong", "no-overlap", "no-tma")
HOPPER_SHARED = 227 * 1024

_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from concurrent.futures import ProcessPoolExecutor
    from analysis.families.compiled import sass
    from analysis.families.compiled import run as compiled

    def one(job):
        d, schedule, causal, fp8 = job
        kernel, _ = compiled.fa3_kernel(d, "bfloat16", causal, schedule, fp8=fp8)
        ptx = kernel.asm["ptx"]
        code = sass.read(kernel.asm["cubin"])
        row = sass.summary(code, kernel.metadata.shared)
        loop = code.hot_loop()
        ops = code.opcodes(*loop) if loop else {}
        row.update(head_dim=d, schedule=schedule, causal=causal, fp8=fp8, loop_qgmma=ops.get("QGMMA", 0),
                   loop_hgmma=ops.get("HGMMA", 0), loop_shfl=ops.get("SHFL", 0), loop_prmt=ops.get("PRMT", 0),
                   loop_f2fp=ops.get("F2FP", 0), loop_fadd=ops.get("FADD", 0),
                   loop_wgmma_waits=sum("WARPGROUP.DEPBAR" in op for _, op in code.instructions[slice(*loop)])
                   if loop else 0,
                   ptx_mbarrier_waits=ptx.count("mbarrier.try_wait"),
                   ptx_wait_one=ptx.count("wgmma.wait_group.sync.aligned 1;"))
        return row

    jobs = [(d, s, c, False) for d in (64, 128, 256) for s in sys.argv[1].split(",") for c in (False, True)]
    jobs += [(d, s, c, True) for d, s, c in json.loads(sys.argv[2])]
    with ProcessPoolExecutor(2) as pool:
        for row in pool.map(one, jobs):
            print(json.dumps(row), flush=True)
    """
)

# the FP8 variants compiled: every head dim with TMA and without, the causal mask at d=128
FP8_VARIANTS = [(d, s, False) for d in HEAD_DIMS for s in ("fa3", "no-tma")] + [(128, "fa3", True)]


@pytest.fixture(scope="module")
def compiled_rows() -> list[dict]:
    if "nvidia" not in triton.backends.backends:
        pytest.skip("this Triton has no NVIDIA backend to compile with")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, "-c", _SCRIPT, ",".join(SCHEDULES), json.dumps(FP8_VARIANTS)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def variants(compiled_rows) -> dict[tuple, dict]:
    """The 16-bit variants by (head_dim, schedule, causal)."""
    return {(r["head_dim"], r["schedule"], r["causal"]): r for r in compiled_rows if not r["fp8"]}


@pytest.fixture(scope="module")
def fp8_variants(compiled_rows) -> dict[tuple, dict]:
    return {(r["head_dim"], r["schedule"], r["causal"]): r for r in compiled_rows if r["fp8"]}


CASES = [
    pytest.param(d, s, c, id=f"d{d}-{s}-{'causal' if c else 'full'}")
    for d in HEAD_DIMS
    for s in SCHEDULES
    for c in (False, True)
]


@pytest.mark.parametrize("head_dim, schedule, causal", CASES)
def test_machine_code_follows_the_schedule(variants, head_dim, schedule, causal):
    r = variants[(head_dim, schedule, causal)]
    ws, tma = schedule != "no-warp-specialize", schedule != "no-tma"
    # every product on the tensor cores' warpgroup path, in the hot loop S and P V of one tile
    assert r["loop_mma"] > 0, r
    assert r["shared_bytes"] <= HOPPER_SHARED, r
    if tma:
        assert r["kernel_thread_loads"] == 0 and r["load_loop_tma"] == 2, r  # K and V, one copy each
        assert r["kernel_spills"] == 0 and r["stack_bytes"] == 0, r
    else:
        assert r["load_loop_tma"] == 0 and r["load_loop_thread_loads"] > 0, r
    if ws:
        limits = [int(x) for x in r["setmaxnreg"].split("/")]
        assert min(limits) <= 56 and max(limits) >= 224, r  # the producer gives its registers to the consumers
        assert r["loop_tma"] == 0 and r["loop_thread_loads"] == 0, r  # the consumers issue no loads
    else:
        assert r["setmaxnreg"] == "" and r["loop_tma"] == 2, r  # one partition issues its own loads
    assert (r["ptx_wait_one"] > 0) == (schedule != "no-overlap"), r


def test_warpgroup_mmas_stay_asynchronous(compiled_rows):
    """ptxas serialises the warpgroup MMAs it cannot prove safe (a register they read or write touched while
    they may run) by waiting for each one as soon as it is issued, and says nothing at run time: the overlap
    of the softmax with the tensor cores is gone (seen compiling a variant of the FP8 loop that carried P in
    registers the next tile overwrote: a wait after each of its 12 MMAs). Every variant's hot loop waits at
    most twice a tile: for S, then for P V."""
    for r in compiled_rows:
        assert 1 <= r["loop_wgmma_waits"] <= 2, {
            k: r[k] for k in ("head_dim", "schedule", "causal", "fp8", "loop_wgmma_waits")
        }


def test_pingpong_passes_turns(variants):
    """Ping-pong adds a turn wait per GEMM issue to each consumer: more mbarrier waits than without."""
    for d in HEAD_DIMS:
        for causal in (False, True):
            on, off = variants[(d, "fa3", causal)], variants[(d, "no-pingpong", causal)]
            assert on["ptx_mbarrier_waits"] > off["ptx_mbarrier_waits"], (on, off)


def test_warpgroup_mma_issues_a_tile_in_few_instructions(variants):
    """One K/V tile of a consumer (64 query rows): S = Q Kᵀ in head_dim / 16 warpgroup MMAs and P V in
    BLOCK_N / 16 (each a 64×N×16 instruction), nothing per-warp."""
    from kernels.attention import fa3

    for d in HEAD_DIMS:
        block_n = fa3.default_config(d).block_n
        assert variants[(d, "fa3", False)]["loop_mma"] == d // 16 + block_n // 16


def _sums_on_mma(head_dim: int, schedule: str) -> bool:
    """Whether the FP8 kernel of ``schedule`` takes the row sums on the tensor cores at ``head_dim``."""
    from kernels.attention import fa3

    return fa3.fp8_row_sums(head_dim, schedule) == "p8"


@pytest.mark.parametrize(
    "head_dim, schedule, causal",
    FP8_VARIANTS,
    ids=[f"d{d}-{s}-{'causal' if c else 'full'}" for d, s, c in FP8_VARIANTS],
)
def test_fp8_runs_on_the_fp8_tensor_cores(fp8_variants, head_dim, schedule, causal):
    """e4m3 inputs: every product of the hot loop a QGMMA (k = 32 per instruction, half the 16-bit count:
    S, P V and the row sums P · 1), none in 16 bits; TMA where the schedule uses it (Q, K and the transposed
    V), the register split of warp specialisation, no spills at all, within shared memory."""
    from kernels.attention import fa3

    r = fp8_variants[(head_dim, schedule, causal)]
    block_n = fa3.default_config(head_dim, fp8=True).block_n
    sums = block_n // 32 if _sums_on_mma(head_dim, schedule) else 0
    assert r["loop_hgmma"] == 0 and r["loop_qgmma"] == head_dim // 32 + block_n // 32 + sums, r
    assert r["shared_bytes"] <= HOPPER_SHARED, r
    limits = [int(x) for x in r["setmaxnreg"].split("/")]
    assert min(limits) <= 56 and max(limits) >= 224, r
    assert r["loop_thread_loads"] <= 2, r  # a consumer loads only the K and V tiles' scales itself
    assert r["kernel_spills"] == 0 and r["stack_bytes"] == 0, r
    if schedule == "fa3":
        assert r["load_loop_tma"] == 2, r
    else:  # V transposed copied 16 keys (bytes) per copy
        assert r["load_loop_tma"] == 0 and r["load_loop_thread_loads"] > 0, r


@pytest.mark.parametrize(
    "head_dim, schedule, causal",
    FP8_VARIANTS,
    ids=[f"d{d}-{s}-{'causal' if c else 'full'}" for d, s, c in FP8_VARIANTS],
)
def test_fp8_p_reaches_its_product_without_moving(fp8_variants, head_dim, schedule, causal):
    """P from the S accumulator to the A operand of P V (V in ``fa3.FP8Values``' key order): no value
    crosses threads (the only shuffles in the loop are over a row's 4 threads: the row max's, 2 rows × 2
    steps, and the row sum's where the loop takes it), each pair of P converted by one F2FP and each operand
    register assembled by at most one PRMT (P is BLOCK_N / 2 values a thread, in BLOCK_N / 8 registers of four
    e4m3). Where ``fa3.fp8_row_sums`` says, the tensor cores take the row sums (P · 1): the loop adds
    almost nothing itself (not BLOCK_N / 2 values a thread) and shuffles for the row max only."""
    from kernels.attention import fa3

    r = fp8_variants[(head_dim, schedule, causal)]
    block_n = fa3.default_config(head_dim, fp8=True).block_n
    if _sums_on_mma(head_dim, schedule):
        assert r["loop_shfl"] <= 4 and r["loop_fadd"] <= 8, r
    else:
        assert r["loop_shfl"] <= 8, r
    assert r["loop_f2fp"] == block_n // 4, r
    assert r["loop_prmt"] <= block_n // 8, r
