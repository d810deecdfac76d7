"""Evaluators of the claims about standard attention and FlashAttention that the models decide: memory, HBM
traffic, FLOPs and arithmetic intensity, the roofline, FA-1's IO theorem, recomputation, the online softmax
and precision; where a claim also has a measured form, its per-GPU verdicts from the attention table.

Every observed number is computed here from ``analysis.core.models``, ``analysis.core.flops``, the GPU
specification table or the attention table's rows (``ctx.table("attention")``); never typed in.
"""

from __future__ import annotations

import functools

from analysis.audit import Claim, Context, Evaluators, Untestable, Verdict
from analysis.audit.verdicts import (
    dense_peak,
    judge_approx,
    judge_at_least,
    judge_at_most,
    judge_range,
    on_each_gpu,
    three_digits,
    within,
)
from analysis.core import gpus, models
from analysis.core.flops import BACKWARD_FACTOR, attention_flops

ATTENTION = "attention"  # the table these claims read
MB, GB, MIB = 1e6, 1e9, 2**20
EVALUATORS = Evaluators()


@EVALUATORS("mem_8k_scores")
def mem_8k_scores(claim, ctx):
    b = models.score_matrix_bytes(8192)
    verdict = judge_approx(b / MIB, claim)
    note = f"{b / MB:.1f} MB in decimal units; the article's 'MB' is MiB (2^20 bytes)"
    return [Verdict(verdict, f"{b / MIB:g} MiB", note, "analysis/core/models.py: score_matrix_bytes(8192)", unit="MiB")]


@EVALUATORS("mem_128k_head")
def mem_128k_head(claim, ctx):
    n = 131072
    elements = n * n
    s = models.score_matrix_bytes(n)
    also = claim.asserted["also"]
    checks = [
        within(elements, also["elements"], claim.tolerance),
        within(s / GB, also["s_gb"], claim.tolerance),
        within(2 * s / GB, claim.asserted["approx"], claim.tolerance),
    ]
    verdict = "holds" if all(checks) else "partly" if any(checks) else "fails"
    observed = f"{elements:.4g} elements; S {s / GB:.2f} GB; S+P {2 * s / GB:.1f} GB"
    parts = {
        "elements": ([elements], f"{elements:.4g} elements"),
        "s": ([s / GB], f"S {s / GB:.2f} GB"),
        "s-and-p": ([2 * s / GB], f"S+P {2 * s / GB:.1f} GB"),
    }
    return [
        Verdict(
            verdict,
            observed,
            "decimal GB (1e9 bytes)",
            "analysis/core/models.py: score_matrix_bytes(131072)",
            unit="GB",
            parts=parts,
        )
    ]


@EVALUATORS("mem_128k_oom")
def mem_128k_oom(claim, ctx):
    one_head = 2 * models.score_matrix_bytes(131072) / GB
    layer = one_head * claim.conditions["heads"]
    card = claim.conditions["card_gb"]
    fits_one = one_head <= card
    verdict = "partly" if fits_one and layer > card else "holds" if not fits_one else "fails"
    note = (
        f"one head's S+P ({one_head:.1f} GB) still fits in {card} GB; the {claim.conditions['heads']} heads of a "
        f"layer ({layer:.0f} GB) do not"
    )
    return [
        Verdict(
            verdict,
            f"one head {one_head:.1f} GB; 32 heads {layer:.0f} GB",
            note,
            "analysis/core/models.py: score_matrix_bytes",
            unit="GB",
        )
    ]


@EVALUATORS("time_128k_hbm")
def time_128k_hbm(claim, ctx):
    sp = 2 * models.score_matrix_bytes(131072)
    ms = 2 * sp / (claim.conditions["bandwidth_tbps"] * 1e12) * 1e3  # written once, read back once
    return [
        Verdict(
            judge_approx(ms, claim),
            f"{ms:.1f} ms",
            "2 × 68.7 GB (write, then read back) at 1.5 TB/s",
            "analysis/core/models.py: score_matrix_bytes",
            unit="ms",
        )
    ]


@EVALUATORS("time_128k_compute")
def time_128k_compute(claim, ctx):
    c = claim.conditions
    flops = attention_flops(1, 1, c["N"], c["N"], c["d"])
    ms = flops / (c["peak_tflops"] * 1e12) * 1e3
    note = f"4·N²·d = {flops:.3g} FLOP for one head at 312 TFLOP/s; even one of the two products takes {ms / 2:.1f} ms"
    return [
        Verdict(
            judge_at_most(ms, claim.asserted["at_most"]),
            f"{ms:.1f} ms",
            note,
            "analysis/core/flops.py: attention_flops",
            unit="ms",
        )
    ]


@EVALUATORS("idle_95")
def idle_95(claim, ctx):
    n, d = claim.conditions["N"], claim.conditions["d"]
    compute_ms = attention_flops(1, 1, n, n, d) / 312e12 * 1e3
    hbm_ms = 2 * 2 * models.score_matrix_bytes(n) / 1.5e12 * 1e3
    idle = 100 * (1 - compute_ms / hbm_ms)
    analytic = Verdict(
        judge_at_least(idle, claim.asserted["at_least"]),
        f"{idle:.0f}% idle",
        f"with the article's own A100 figures: {compute_ms:.1f} ms of matrix products under {hbm_ms:.1f} ms of "
        "S/P traffic, if the two overlap perfectly",
        "analysis/core/models.py + analysis/core/flops.py",
        unit="%",
    )

    def measured(gpu):
        peak, name = dense_peak(gpu)
        sel = ctx.table(ATTENTION).select(gpu, experiment="fa2-setting", mode="fwd", impl="naive")
        naive = sel.rows
        if naive.empty:
            raise Untestable("no finished naive attention rows")
        busy = 100 * naive["tflops"] / peak
        verdict = judge_range(100 - busy, claim.asserted["at_least"], 100)
        return Verdict(
            verdict,
            f"{100 - busy.max():.0f}–{100 - busy.min():.0f}% idle",
            f"tensor cores idle = 1 − achieved / dense fp16 peak ({peak:g} TFLOP/s) of naive attention on {name}, "
            f"{len(naive)} points of the FA-2 setting",
            sel.evidence,
            gpu=gpu,
            unit="%",
        )

    return [analytic, *on_each_gpu(ctx.table(ATTENTION), measured, "naive attention rows", optional=True)]


@EVALUATORS("std_flops")
def std_flops(claim, ctx):
    f = attention_flops(1, 1, 1024, 1024, 64)
    ok = f == 4 * 1024 * 1024 * 64
    return [
        Verdict(
            "holds" if ok else "fails",
            "4N²d",
            "two N×N×d matrix products of 2N²d FLOPs each",
            "analysis/core/flops.py: attention_flops",
            unit="FLOP",
        )
    ]


def _intensity(n: int, d: int, n2_coeff: int) -> tuple[float, float, float]:
    flops = attention_flops(1, 1, n, n, d)
    traffic = models.formula_attention_bytes(n, d, n2_coeff)
    return flops, traffic, flops / traffic


@EVALUATORS("ai_4096")
def ai_4096(claim, ctx):
    flops, traffic6, ai6 = _intensity(4096, 128, 6)
    _, traffic8, ai8 = _intensity(4096, 128, 8)
    a = claim.asserted
    arithmetic = (
        within(flops / 1e9, a["also"]["gflop"], claim.tolerance)
        and within(traffic6 / MB, a["also"]["traffic_mb"], claim.tolerance)
        and within(ai6, a["approx"], claim.tolerance)
    )
    note = (
        f"arithmetic reproduces with 6N²+8Nd ({traffic6 / MB:.2f} MB, {ai6:.1f} FLOP/B); the per-kernel traffic "
        f"(8N²+8Nd, see std-bytes-formula) gives {traffic8 / MB:.1f} MB and {ai8:.1f} FLOP/B"
    )
    return [
        Verdict(
            "partly" if arithmetic else "fails",
            f"{flops / 1e9:.2f} GFLOP; {ai8:.1f} FLOP/B",
            note,
            "analysis/core/models.py + analysis/core/flops.py",
            unit="FLOP/B",
        )
    ]


@EVALUATORS("ai_limit")
def ai_limit(claim, ctx):
    lim6 = {d: 4 * d / 6 for d in (64, 128)}
    lim8 = {d: 4 * d / 8 for d in (64, 128)}
    arithmetic = within(lim6[128], claim.asserted["approx"], claim.tolerance) and within(
        lim6[64], claim.asserted["also"]["d64"], claim.tolerance
    )
    note = (
        f"2d/3 follows from 6N² bytes ({lim6[128]:.1f} and {lim6[64]:.1f}); with the per-kernel 8N² it is d/2 "
        f"({lim8[128]:.0f} at d=128, {lim8[64]:.0f} at d=64)"
    )
    return [
        Verdict(
            "partly" if arithmetic else "fails",
            f"d/2: {lim8[128]:.0f} (d=128), {lim8[64]:.0f} (d=64)",
            note,
            "analysis/core/models.py: standard_attention_bytes",
            unit="FLOP/B",
        )
    ]


@EVALUATORS("ai_order_d")
def ai_order_d(claim, ctx):
    n = 1 << 20  # large N: the limit the claim speaks of
    ai = {d: attention_flops(1, 1, n, n, d) / models.standard_attention_total_bytes(n, d) for d in (64, 128, 256)}
    linear = within(ai[128] / ai[64], 2.0, 0.05) and within(ai[256] / ai[128], 2.0, 0.05)
    note = (
        "of order d holds: 4N²d FLOPs over Θ(N²) bytes; the constant differs between the articles — S0's "
        "'≈2N² bytes' gives 2d (or d if 2N² counts elements), S1's ai-limit 2d/3, the per-kernel count d/2"
    )
    observed = ", ".join(f"{v:.1f} (d={d})" for d, v in ai.items())
    return [
        Verdict(
            "holds" if linear else "fails",
            observed,
            note,
            "analysis/core/models.py: standard_attention_bytes",
            unit="FLOP/B",
        )
    ]


@EVALUATORS("tc_bound_55")
def tc_bound_55(claim, ctx):
    s = gpus.spec("a100-sxm4-80gb")
    knee = gpus.ridge_point(s, "fp16")
    limit6 = 100 * (4 * 128 / 6) / knee
    limit8 = 100 * (128 / 2) / knee
    analytic = Verdict(
        judge_at_most(limit6, claim.asserted["at_most"], claim.tolerance),
        f"{limit8:.0f}% (8N² bytes); {limit6:.1f}% (6N²)",
        f"roofline bound = intensity / knee at d=128 as N→∞ on the A100 (knee {knee:.0f} FLOP/B); with the "
        f"article's 6N² the bound is {limit6:.1f}%, slightly above its own 55%",
        "analysis/core/models.py + analysis/core/gpu_specs.yaml",
        unit="%",
    )

    def measured(gpu):
        peak, name = dense_peak(gpu)
        sel = ctx.table(ATTENTION).select(gpu, experiment="fa2-setting", mode="fwd", impl="naive")
        naive = sel.rows
        if naive.empty:
            raise Untestable("no finished naive attention rows")
        best = 100 * naive["tflops"].max() / peak
        return Verdict(
            judge_at_most(best, claim.asserted["at_most"]),
            f"best {best:.1f}% of peak",
            f"hardware-independent form on {name}: naive attention's best fraction of the dense fp16 peak "
            f"({peak:g} TFLOP/s) over {len(naive)} points",
            sel.evidence,
            gpu=gpu,
            unit="%",
        )

    return [analytic, *on_each_gpu(ctx.table(ATTENTION), measured, "naive attention rows", optional=True)]


@EVALUATORS("fa_exact")
def fa_exact(claim, ctx):
    def one(gpu):
        sel = ctx.table(ATTENTION).select(gpu, mode="fwd", impl="ours-fa2")
        rows = sel.rows
        if rows.empty:
            raise Untestable("no finished rows of our kernel")
        by_dtype = rows.groupby("dtype")["max_abs_err"].max()
        fp16 = rows[rows["dtype"] == claim.conditions["dtype"]]["max_abs_err"]
        if fp16.empty:
            raise Untestable(f"no {claim.conditions['dtype']} rows of our kernel")
        verdict = judge_range(fp16, 0.0, claim.asserted["at_most"])
        within_pct = 100 * float((fp16 <= claim.asserted["at_most"]).mean())
        detail = "; ".join(f"{k} ≤ {three_digits(v)}" for k, v in by_dtype.items())
        return Verdict(
            verdict,
            f"max abs error vs float64: {detail}",
            f"{within_pct:.0f}% of the {len(fp16)} fp16 points are within 1e-3 of a float64 reference (first and "
            "last 64 query rows); every point, bf16 included, is within twice plain PyTorch's own error at the "
            "same precision, which is what rounding-level exactness means here",
            sel.evidence,
            gpu=gpu,
            unit="max abs error",
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "our kernel's rows")


@EVALUATORS("fa1_blocks")
def fa1_blocks(claim, ctx):
    m, d = claim.conditions["M_elements"], claim.conditions["d"]
    br, bc = models.fa1_block_sizes(m, d)
    note = (
        f"the FA-1 paper's Algorithm 1 sets Bc = ⌈M/4d⌉ but Br = min(⌈M/4d⌉, d): at M={m:,} elements, d={d} "
        f"that is Bc={bc}, Br={br}"
    )
    return [
        Verdict(
            "holds" if br == bc else "fails",
            f"Br = min(⌈M/4d⌉, d) = {br}; Bc = {bc}",
            note,
            "analysis/core/models.py: fa1_block_sizes",
        )
    ]


@EVALUATORS("recompute_flops_a")
def recompute_flops_a(claim, ctx):
    r = models.recompute_extra_flops(1, 1, 4096, 64)
    pct = 100 * r["increase_over_training_step"]
    lo, hi = claim.asserted["range"]
    note = (
        f"one extra N×N×d product (2N²d) over forward (4N²d) + backward without recomputation (8N²d) = "
        f"{pct:.1f}%; as a share of the recomputing training step {100 * r['share_of_training_step']:.1f}%"
    )
    analytic = Verdict(
        judge_range([pct], lo, hi), f"{pct:.1f}%", note, "analysis/core/models.py: recompute_extra_flops", unit="%"
    )
    measured = on_each_gpu(
        ctx.table(ATTENTION),
        lambda gpu: _recompute_time_verdict(ctx, gpu, claim, "increase"),
        "our kernel's forward and backward rows",
        optional=True,
    )
    return [analytic, *measured]


def _recompute_time_verdict(ctx: Context, gpu: str, claim: Claim, measure: str) -> Verdict:
    """The measured analogue of the recomputation share: our forward and backward times at the same shapes,
    with the recomputation of P taken as 1 of the backward's 5 matrix products (2 of its 10·N²d FLOPs)."""
    sel = ctx.table(ATTENTION).select(gpu, experiment="fa2-setting", mode=["fwd", "bwd"], impl="ours-fa2")
    times = sel.rows.pivot_table(index=["dtype", "head_dim", "causal", "seqlen_q"], columns="mode", values="ms_median")
    if not {"fwd", "bwd"} <= set(times.columns):
        raise Untestable("no shape with both forward and backward rows of our kernel")
    times = times.dropna(subset=["fwd", "bwd"])
    if times.empty:
        raise Untestable("no shape with both forward and backward rows of our kernel")
    # the recomputed product's share of the backward's FLOPs (the model's 1/5), at each shape
    share = [
        models.recompute_extra_flops(1, 1, int(n), int(d), bool(c))["share_of_backward"] for _, d, c, n in times.index
    ]
    recompute = times["bwd"] * share
    values = 100 * (
        recompute / (times["fwd"] + times["bwd"] - recompute)
        if measure == "increase"
        else recompute / (times["fwd"] + times["bwd"])
    )
    ratio = times["bwd"] / times["fwd"]
    lo, hi = claim.asserted["range"]
    what = "more time than a training step without it" if measure == "increase" else "of the training step's time"
    return Verdict(
        judge_range(values, lo, hi),
        f"{values.min():.1f}–{values.max():.1f}% {what}",
        f"our backward takes {ratio.min():.2f}–{ratio.max():.2f}× our forward's time at {len(times)} shapes of the "
        f"FA-2 setting (FLOP model: {BACKWARD_FACTOR:g}×); taking the recomputation of P as its FLOP share of the "
        f"backward ({min(share):.2f}: one of its five matrix products, at the backward's own rate) gives this "
        "share — an estimate, the kernel does not time the recomputation separately",
        sel.evidence,
        gpu=gpu,
        unit="%",
    )


@EVALUATORS("recompute_flops_b")
def recompute_flops_b(claim, ctx):
    r = models.recompute_extra_flops(1, 1, 4096, 64)
    whole = 100 * r["share_of_training_step"]
    increase = 100 * r["increase_over_training_step"]
    lo, hi = claim.asserted["range"]
    other_lo, other_hi = claim.asserted["also"]["other_range"]  # recompute-flops-a, S1 §3.3
    if lo <= whole <= hi or lo <= increase <= hi:
        verdict = "holds"
    elif hi < other_lo or lo > other_hi:  # the two statements of S1 cannot both be right
        verdict = "inconsistent"
    else:
        verdict = "fails"
    note = (
        f"2N²d is right, but it is {whole:.1f}% of forward + backward ({100 * r['increase_over_training_step']:.1f}% "
        "more than without recomputation), not 25–30%; contradicts recompute-flops-a (S1 §3.3: 15–20%), which "
        "matches the model; 25% is its share of a backward pass without recomputation only"
    )
    analytic = Verdict(
        verdict, f"{whole:.1f}% of the whole", note, "analysis/core/models.py: recompute_extra_flops", unit="%"
    )
    return [
        analytic,
        *on_each_gpu(
            ctx.table(ATTENTION),
            lambda gpu: _recompute_time_verdict(ctx, gpu, claim, "share"),
            "our kernel's forward and backward rows",
            optional=True,
        ),
    ]


@EVALUATORS("mem_64k")
def mem_64k(claim, ctx):
    n = 65536
    sp_fp32 = 2 * models.score_matrix_bytes(n, elem_bytes=4)
    sp_fp16 = 2 * models.score_matrix_bytes(n, elem_bytes=2)
    lse_kib = n * 4 / 1024
    ok = within(sp_fp32 / 2**30, claim.asserted["approx"], claim.tolerance)
    lo, hi = claim.asserted["also"]["fa_kb"]
    ok_fa = lo <= lse_kib <= hi
    note = (
        f"32 GB matches S and P in fp32 for one head (32 GiB; in fp16 {sp_fp16 / 2**30:.0f} GiB); FlashAttention "
        f"keeps only the row logsumexp, {lse_kib:.0f} KiB per head (outputs and inputs excluded)"
    )
    verdict = "holds" if ok and ok_fa else "partly" if ok or ok_fa else "fails"
    parts = {
        "standard": ([sp_fp32 / 2**30], f"{sp_fp32 / 2**30:.0f} GiB (S and P, fp32, one head)"),
        "flash": ([lse_kib], f"{lse_kib:.0f} KiB (the row logsumexp, one head)"),
    }
    return [
        Verdict(
            verdict,
            f"{sp_fp32 / 2**30:.0f} GiB → {lse_kib:.0f} KiB",
            note,
            "analysis/core/models.py: score_matrix_bytes",
            unit="GiB",
            parts=parts,
        )
    ]


@EVALUATORS("fa_io_theorem")
def fa_io_theorem(claim, ctx):
    d, m = 64, 82000
    ratios = []
    for n in (8192, 16384, 32768):
        fa = models.fa1_forward_bytes(n, d, m)["total"]
        ratios.append(fa / (n * n * d * d / m))
    note = (
        "Algorithm 1 re-reads Q and re-reads/re-writes O once per K/V block, Tc = ⌈4Nd/M⌉ times: traffic / "
        f"(N²d²/M) stays constant ({', '.join(f'{r:.1f}' for r in ratios)} at N = 8K, 16K, 32K), so Θ(N²d²/M) "
        "holds; the hidden constant is ~12 bytes (Q read + O read + O write)"
    )
    constant = max(ratios) / min(ratios) < 1.1  # Θ(·): the ratio to N²d²/M does not drift with N
    return [
        Verdict(
            "holds" if constant else "fails",
            "traffic / (N²d²/M) = " + ", ".join(f"{r:.1f}" for r in ratios),
            note,
            "analysis/core/models.py: fa1_forward_bytes",
        )
    ]


@EVALUATORS("io_ratio_20")
def io_ratio_20(claim, ctx):
    m, d = claim.conditions["M_elements"], claim.conditions["d"]
    theory = m / d**2
    n = 16384
    ratio = models.standard_attention_total_bytes(n, d) / models.fa1_forward_bytes(n, d, m)["total"]
    note = (
        f"M/d² = {theory:.1f} as stated, but it is an order, not a factor: with Algorithm 1's actual traffic "
        f"(Q read, O read and written per K/V block) the reduction at N={n} is {ratio:.1f}× (→ M/3d² for large N)"
    )
    return [
        Verdict(
            judge_approx(ratio, claim),
            f"{ratio:.1f}× (M/d² = {theory:.1f})",
            note,
            "analysis/core/models.py: standard_attention_total_bytes, fa1_forward_bytes",
            unit="×",
        )
    ]


def _q2(n: int, d: int, m: int):
    std = models.standard_attention_total_bytes(n, d)
    q_only = models.fa1_forward_bytes(n, d, m, full=False)
    full = models.fa1_forward_bytes(n, d, m, full=True)
    return std, q_only, full


@EVALUATORS("io_q2_8k")
def io_q2_8k(claim, ctx):
    c, a = claim.conditions, claim.asserted
    std, q_only, full = _q2(c["N"], c["d"], c["M_elements"])
    arithmetic = (
        within(std / MB, a["also"]["standard_mb"], claim.tolerance)
        and q_only["tc"] == a["also"]["tc"]
        and within(std / q_only["total"], a["approx"], claim.tolerance)
    )
    note = (
        f"the arithmetic reproduces ({std / MB:.2f} MB; Tc={q_only['tc']}; Q re-reads {q_only['q_rereads'] / MB:.1f} "
        f"MB; {std / q_only['total']:.2f}×) but uses 8N²+8Nd for standard attention, contradicting std-bytes-formula's "
        f"6N²+8Nd (S1 §1.2); counting Algorithm 1's O reads and writes too gives {full['total'] / MB:.0f} MB and "
        f"{std / full['total']:.2f}×"
    )
    verdict = "inconsistent" if arithmetic else "fails"
    return [
        Verdict(
            verdict,
            f"{std / q_only['total']:.2f}× (Q-only accounting)",
            note,
            "analysis/core/models.py: standard_attention_total_bytes, fa1_forward_bytes",
            unit="×",
        )
    ]


@EVALUATORS("io_q2_32k")
def io_q2_32k(claim, ctx):
    c = claim.conditions
    std, q_only, full = _q2(c["N"], c["d"], c["M_elements"])
    ratio = std / q_only["total"]
    note = (
        f"same accounting as io-q2-8k: standard {std / GB:.2f} GB (article 8.72), FlashAttention "
        f"{q_only['total'] / GB:.2f} GB (article ≈1.2): Tc grows with N, so the Q re-reads grow as N² and the "
        f"ratio stays ≈3×; with Algorithm 1's O traffic {std / full['total']:.2f}×"
    )
    parts = {
        "standard": ([std / GB], f"{std / GB:.2f} GB"),
        "flash": ([q_only["total"] / GB], f"{q_only['total'] / GB:.2f} GB (Q re-read once per K/V block)"),
        "ratio": ([ratio], f"{ratio:.2f}×"),
    }
    return [
        Verdict(
            judge_approx(ratio, claim),
            f"{ratio:.2f}×",
            note,
            "analysis/core/models.py: standard_attention_total_bytes, fa1_forward_bytes",
            unit="×",
            parts=parts,
        )
    ]


ONLINE_SOFTMAX_NS = (64, 128, 1024, 16384)  # one 64-key block, then 2, 16 and 256 blocks


@functools.cache
def online_softmax_emulation(ns=ONLINE_SOFTMAX_NS, block: int = 64, d: int = 64, rows: int = 256, seed: int = 0):
    """Relative RMS error against exact softmax attention of the online softmax with and without its
    rescaling, for ``rows`` query rows against N keys (float64, N(0, 1) inputs, one key block = ``block``).
    Cached: deterministic, and ten seconds of float64 work that the band re-judging must not repeat; the
    result is shared, not to be modified."""
    import torch

    from kernels.attention import reference

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for n in ns:
        q = torch.randn(rows, d, generator=gen, dtype=torch.float64)
        k, v = (torch.randn(n, d, generator=gen, dtype=torch.float64) for _ in range(2))
        exact = reference.reference_attention(q[None, None], k[None, None], v[None, None])[0, 0]
        rms = float(exact.pow(2).mean().sqrt())
        out[n] = {
            flag: float((reference.online_softmax_attention(q, k, v, block, rescale=flag) - exact).pow(2).mean().sqrt())
            / rms
            for flag in (True, False)
        }
    return out


@EVALUATORS("online_softmax")
def online_softmax(claim, ctx):
    errs = online_softmax_emulation()
    ns = sorted(errs)
    exact = max(e[True] for e in errs.values()) < 1e-12
    one_block = errs[ns[0]][False] < 1e-12  # nothing to rescale
    small_n_hidden = errs[ns[1]][False] < 1e-3  # "invisible at small N": two blocks
    large = errs[ns[-1]][False] > 0.1  # far above any fp16 kernel's error
    verdict = "holds" if exact and one_block and small_n_hidden and large else "partly" if exact else "fails"
    text = ", ".join(f"N={n}: {three_digits(errs[n][False])}" for n in ns)
    emulation = Verdict(
        verdict,
        f"relative RMS error with rescaling ≤ {three_digits(max(e[True] for e in errs.values()))}; without: {text}",
        "float64 emulation of the tiled algorithm (kernels/attention/reference.py: online_softmax_attention), "
        "64-key blocks, d=64, 256 query rows, N(0,1) inputs: exact with the rescale. Without it the result is "
        f"identical only while N fits in one block; from the second block on it is off by "
        f"{100 * errs[ns[1]][False]:.0f}% (N={ns[1]}), growing slowly to {100 * errs[ns[-1]][False]:.0f}% at "
        f"N={ns[-1]}: visible at small N too, not only at large N",
        "kernels/attention/reference.py: online_softmax_attention (rescale on/off) vs softmax",
        unit="relative RMS error",
    )

    def one(gpu):
        sel = ctx.table(ATTENTION).select(gpu, finished=False, impl="ours-fa2")
        ours = sel.rows
        ok = ours[ours["status"] == "ok"]
        bad = ours[ours["status"] == "mismatch"]
        if ok.empty:
            raise Untestable("no finished rows of our kernel")
        return Verdict(
            "holds" if bad.empty else "fails",
            f"{len(ok)} of {len(ours)} points exact within tolerance (N up to {int(ok['seqlen_q'].max())})",
            "our kernel (online softmax with rescaling) against float64 at every measured point, within the "
            "tolerance policy; the missing-rescale half is the emulation row",
            sel.evidence,
            gpu=gpu,
        )

    return [emulation, *on_each_gpu(ctx.table(ATTENTION), one, "our kernel's rows", optional=True)]


@EVALUATORS("fp16_tolerance")
def fp16_tolerance(claim, ctx):
    def one(gpu):
        sel = ctx.table(ATTENTION).select(
            gpu, dtype="float16", mode="fwd", impl=["ours-fa2", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient"]
        )
        rows = sel.rows
        ours = rows[rows["impl"] == "ours-fa2"]
        sdpa = rows[rows["impl"].isin(["sdpa-flash", "sdpa-cudnn", "sdpa-efficient"])]
        if ours.empty or sdpa.empty:
            raise Untestable("no finished fp16 rows of ours and SDPA")
        bound = float(ours["max_abs_err"].max() + sdpa["max_abs_err"].max())
        floor = float(ours["max_abs_err"].min())
        ok = bound <= claim.asserted["at_most"] and floor > 1e-5
        return Verdict(
            "holds" if ok else "fails",
            f"|ours − SDPA| ≤ {three_digits(bound)}; smallest error {three_digits(floor)}",
            "difference bounded by the sum of both errors against float64 (triangle inequality); a 1e-5 tolerance "
            "would fail every point whose error exceeds it",
            sel.evidence,
            gpu=gpu,
            unit="max abs difference",
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "fp16 rows")


@EVALUATORS("causal_skip_50")
def causal_skip_50(claim, ctx):
    t = 16384 // 128
    saved = 100 * (1 - models.causal_block_fraction(t))
    analytic = Verdict(
        judge_approx(saved, claim),
        f"{saved:.1f}% of tiles skipped",
        f"{t}×{t} tiles (N=16384, 128-row blocks): (T+1)/2T computed",
        "analysis/core/models.py: causal_block_fraction",
        unit="%",
    )

    def measured(gpu):
        setting = ctx.table(ATTENTION).select(gpu, experiment="fa2-setting", mode="fwd", impl="ours-fa2")
        n = setting.rows["seqlen_q"].max() if not setting.empty else None
        sel = setting.narrow(seqlen_q=n)
        pair = sel.rows
        full, causal = pair[~pair["causal"]], pair[pair["causal"]]
        merged = full.merge(causal, on=["dtype", "head_dim"], suffixes=("_f", "_c"))
        if merged.empty:
            raise Untestable("no causal and non-causal rows at the same shape")
        saved = 100 * (1 - merged["ms_median_c"] / merged["ms_median_f"])
        return Verdict(
            judge_range(saved, 50 * (1 - claim.tolerance), 50 * (1 + claim.tolerance)),
            f"{saved.min():.0f}–{saved.max():.0f}% of time saved",
            f"our kernel, causal vs non-causal time at N={n} ({len(merged)} dtype × head-dim pairs)",
            sel.evidence,
            gpu=gpu,
            unit="%",
        )

    return [analytic, *on_each_gpu(ctx.table(ATTENTION), measured, "our kernel's rows", optional=True)]
