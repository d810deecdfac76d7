"""Evaluators of the claims the attention experiments measure: the articles' own experiments, FA-1's Figure 3,
the gain surface, the backward pass, FA-1 against FA-2, lazy rescaling, decoding, variable-length batches
and block sizes, each judged per GPU from the attention table's rows (``ctx.table("attention")``). A claim
about a named kernel's speed says which kernel it is judged on (its subject, ``analysis.audit.subject``: here
always our replication, as no official build of FA-1, of FlashDecoding or of a teaching Triton kernel runs
here) and shows the official one beside it where it ran."""

from __future__ import annotations

import math

from analysis.audit import Evaluators, Untestable, Verdict, combine
from analysis.audit.subject import judged
from analysis.audit.verdicts import (
    judge_approx,
    judge_at_most,
    judge_range,
    loglog_slope,
    on_each_gpu,
    side_by_side,
    three_digits,
)
from analysis.core.summaries import span

ATTENTION = "attention"  # the table these claims read
UPSTREAM = "upstream-fa"  # FlashAttention's own kernels (analysis.families._shared.peers)
MIB = 2**20
EVALUATORS = Evaluators()


@EVALUATORS("exp1_oom_16k")
def exp1_oom_16k(claim, ctx):
    card = claim.conditions["card_gb"] * 1e9 / MIB  # MiB

    def one(gpu):
        sel = ctx.table(ATTENTION).select(
            gpu, finished=False, experiment="memory", mode="fwd", impl=["naive", "ours-fa2"]
        )
        rows = sel.rows
        naive = rows[rows["impl"] == "naive"].sort_values("seqlen_q")
        ours = rows[(rows["impl"] == "ours-fa2") & (rows["status"] == "ok")].sort_values("seqlen_q")
        naive_ok = naive[naive["status"] == "ok"]
        if len(naive_ok) < 2 or len(ours) < 2:
            raise Untestable("too few finished points in the memory experiment")
        slope_naive = loglog_slope(naive_ok["seqlen_q"], naive_ok["peak_mem_mib"])
        slope_ours = loglog_slope(ours["seqlen_q"], ours["peak_mem_mib"])
        at16 = naive_ok[naive_ok["seqlen_q"] == 16384]
        need16 = float(at16["peak_mem_mib"].iloc[0]) if not at16.empty else float("nan")
        fits_on_card = naive_ok[naive_ok["peak_mem_mib"] < card]["seqlen_q"].max()
        oom_here = naive[naive["status"] == "oom"]["seqlen_q"].min()
        faster = naive_ok.merge(ours, on="seqlen_q", suffixes=("_n", "_o"))
        if faster.empty:
            raise Untestable("naive and ours finished at no common sequence length")
        speed = (faster["ms_median_n"] / faster["ms_median_o"]).iloc[-1]
        scaling_ok = abs(slope_naive - 2) < 0.25 and abs(slope_ours - 1) < 0.25
        oom_ok = need16 == need16 and need16 > card
        verdict = "holds" if scaling_ok and oom_ok else "partly" if scaling_ok else "fails"
        note = (
            f"naive needs {need16 / 1024:.0f} GiB extra at N=16384, which fits in {card / 1024:.0f} GiB; on an 80 GB "
            f"card it fits up to N={fits_on_card} and runs out beyond; here it ran out at N={oom_here}. Memory grows "
            f"as N^{slope_naive:.2f} (naive) vs N^{slope_ours:.2f} (ours); ours is {speed:.1f}× faster at the "
            "largest N both finished"
        )
        return Verdict(
            verdict,
            f"fits 80 GB up to N={fits_on_card}; N^{slope_naive:.2f} vs N^{slope_ours:.2f}",
            note,
            sel.evidence,
            gpu=gpu,
            unit="N",
            parts={
                "oom": (
                    "holds" if oom_ok else "fails",
                    f"naive needs {need16 / 1024:.0f} GiB extra at N=16384; fits 80 GB up to N={fits_on_card}",
                ),
                "scaling": (
                    "holds" if scaling_ok else "fails",
                    f"memory grows as N^{slope_naive:.2f} (naive), N^{slope_ours:.2f} (ours)",
                ),
                "faster": ([speed], f"{speed:.1f}× faster at the largest N both finished"),
            },
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "the memory experiment")


@EVALUATORS("exp3_maxdiff")
def exp3_maxdiff(claim, ctx):
    c = claim.conditions

    def one(gpu):
        sel = ctx.table(ATTENTION).select(
            gpu,
            experiment="fa2-setting",
            mode="fwd",
            dtype=c["dtype"],
            head_dim=c["d"],
            seqlen_q=c["N"],
            causal=c["causal"],
            impl=["ours-fa2", "sdpa-flash"],
        )
        rows = sel.rows
        ours, flash = rows[rows["impl"] == "ours-fa2"], rows[rows["impl"] == "sdpa-flash"]
        if ours.empty or flash.empty:
            raise Untestable("no finished ours and sdpa-flash rows in that setting")
        bound = float(ours["max_abs_err"].iloc[0] + flash["max_abs_err"].iloc[0])
        r = ours.iloc[0]
        return Verdict(
            judge_at_most(bound, claim.asserted["at_most"]),
            f"≤ {three_digits(bound)}",
            f"|ours − SDPA| bounded by the sum of both errors against float64, at B={r['batch']}, H={r['heads']} "
            "(the article's B=2, H=8 has the same per-element arithmetic)",
            sel.evidence,
            gpu=gpu,
            unit="max abs difference",
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "FA-2 setting rows")


@EVALUATORS("exp4_close")
def exp4_close(claim, ctx):
    lo, hi = claim.asserted["range"]

    def one(gpu):
        need = ["naive", "ours-fa2", "sdpa-flash"]
        sel = ctx.table(ATTENTION).select(
            gpu, experiment="fa2-setting", mode="fwd", head_dim=128, causal=True, impl=need
        )
        piv = sel.rows.pivot_table(index=["dtype", "seqlen_q"], columns="impl", values="ms_median")
        if not set(need) <= set(piv.columns):
            raise Untestable("ours, naive or sdpa-flash missing")
        speed = piv["naive"] / piv["ours-fa2"]
        vs_flash = piv["sdpa-flash"] / piv["ours-fa2"]
        return Verdict(
            judge_range(speed, lo, hi),
            f"{speed.min():.1f}–{speed.max():.1f}× over naive; {vs_flash.min():.2f}–{vs_flash.max():.2f}× SDPA flash",
            f"{judged(claim, ctx.table(ATTENTION), gpu).text}. "
            "Our Triton FA-2 vs three-step PyTorch, d=128, causal, N = 512…16K in the FA-2 setting (batch × N = "
            "16384 rather than B=2); 'close to the official kernel' holds: ours is at or above SDPA's FA-2 backend",
            sel.evidence,
            gpu=gpu,
            unit="×",
            parts={
                "vs-naive": (speed, f"{speed.min():.1f}–{speed.max():.1f}× over naive"),
                "vs-official": (vs_flash, f"{vs_flash.min():.2f}–{vs_flash.max():.2f}× SDPA flash's speed"),
            },
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "FA-2 setting rows")


@EVALUATORS("exp_s0_slower")
def exp_s0_slower(claim, ctx):
    def one(gpu):
        sel = ctx.table(ATTENTION).select(gpu, experiment="fa2-setting", mode="fwd")
        piv = sel.rows.pivot_table(
            index=["dtype", "head_dim", "causal", "seqlen_q"], columns="impl", values="ms_median"
        )
        sdpa = [c for c in piv.columns if c.startswith("sdpa-") and c != "sdpa-math"]
        if "ours-fa2" not in piv.columns or not sdpa:
            raise Untestable("ours or SDPA rows missing")
        best = piv[sdpa].min(axis=1)
        share = float((best < piv["ours-fa2"]).mean())
        beats_flash = float((piv.get("sdpa-flash") < piv["ours-fa2"]).mean()) if "sdpa-flash" in piv else math.nan
        verdict = "holds" if share >= 0.5 else "fails"
        return Verdict(
            verdict,
            f"SDPA's fastest backend faster at {100 * share:.0f}% of points",
            f"{judged(claim, ctx.table(ATTENTION), gpu).text}. "
            f"SDPA's best backend (cuDNN here) beats our autotuned kernel at {100 * share:.0f}% of points; its "
            f"FlashAttention-2 backend at {100 * beats_flash:.0f}%. Ours is autotuned, not a fixed 64×64 teaching "
            "kernel, so this is the favourable case for Triton",
            sel.evidence,
            gpu=gpu,
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "FA-2 setting rows")


@EVALUATORS("fa1_speed_mem")
def fa1_speed_mem(claim, ctx):
    lo, hi = claim.asserted["range"]
    mlo, mhi = claim.asserted["also"]["memory_saving"]
    mode = claim.conditions["mode"]

    def one(gpu):
        fa1 = judged(claim, ctx.table(ATTENTION), gpu)  # ours: FA-1 has no maintained build
        sel = ctx.table(ATTENTION).select(
            gpu, experiment="fa1-setting", mode=mode, impl=["naive", fa1.impl, "ours-fa2"]
        )
        rows = sel.rows
        keys = ["dtype", "head_dim", "seqlen_q"]
        speed = side_by_side(rows, keys, "naive", fa1.impl)
        mem = side_by_side(rows, keys, "naive", fa1.impl, "peak_mem_mib")
        if speed.empty:
            raise Untestable(f"naive and {fa1.impl} finished at no common point of the FA-1 setting ({mode})")
        long = speed[speed["seqlen_q"] >= 1024]  # "long-sequence training": the paper's N ≥ 1K
        long = long if not long.empty else speed
        s = long["ms_median_a"] / long["ms_median_b"]
        m = (mem["peak_mem_mib_a"] / mem["peak_mem_mib_b"])[mem["seqlen_q"] >= long["seqlen_q"].min()]
        v_speed, v_mem = judge_range(s, lo, hi), judge_range(m, mlo, mhi)
        fa2 = side_by_side(rows, keys, "naive", "ours-fa2")
        fa2 = fa2[fa2["seqlen_q"] >= long["seqlen_q"].min()]
        fa2_text = f"; our FA-2: {span(fa2['ms_median_a'] / fa2['ms_median_b'], '.1f')}" if not fa2.empty else ""
        at = speed[speed["seqlen_q"] == claim.conditions["N"]]
        at_text = (
            f"; at N={claim.conditions['N']}: {float(at['ms_median_a'].iloc[0] / at['ms_median_b'].iloc[0]):.1f}×"
            if not at.empty
            else f"; naive did not finish at N={claim.conditions['N']}"
        )
        return Verdict(
            combine([v_speed, v_mem]),
            f"speed-up {span(s, '.1f')}; memory saving {span(m, '.1f')}",
            f"{fa1.text}. FA-1 paper Figure 3 setting (B=8, H=12, d=64, {mode}), our Algorithm-1 port vs three-step "
            "PyTorch "
            f"at N = {int(long['seqlen_q'].min())}…{int(long['seqlen_q'].max())}{at_text}{fa2_text}. Memory saving = "
            "naive's extra peak memory / ours (inputs excluded). The claim is about an A100: this is the same ratio "
            "measured on this GPU",
            sel.evidence,
            gpu=gpu,
            unit="×",
            parts={
                "speed": (s, f"{span(s, '.1f')} at N ≥ {int(long['seqlen_q'].min())}{at_text}"),
                "memory": (m, f"{span(m, '.1f')} less extra peak memory"),
            },
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "the FA-1 setting experiment")


def order_agreement(xs, ys) -> float:
    """Pairwise order agreement of ys with xs (Kendall's tau without ties): +1 rising throughout, −1 falling."""
    pairs = [(a, b) for i, a in enumerate(zip(xs, ys, strict=True)) for b in list(zip(xs, ys, strict=True))[i + 1 :]]
    if not pairs:
        return math.nan
    score = sum((1 if (b[1] - a[1]) * (b[0] - a[0]) > 0 else -1) for a, b in pairs)
    return score / len(pairs)


@EVALUATORS("fa_gain_vanishes")
def fa_gain_vanishes(claim, ctx):
    n0, d0 = claim.conditions["N"], claim.conditions["d"]

    def one(gpu):
        surface = ctx.table(ATTENTION).select(gpu, experiment="gain-surface", impl=["naive", "ours-fa2"])
        modes = surface.rows["mode"]
        mode = "fwd" if (modes == "fwd").any() else (modes.iloc[0] if not modes.empty else "fwd")
        sel = surface.narrow(mode=mode)
        pair = side_by_side(sel.rows, ["head_dim", "seqlen_q"], "naive", "ours-fa2")
        if pair.empty:
            raise Untestable("naive and ours finished at no common point of the gain surface")
        pair["gain"] = pair["ms_median_a"] / pair["ms_median_b"]
        at = pair[(pair["head_dim"] == d0) & (pair["seqlen_q"] == n0)]
        if at.empty:
            raise Untestable(f"no gain-surface point at d={d0}, N={n0}")
        gain0 = float(at["gain"].iloc[0])
        with_n = [order_agreement(g["seqlen_q"], g["gain"]) for _, g in pair.groupby("head_dim") if len(g) > 1]
        with_d = [order_agreement(g["head_dim"], g["gain"]) for _, g in pair.groupby("seqlen_q") if len(g) > 1]
        grows_n = sum(with_n) / len(with_n) if with_n else math.nan
        shrinks_d = sum(with_d) / len(with_d) if with_d else math.nan
        parts = [judge_approx(gain0, claim) == "holds", grows_n > 0.5, shrinks_d < -0.5]
        verdict = "holds" if all(parts) else "partly" if any(parts) else "fails"
        return Verdict(
            verdict,
            f"{gain0:.2f}× at d={d0}, N={n0}; trend with N {grows_n:+.2f}, with d {shrinks_d:+.2f}",
            f"speed-up of our FA-2 over naive ({mode}, fp16, {len(pair)} points; largest "
            f"{pair['gain'].max():.1f}× at d={int(pair.loc[pair['gain'].idxmax(), 'head_dim'])}, "
            f"N={int(pair.loc[pair['gain'].idxmax(), 'seqlen_q'])}). Trends are pairwise order agreement in [−1, 1]: "
            "+1 = gain rises with every step in N, −1 = falls with every step in d",
            sel.evidence,
            gpu=gpu,
            unit="×",
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "the gain-surface experiment")


@EVALUATORS("bwd_faster")
def bwd_faster(claim, ctx):
    lo, hi = claim.asserted["range"]
    mode = claim.conditions["mode"]

    def one(gpu):
        ours = judged(claim, ctx.table(ATTENTION), gpu)  # ours: FA-1's backward has no maintained build
        sel = ctx.table(ATTENTION).select(
            gpu, experiment="fa2-setting", mode=mode, impl=["naive", ours.impl, "sdpa-flash", UPSTREAM]
        )
        rows = sel.rows
        keys = ["dtype", "head_dim", "causal", "seqlen_q"]
        pair = side_by_side(rows, keys, "naive", ours.impl)
        if pair.empty:
            raise Untestable(f"naive and {ours.impl} finished at no common {mode} point")
        speed = pair["ms_median_a"] / pair["ms_median_b"]
        big = speed[pair["seqlen_q"] >= 4096]
        official = ""
        for impl, what in (("sdpa-flash", "SDPA flash"), (UPSTREAM, "FlashAttention's own")):
            vs = side_by_side(rows, keys, impl, ours.impl)
            over = side_by_side(rows, keys, "naive", impl)
            if len(vs) and len(over):
                official += (
                    f"; vs {what} backward: {span(vs['ms_median_a'] / vs['ms_median_b'], '.2f')} (the official "
                    f"{impl}: {span(over['ms_median_a'] / over['ms_median_b'], '.1f')} over naive)"
                )
        return Verdict(
            judge_range(speed, lo, hi),
            f"{span(speed, '.1f')} over naive ({len(speed)} points)",
            f"{ours.text}. Our FA-2 backward (P recomputed from the logsumexp) vs autograd through "
            f"baddbmm+softmax+bmm (P stored), FA-2 setting, every dtype/d/mask; at N ≥ 4096: "
            f"{span(big, '.1f') if len(big) else 'none'}{official}",
            sel.evidence,
            gpu=gpu,
            unit="×",
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "backward rows")


@EVALUATORS("break_even_512")
def break_even_512(claim, ctx):
    n0 = claim.asserted["at_least"]
    mode = claim.conditions["mode"]

    def one(gpu):
        sel = ctx.table(ATTENTION).select(
            gpu, experiment=["fa2-setting", "fa1-setting"], mode=mode, impl=["naive", "ours-fa2"]
        )
        rows = sel.rows
        keys = ["experiment", "dtype", "head_dim", "causal", "seqlen_q", "batch"]
        pair = side_by_side(rows, keys, "naive", "ours-fa2")
        if pair.empty:
            raise Untestable(f"naive and ours-fa2 finished at no common {mode} point")
        pair["faster"] = pair["ms_median_b"] <= pair["ms_median_a"]
        above = pair[pair["seqlen_q"] >= n0]
        below = pair[pair["seqlen_q"] < n0]
        if above.empty:
            raise Untestable(f"no {mode} point at N ≥ {n0}")
        share = float(above["faster"].mean())
        slowest = above.loc[(above["ms_median_b"] / above["ms_median_a"]).idxmax()]
        verdict = "holds" if share == 1.0 else "partly" if share > 0 else "fails"
        below_text = f"; below {n0}: faster at {int(below['faster'].sum())} of {len(below)}" if not below.empty else ""
        return Verdict(
            verdict,
            f"recomputing backward at least as fast at {100 * share:.0f}% of {len(above)} points with N ≥ {n0}",
            f"ours (recomputes P) vs naive (stores P), {mode}; worst at N ≥ {n0}: "
            f"{slowest['ms_median_a'] / slowest['ms_median_b']:.2f}× ({slowest['dtype']}, d={slowest['head_dim']}, "
            f"N={slowest['seqlen_q']}){below_text}",
            sel.evidence,
            gpu=gpu,
            unit="N",
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "backward rows")


@EVALUATORS("fa2_vs_fa1")
def fa2_vs_fa1(claim, ctx):
    def one(gpu):
        fa2 = judged(claim, ctx.table(ATTENTION), gpu)  # ours: FA-1 has no maintained build to compare with
        sel = ctx.table(ATTENTION).select(
            gpu, experiment=["fa2-setting", "fa1-setting"], impl=["ours-fa1", fa2.impl, "sdpa-flash"]
        )
        keys = ["experiment", "mode", "dtype", "head_dim", "causal", "seqlen_q", "batch"]
        pair = side_by_side(sel.rows, keys, "ours-fa1", fa2.impl)
        if pair.empty:
            raise Untestable(f"our FA-1 and {fa2.impl} finished at no common point")
        ratio = pair["ms_median_a"] / pair["ms_median_b"]
        median = float(ratio.median())
        by_mode = "; ".join(f"{m}: {span(ratio[pair['mode'] == m], '.1f')}" for m in sorted(pair["mode"].unique()))
        flash = side_by_side(sel.rows, keys, "ours-fa1", "sdpa-flash")
        official_ratio = (flash["ms_median_a"] / flash["ms_median_b"]).median() if len(flash) else math.nan
        official = (
            f"; the official FA-2 (sdpa-flash) over our FA-1: median {official_ratio:.1f}× at {len(flash)} points"
            if len(flash)
            else ""
        )
        return Verdict(
            judge_approx(median, claim),
            f"median {median:.1f}× ({span(ratio, '.1f')})",
            f"{fa2.text}. Our FA-2 vs our FA-1 (Algorithm 1 as published) on the same GPU, {len(pair)} points "
            f"({by_mode}){official}",
            sel.evidence,
            gpu=gpu,
            unit="×",
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "FA-1 and FA-2 rows")


@EVALUATORS("lazy_rescale")
def lazy_rescale(claim, ctx):
    def one(gpu):
        sel = ctx.table(ATTENTION).select(gpu, experiment="rescale-ablation", impl=["ours-fa2", "ours-fa2-eager"])
        pair = side_by_side(sel.rows, ["dtype", "head_dim", "causal", "seqlen_q"], "ours-fa2-eager", "ours-fa2")
        if pair.empty:
            raise Untestable("lazy and eager variants finished at no common point")
        gain = 100 * (pair["ms_median_a"] / pair["ms_median_b"] - 1)
        share = float((gain >= 0).mean())
        verdict = "holds" if share == 1.0 else "partly" if share >= 0.5 else "fails"
        return Verdict(
            verdict,
            f"lazy faster by {gain.min():+.1f}…{gain.max():+.1f}% (median {gain.median():+.1f}%)",
            "the same kernel with the division by ℓ per K/V tile (eager, as FA-1 normalises) against once at the "
            f"end (lazy, FA-2); {len(pair)} points. That the lazy kernel has no division in its loop is by "
            "construction; what is measured is what removing it buys",
            sel.evidence,
            gpu=gpu,
            unit="%",
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "the rescaling ablation")


@EVALUATORS("flashdecoding")
def flashdecoding(claim, ctx):
    lo, hi = claim.asserted["range"]
    nq = claim.conditions["seqlen_q"]

    def one(gpu):
        sel = ctx.table(ATTENTION).select(
            gpu,
            experiment="decode",
            seqlen_q=nq,
            impl=["ours-decode", "ours-fa2", "ours-decode-unsplit", "copy-kv", "sdpa-flash"],
        )
        rows = sel.rows
        keys = ["dtype", "heads_kv", "head_dim", "seqlen_k", "batch"]
        vs_fa2 = side_by_side(rows, keys, "ours-fa2", "ours-decode")
        if vs_fa2.empty:
            raise Untestable(f"split-KV and plain FA-2 finished at no common decode point (query length {nq})")
        speed = vs_fa2["ms_median_a"] / vs_fa2["ms_median_b"]
        long = speed[vs_fa2["seqlen_k"] >= 32768]
        unsplit = side_by_side(rows, keys, "ours-decode-unsplit", "ours-decode")
        copy = rows[rows["impl"] == "copy-kv"].set_index(["seqlen_k", "heads_kv"])["gbps"]
        ours = rows[rows["impl"] == "ours-decode"].set_index(["seqlen_k", "heads_kv"])["gbps"]
        bw = (ours / copy).dropna()
        extra = []
        if not unsplit.empty:
            extra.append(f"vs our unsplit kernel {span(unsplit['ms_median_a'] / unsplit['ms_median_b'], '.1f')}")
        if len(bw):
            extra.append(f"{100 * bw.min():.0f}–{100 * bw.max():.0f}% of the measured copy bandwidth")
        flash = side_by_side(rows, keys, "sdpa-flash", "ours-decode")
        if not flash.empty:
            extra.append(f"vs SDPA flash {span(flash['ms_median_a'] / flash['ms_median_b'], '.2f')}")
        return Verdict(
            judge_range(speed, lo, hi),
            f"{span(speed, '.1f')} over plain FA-2" + (f"; {span(long, '.1f')} at K/V ≥ 32K" if len(long) else ""),
            f"{judged(claim, ctx.table(ATTENTION), gpu).text}. "
            f"Query length {nq}, K/V lengths {int(vs_fa2['seqlen_k'].min())}…{int(vs_fa2['seqlen_k'].max())}, "
            f"{len(vs_fa2)} points; the split-KV gain grows with K/V length as plain FA-2 runs one program per "
            f"(batch, head); " + "; ".join(extra),
            sel.evidence,
            gpu=gpu,
            unit="×",
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "the decoding experiment")


@EVALUATORS("varlen_waste")
def varlen_waste(claim, ctx):
    lo, hi = claim.asserted["range"]

    def one(gpu):
        sel = ctx.table(ATTENTION).select(gpu, experiment="varlen")
        rows = sel.rows
        pair = side_by_side(rows, ["dtype", "head_dim", "causal", "mode"], "ours-fa2-padded", "ours-varlen")
        if pair.empty:
            raise Untestable("varlen and padded runs finished at no common point")
        waste = 100 * float(rows["pad_waste"].dropna().iloc[0])
        saved = 100 * (1 - pair["ms_median_b"] / pair["ms_median_a"])
        in_range = lo <= waste <= hi
        removed = bool((saved >= 0.75 * waste).all())
        verdict = "holds" if in_range and removed else "partly" if in_range or removed else "fails"
        batch = rows.iloc[0]
        return Verdict(
            verdict,
            f"padding wastes {waste:.0f}% of the FLOPs; varlen saves {span(saved, '.0f', '%')} of the time",
            f"one mixed-length batch ({int(batch['batch'])} sequences, {int(batch['tokens'])} tokens, longest "
            f"{int(batch['seqlen_q'])}): the waste is a property of the length mix, here "
            f"{'inside' if in_range else 'outside'} the claimed {lo:g}–{hi:g}%; 'removes it' is judged as time "
            f"saved ≥ 75% of the wasted share, {len(pair)} settings (mask, mode)",
            sel.evidence,
            gpu=gpu,
            unit="%",
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "the varlen experiment")


@EVALUATORS("block_64")
def block_64(claim, ctx):
    def one(gpu):
        sel = ctx.table(ATTENTION).select(gpu, experiment="block-sweep")
        rows = sel.rows[sel.rows["kernel_config"].fillna("") != ""]
        if rows.empty:
            raise Untestable("no finished block-sweep rows")
        out = []
        best_tiles = set()
        for (d, n), g in rows.groupby(["head_dim", "seqlen_q"]):
            best = g.loc[g["ms_median"].idxmin()]
            worst = g.loc[g["ms_median"].idxmax()]
            tiles, slow = _tile(best["kernel_config"]), _tile(worst["kernel_config"])
            best_tiles.add(tiles)
            out.append(f"d={d}, N={n}: best {tiles} ({best['tflops']:.0f} TF/s), worst {slow} ({worst['tflops']:.0f})")
        sweet = {"64×64", "128×64"}
        verdict = "holds" if best_tiles <= sweet else "partly" if best_tiles & sweet else "fails"
        return Verdict(
            verdict,
            "best tile " + ", ".join(sorted(best_tiles)),
            "; ".join(out) + ". The claim is about an A100 (192 KB shared memory per SM); on this GPU the "
            "DRAM traffic across the same configurations is in the traffic table (K/V re-reads hit L2)",
            sel.evidence,
            gpu=gpu,
            unit="BLOCK_M×BLOCK_N",
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "the block-size sweep")


def _tile(config: str) -> str:
    """``BLOCK_M×BLOCK_N`` of a kernel configuration string."""
    fields = dict(part.split("=") for part in str(config).split(",") if "=" in part)
    return f"{fields.get('BLOCK_M', '?')}×{fields.get('BLOCK_N', '?')}"
