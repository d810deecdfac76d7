"""The instruction mix of a hot loop by pipe, and its floating-point work on the tensor pipe and off it
(``analysis.families.compiled.sass``): by hand on a few SASS lines, then on our FA-2 kernel compiled for sm_90
and sm_80 on this machine's CPU (the rows the claim tc-95-inner is judged from)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.families.compiled import sass

ROOT = Path(__file__).resolve().parents[3]

LOOP = [
    "HGMMA.64x128x16.F32 R24, gdesc[UR4], R24, gsb0",
    "HMMA.16816.F32 R4, R8, R12, R4",
    "@P0 FFMA R1, R2, R3, R1",
    "FMUL R5, R5, R6",
    "FMNMX R7, R7, R8, !PT",
    "MUFU.EX2 R9, R9",
    "HFMA2 R10, R10, R11, R12",
    "LDGSTS.E.BYPASS.128 [R13], desc[UR6][R14.64]",
    "IADD3 R1, R1, 0x40, RZ",
    "UIADD3 UR4, UR4, 0x1, URZ",
    "BAR.SYNC.DEFER_BLOCKING 0x0",
    "S2R R0, SR_TID.X",
]


def test_mix_puts_every_instruction_under_one_pipe():
    mix = sass.mix(LOOP)
    assert list(mix) == list(sass.PIPE_ORDER) and sum(mix.values()) == len(LOOP)
    assert mix == dict(tensor=2, fma=2, fp16=1, alu=2, xu=1, memory=1, control=1, uniform=1, other=1)


def test_flops_weigh_each_instruction_by_its_work():
    tensor, other = sass.flops(LOOP)
    assert tensor == 2 * 64 * 128 * 16 / 4 + 2 * 16 * 8 * 16  # a warp's share of a wgmma, one mma.sync
    assert other == 32 * (2 + 1 + 1 + 1 + 4)  # FFMA, FMUL, FMNMX, MUFU, HFMA2 on 32 lanes
    with pytest.raises(ValueError, match="unknown mma.sync shape"):
        sass.flops(["HMMA.999.F32 R4, R8, R12, R4"])


@pytest.mark.parametrize("target", ["sm_90", "sm_80"])
def test_fa2_hot_loop_mix_of_the_compiled_kernel(target):
    """The mma-issue build: the pipes add up to the loop, the tensor pipe is its MMAs, and their work is one
    K/V tile's two products split over the 8 warps (128×128 tile, d = 128): the same on both targets."""
    job = json.dumps(["mma-issue", 128, "bfloat16", False, target, None])
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "analysis.families.compiled.run", job], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["status"] == "ok", row["message"]
    assert sum(row[f"loop_pipe_{p}"] for p in sass.PIPE_ORDER) == row["loop_instructions"]
    assert row["loop_pipe_tensor"] == row["loop_mma"] > 0
    assert row["loop_tensor_flops"] == 2 * (2 * 128 * 128 * 128) / 8
    assert 0 < row["loop_other_flops"] < 0.05 * row["loop_tensor_flops"]
    assert row["loop_mma"] / row["loop_instructions"] < 0.95  # what the claim is judged on
