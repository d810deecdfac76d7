"""Evaluators of the claims about weight-only quantisation (W4A16) and MoE layers, from the ops tables.

Registered into ``analysis.audit.EVALUATORS`` on import (``analysis.audit`` imports this module at its end).
Each reads ``Context.ops`` (one ``ops.csv`` per GPU type, ``analysis.ops_tables``); with no ops table on any
GPU the claim is ``untestable`` and says why. Every observed number is computed here from those rows.
"""

from __future__ import annotations

from collections.abc import Callable

from analysis.audit import Claim, Context, Untestable, Verdict, _pair, _per_gpu, _span, evaluator, within
from analysis.ops_tables import moe_stage_split, with_copy_gbps

FAR = 3.0  # "far slower" judged as at least this many times slower
SMALL_M = 16  # decoding row counts, where a layer is bound by reading its weights


def _measured_ops(ctx: Context, fn: Callable[[str], Verdict], needs: str) -> list[Verdict]:
    """One verdict per GPU with an ops table; untestable (with the reason) when there is none."""
    if not ctx.ops:
        raise Untestable(
            f"no W4A16/MoE results on any GPU ({needs}): the ops experiments run on a GPU node "
            "(workflow/rules/ops.smk) or come with shipped reference results (reports/reference/<gpu>/ops.csv)"
        )
    return _per_gpu(ctx.ops, ctx.ops_paths, fn)


@evaluator("w4_bandwidth")
def w4_bandwidth(claim: Claim, ctx: Context) -> list[Verdict]:
    target, tol = claim.asserted["approx"], claim.tolerance

    def one(gpu):
        rows = ctx.ops_ok(gpu, experiment="w4a16", op="linear")
        pair = _pair(
            rows[rows["m"] == 1],
            ["model", "dtype", "group_size"],
            "torch-linear",
            "ours-w4a16",
            ["ms_median", "model_bytes", "gbps"],
        )
        if pair.empty:
            raise Untestable("bf16 F.linear and our W4A16 kernel finished at no common M=1 point")
        ratio = pair["model_bytes_a"] / pair["model_bytes_b"]  # 16-bit weight bytes over int4 bytes + scales
        speed = pair["ms_median_a"] / pair["ms_median_b"]
        bytes_ok = bool(within(float(ratio.median()), target, tol))
        fast = speed >= (1 - tol) * target
        verdict = "holds" if bytes_ok and fast.all() else "partly" if bytes_ok and (speed > 1).any() else "fails"
        share = (pair["gbps_b"] / with_copy_gbps(pair, rows)).dropna()
        extra = f"; {100 * share.min():.0f}–{100 * share.max():.0f}% of the copy bandwidth" if len(share) else ""
        return Verdict(
            verdict,
            f"{_span(ratio, '.2f')} fewer weight bytes; M=1 {_span(speed, '.2f')} faster than bf16 F.linear",
            f"int4 codes plus group scales and zero points against the 16-bit weight ({len(pair)} layer shapes, "
            f"group size {', '.join(map(str, sorted(pair['group_size'].astype(int).unique())))}); the bandwidth "
            f"saving judged as the decode (M=1) latency ratio, holds when ≥ {(1 - tol) * target:g}×{extra}",
            f"{ctx.ops_paths[gpu]}: experiment=w4a16, m=1, impl=torch-linear,ours-w4a16,copy-weight",
            gpu=gpu,
            unit="×",
        )

    return _measured_ops(ctx, one, "the W4A16 experiment")


@evaluator("w4_fusion")
def w4_fusion(claim: Claim, ctx: Context) -> list[Verdict]:
    def one(gpu):
        rows = ctx.ops_ok(gpu, experiment="w4a16", op="linear")
        rows = rows[rows["m"] <= SMALL_M]
        keys = ["model", "dtype", "group_size", "m"]
        unfused = _pair(rows, keys, "torch-linear", "dequant-linear")
        fused = _pair(rows, keys, "torch-linear", "ours-w4a16")
        if unfused.empty or fused.empty:
            raise Untestable(f"F.linear, dequantise-then-F.linear and the fused kernel finished at no M ≤ {SMALL_M}")
        lost = unfused["ms_median_b"] / unfused["ms_median_a"]  # ≥ 1: the unfused path is no faster than bf16
        kept = fused["ms_median_a"] / fused["ms_median_b"]  # > 1: the fused kernel keeps the saving
        verdict = "holds" if (lost >= 1).all() and (kept > 1).all() else "fails" if not (lost >= 1).any() else "partly"
        return Verdict(
            verdict,
            f"unfused {_span(lost, '.2f')} the time of bf16 F.linear; fused {_span(kept, '.2f')} faster than it",
            f"decode-size M ≤ {SMALL_M} ({len(unfused)} points): dequantising to a 16-bit weight in memory and "
            "reading it back costs at least the bf16 layer's time (the saving lost) at "
            f"{int((lost >= 1).sum())}/{len(lost)} points; the fused kernel is faster than bf16 at "
            f"{int((kept > 1).sum())}/{len(kept)}",
            f"{ctx.ops_paths[gpu]}: experiment=w4a16, m≤{SMALL_M}, impl=torch-linear,dequant-linear,ours-w4a16",
            gpu=gpu,
            unit="×",
        )

    return _measured_ops(ctx, one, "the W4A16 experiment")


@evaluator("moe_dense_inside")
def moe_dense_inside(claim: Claim, ctx: Context) -> list[Verdict]:
    def one(gpu):
        split = moe_stage_split(ctx.ops_ok(gpu, experiment="moe"))
        if split.empty:
            raise Untestable("no MoE point with all four stages of our layer timed")
        share = split["movement_share"]
        verdict = "holds" if (share > 0.5).all() else "partly" if (share > 0.5).any() else "fails"
        where = "; ".join(f"{r.model} T={int(r.tokens)} {r.routing}: {100 * r.movement_share:.0f}%"
                          for r in split.itertuples())  # fmt: skip
        return Verdict(
            verdict,
            f"routing + dispatch + combine {_span(100 * share, '.0f', '%')} of the layer's time",
            "our layer's stages timed one by one (the experts' work is the two grouped GEMMs, dense products on "
            f"contiguous per-expert rows); 'dominated' judged as more than half: {where}",
            f"{ctx.ops_paths[gpu]}: experiment=moe, impl=ours-moe, stage=routing,dispatch,gemm,combine",
            gpu=gpu,
            unit="% of time",
        )

    return _measured_ops(ctx, one, "the MoE experiment")


@evaluator("moe_grouped")
def moe_grouped(claim: Claim, ctx: Context) -> list[Verdict]:
    def one(gpu):
        ok = ctx.ops_ok(gpu, experiment="moe", op="moe-layer", stage="total")
        keys = ["model", "dtype", "routing", "tokens"]
        pair = _pair(ok, keys, "gather-moe", "ours-moe")
        df = ctx.ops[gpu]
        refused = df[(df["impl"] == "gather-moe") & (df["experiment"] == "moe") & (df["status"] != "ok")]
        if pair.empty:
            raise Untestable(
                f"per-token gathering and our grouped layer finished at no common point ({len(refused)} gather "
                "points did not run: over the memory cap or out of memory)"
            )
        speed = pair["ms_median_a"] / pair["ms_median_b"]
        verdict = "holds" if (speed >= FAR).all() else "partly" if (speed > 1).any() else "fails"
        extra = []
        loop = _pair(ok, keys, "loop-moe", "ours-moe")
        if not loop.empty:
            extra.append(f"vs the per-expert loop {_span(loop['ms_median_a'] / loop['ms_median_b'], '.2f')}")
        if len(refused):
            why = {"unsupported": "over the gathering cap", "oom": "out of memory"}
            counts = "; ".join(f"{n} {s}" + (f" ({why[s]})" if s in why else "")
                               for s, n in refused["status"].value_counts().items())  # fmt: skip
            extra.append(f"{len(refused)} larger gather points not run: {counts}")
        return Verdict(
            verdict,
            f"per-token gathering {_span(speed)} slower than sorted dispatch + grouped GEMM",
            f"whole SwiGLU layer, {len(pair)} points; 'far slower' judged as ≥ {FAR:g}× at every point; "
            + "; ".join(extra),
            f"{ctx.ops_paths[gpu]}: experiment=moe, op=moe-layer, impl=gather-moe,ours-moe,loop-moe",
            gpu=gpu,
            unit="×",
        )

    return _measured_ops(ctx, one, "the MoE experiment")
