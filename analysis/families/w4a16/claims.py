"""Evaluators of the claims about weight-only quantisation (W4A16), from the W4A16 rows of the operator table
(``ops.csv``). With no operator table on any GPU a claim is ``untestable`` and says why."""

from __future__ import annotations

from analysis.audit import Claim, Context, Evaluators, Untestable, Verdict, evidence
from analysis.audit.verdicts import side_by_side, within
from analysis.core.summaries import span
from analysis.core.tables import at_most
from analysis.families._shared.operator_claims import OPS, measured_ops
from analysis.families.w4a16 import targets
from analysis.families.w4a16.tables import with_copy_gbps

EVALUATORS = Evaluators()


SMALL_M = 16  # decoding row counts, where a layer is bound by reading its weights


@EVALUATORS("w4_bandwidth")
def w4_bandwidth(claim: Claim, ctx: Context) -> list[Verdict]:
    target, tol = claim.asserted["approx"], claim.tolerance

    def one(gpu):
        sel = ctx.table(OPS).select(gpu, experiment="w4a16", op="linear", m=1, impl=["torch-linear", "ours-w4a16"])
        copies = ctx.table(OPS).select(gpu, experiment="w4a16", op="linear", impl="copy-weight")
        pair = side_by_side(
            sel.rows,
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
        share = (pair["gbps_b"] / with_copy_gbps(pair, copies.rows)).dropna()
        extra = f"; {100 * share.min():.0f}–{100 * share.max():.0f}% of the copy bandwidth" if len(share) else ""
        return Verdict(
            verdict,
            f"{span(ratio, '.2f')} fewer weight bytes; M=1 {span(speed, '.2f')} faster than bf16 F.linear",
            f"int4 codes plus group scales and zero points against the 16-bit weight ({len(pair)} layer shapes, "
            f"group size {', '.join(map(str, sorted(pair['group_size'].astype(int).unique())))}); the bandwidth "
            f"saving judged as the decode (M=1) latency ratio, holds when ≥ {(1 - tol) * target:g}×{extra}",
            evidence(sel, copies),
            gpu=gpu,
            unit="×",
        )

    return measured_ops(ctx, one, "the W4A16 experiment")


@EVALUATORS("w4_fusion")
def w4_fusion(claim: Claim, ctx: Context) -> list[Verdict]:
    def one(gpu):
        sel = ctx.table(OPS).select(
            gpu,
            experiment="w4a16",
            op="linear",
            m=at_most(SMALL_M),
            impl=["torch-linear", "dequant-linear", "ours-w4a16"],
        )
        rows = sel.rows
        keys = ["model", "dtype", "group_size", "m"]
        unfused = side_by_side(rows, keys, "torch-linear", "dequant-linear")
        fused = side_by_side(rows, keys, "torch-linear", "ours-w4a16")
        if unfused.empty or fused.empty:
            raise Untestable(f"F.linear, dequantise-then-F.linear and the fused kernel finished at no M ≤ {SMALL_M}")
        lost = unfused["ms_median_b"] / unfused["ms_median_a"]  # ≥ 1: the unfused path is no faster than bf16
        kept = fused["ms_median_a"] / fused["ms_median_b"]  # > 1: the fused kernel keeps the saving
        verdict = "holds" if (lost >= 1).all() and (kept > 1).all() else "fails" if not (lost >= 1).any() else "partly"
        return Verdict(
            verdict,
            f"unfused {span(lost, '.2f')} the time of bf16 F.linear; fused {span(kept, '.2f')} faster than it",
            f"decode-size M ≤ {SMALL_M} ({len(unfused)} points): dequantising to a 16-bit weight in memory and "
            "reading it back costs at least the bf16 layer's time (the saving lost) at "
            f"{int((lost >= 1).sum())}/{len(lost)} points; the fused kernel is faster than bf16 at "
            f"{int((kept > 1).sum())}/{len(kept)}",
            sel.evidence,
            gpu=gpu,
            unit="×",
        )

    return measured_ops(ctx, one, "the W4A16 experiment")


EVALUATORS.update(targets.EVALUATORS)  # the family's performance targets (claims.yaml)
