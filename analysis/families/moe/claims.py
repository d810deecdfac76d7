"""Evaluators of the claims about MoE layers, from the MoE rows of the operator table (``ops.csv``)."""

from __future__ import annotations

from analysis.audit import Claim, Context, Evaluators, Untestable, Verdict, evidence
from analysis.audit.verdicts import side_by_side
from analysis.core.summaries import span
from analysis.families._shared.operator_claims import OPS, measured_ops
from analysis.families.moe.plan import STAGES
from analysis.families.moe.tables import moe_stage_split

EVALUATORS = Evaluators()


FAR = 3.0  # "far slower" judged as at least this many times slower


@EVALUATORS("moe_dense_inside")
def moe_dense_inside(claim: Claim, ctx: Context) -> list[Verdict]:
    def one(gpu):
        sel = ctx.table(OPS).select(gpu, experiment="moe", impl="ours-moe", stage=list(STAGES))
        split = moe_stage_split(sel.rows)
        if split.empty:
            raise Untestable("no MoE point with all four stages of our layer timed")
        share = split["movement_share"]
        verdict = "holds" if (share > 0.5).all() else "partly" if (share > 0.5).any() else "fails"
        where = "; ".join(
            f"{r.model} T={int(r.tokens)} {r.routing}: {100 * r.movement_share:.0f}%" for r in split.itertuples()
        )
        return Verdict(
            verdict,
            f"routing + dispatch + combine {span(100 * share, '.0f', '%')} of the layer's time",
            "our layer's stages timed one by one (the experts' work is the two grouped GEMMs, dense products on "
            f"contiguous per-expert rows); 'dominated' judged as more than half: {where}",
            sel.evidence,
            gpu=gpu,
            unit="% of time",
        )

    return measured_ops(ctx, one, "the MoE experiment")


@EVALUATORS("moe_grouped")
def moe_grouped(claim: Claim, ctx: Context) -> list[Verdict]:
    def one(gpu):
        sel = ctx.table(OPS).select(
            gpu, experiment="moe", op="moe-layer", stage="total", impl=["gather-moe", "ours-moe", "loop-moe"]
        )
        ok = sel.rows
        keys = ["model", "dtype", "routing", "tokens"]
        pair = side_by_side(ok, keys, "gather-moe", "ours-moe")
        gathers = ctx.table(OPS).select(gpu, finished=False, experiment="moe", impl="gather-moe")
        refused = gathers.rows[gathers.rows["status"] != "ok"]
        if pair.empty:
            raise Untestable(
                f"per-token gathering and our grouped layer finished at no common point ({len(refused)} gather "
                "points did not run: over the memory cap or out of memory)"
            )
        speed = pair["ms_median_a"] / pair["ms_median_b"]
        verdict = "holds" if (speed >= FAR).all() else "partly" if (speed > 1).any() else "fails"
        extra = []
        loop = side_by_side(ok, keys, "loop-moe", "ours-moe")
        if not loop.empty:
            extra.append(f"vs the per-expert loop {span(loop['ms_median_a'] / loop['ms_median_b'], '.2f')}")
        if len(refused):
            why = {"unsupported": "over the gathering cap", "oom": "out of memory"}
            counts = "; ".join(
                f"{n} {s}" + (f" ({why[s]})" if s in why else "") for s, n in refused["status"].value_counts().items()
            )
            extra.append(f"{len(refused)} larger gather points not run: {counts}")
        return Verdict(
            verdict,
            f"per-token gathering {span(speed, '.1f')} slower than sorted dispatch + grouped GEMM",
            f"whole SwiGLU layer, {len(pair)} points; 'far slower' judged as ≥ {FAR:g}× at every point; "
            + "; ".join(extra),
            evidence(sel, gathers),
            gpu=gpu,
            unit="×",
        )

    return measured_ops(ctx, one, "the MoE experiment")
