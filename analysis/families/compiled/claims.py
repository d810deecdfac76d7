"""Evaluators of the claims that compiled kernels decide: FlashAttention-3's Hopper techniques (TMA's registers,
WGMMA's instruction issue, TMA's issue slots) and FA-2's inner-loop instruction mix; from the compiled-kernel
table (registers, spills and SASS instruction counts, the same on every machine, so these verdicts carry
``gpu = "-"``), and for the mix also, per GPU, the instructions Nsight Compute counted executing (the traffic
table's ``traffic-inst-mix`` rows)."""

from __future__ import annotations

from analysis.audit import ANALYTIC, Claim, Context, Evaluators, Results, Selection, Untestable, Verdict
from analysis.audit.verdicts import judge_part, per_gpu
from analysis.core.summaries import span

COMPILED = "compiled"  # the table these claims read
TRAFFIC, INST_MIX = "traffic", "traffic-inst-mix"  # where the executed instruction counts are, per GPU
EVALUATORS = Evaluators()


def _compiled(ctx: Context, experiment: str, **where) -> Selection:
    """The compiled-kernel rows of one experiment that compiled; untestable (with the reason) without any."""
    if ANALYTIC not in ctx.table(COMPILED).frames:
        raise Untestable(
            "no compiled-kernel table: the compiled family (config section `compiled`) compiles the "
            "kernel variants on the CPU; it is switched off or has not run"
        )
    sel = ctx.table(COMPILED).select(ANALYTIC, finished=False, experiment=experiment, status="ok", **where)
    if sel.empty:
        raise Untestable(f"the compiled-kernel table holds no compiled {experiment!r} variant")
    return sel


def _producer_budget(setmaxnreg: str) -> int:
    """The producer warpgroup's registers per thread: the smallest ``setmaxnreg`` value of the kernel (the
    requested budget is rounded so that both consumers get a multiple of 8)."""
    return min(int(x) for x in str(setmaxnreg).split("/"))


@EVALUATORS("tma_registers")
def tma_registers(claim: Claim, ctx: Context) -> list[Verdict]:
    """Registers per producer thread that loading the K/V ring needs, with TMA and with per-thread copies:
    between the largest budget at which the producer's load loop still spills and the smallest at which it
    does not (``setmaxnreg`` budgets; the consumers get the rest)."""
    lo, hi = claim.asserted["range"]
    sel = _compiled(ctx, "producer-registers")
    rows = sel.rows
    rows = rows.assign(budget=rows["setmaxnreg"].map(_producer_budget))
    need = {}
    for variant in ("fa3", "no-tma"):
        r = rows[rows["variant"] == variant]
        clean, spilled = r[r["load_loop_spills"] == 0]["budget"], r[r["load_loop_spills"] > 0]["budget"]
        if clean.empty:
            raise Untestable(f"the {variant} producer spilled at every budget tried (up to {r['budget'].max()})")
        floor = spilled[spilled < clean.min()].max() if len(spilled) else float("nan")
        need[variant] = (floor + 1 if floor == floor else None, int(clean.min()))
    tma_low, tma = need["fa3"]
    cp_low, cp = need["no-tma"]
    if cp_low is None:
        raise Untestable(f"the per-thread-copy producer did not spill even at {cp} registers: no lower bound")
    saved = (cp_low - tma, cp - tma)  # TMA's producer runs spill-free at its smallest budget tried
    inside, overlapping = lo <= saved[0] and saved[1] <= hi, saved[0] <= hi and saved[1] >= lo
    verdict = "holds" if inside else "partly" if overlapping else "fails"
    budgets = ", ".join(str(b) for b in sorted(rows["budget"].unique()))
    return [
        Verdict(
            verdict,
            f"{saved[0]:.0f}–{saved[1]:.0f} registers per thread (TMA producer: no spill at {tma}; per-thread "
            f"cp.async producer: spills at {cp_low - 1:.0f}, none at {cp})",
            "FA-3's producer warpgroup compiled for sm_90 at the register budgets "
            f"{budgets} (setmaxnreg; the two consumers get the rest); the need lies between the largest budget at "
            "which the producer's load loop spills to local memory and the smallest at which it does not",
            sel.evidence,
            gpu=ANALYTIC,
            unit="registers",
        )
    ]


@EVALUATORS("wgmma_issue")
def wgmma_issue(claim: Claim, ctx: Context) -> list[Verdict]:
    """MMA instructions a warp issues per K/V tile of our FA-2 kernel, compiled for sm_80 (mma.sync) and for
    sm_90 (wgmma), same tile."""
    target, tol = claim.asserted["approx"], claim.tolerance
    sel = _compiled(ctx, "mma-issue")
    rows = sel.rows.set_index("target")
    if not {"sm_80", "sm_90"} <= set(rows.index):
        raise Untestable("the compiled-kernel table lacks the sm_80 or the sm_90 build of the FA-2 kernel")
    old, new = rows.loc["sm_80", "loop_mma"], rows.loc["sm_90", "loop_mma"]
    ratio = float(old / new)
    close = abs(ratio - target) <= tol * target
    verdict = "holds" if close else "partly" if ratio > 1 else "fails"
    tile = f"{int(rows.loc['sm_90', 'tile_m'])}×{int(rows.loc['sm_90', 'tile_n'])}"
    return [
        Verdict(
            verdict,
            f"{ratio:.0f}× fewer ({old:.0f} mma.sync against {new:.0f} wgmma per warp per {tile} K/V tile, "
            f"d={int(rows.loc['sm_90', 'head_dim'])})",
            "the same Triton FA-2 source compiled for sm_80 and for sm_90, instructions counted in the SASS of the "
            "hot loop. Each warp's wgmma covers a 64-row warpgroup tile 16 deep, each mma.sync 16×8×16: fewer "
            "instructions than claimed, " + ("as claimed" if close else "so the direction holds, not the factor"),
            sel.evidence,
            gpu=ANALYTIC,
            unit="×",
        )
    ]


@EVALUATORS("tma_issue_slots")
def tma_issue_slots(claim: Claim, ctx: Context) -> list[Verdict]:
    """Per K/V tile, the instructions the producer's warps issue, TMA against per-thread cp.async."""
    sel = _compiled(ctx, "fa3-schedules", variant=["fa3", "no-tma"])
    rows = sel.rows.set_index(["head_dim", "variant"])
    found = []
    for d in sorted({h for h, _ in rows.index}):
        if (d, "fa3") in rows.index and (d, "no-tma") in rows.index:
            tma, cp = rows.loc[(d, "fa3")], rows.loc[(d, "no-tma")]
            found.append(
                (
                    d,
                    tma["load_loop_instructions"],
                    cp["load_loop_instructions"],
                    tma["load_loop_tma"],
                    cp["load_loop_thread_loads"],
                )
            )
    if not found:
        raise Untestable("the compiled-kernel table lacks the TMA or the cp.async variant of the FA-3 kernel")
    ratios = [cp / tma for _, tma, cp, _, _ in found]
    d, tma_i, cp_i, tma_loads, cp_loads = found[0]
    return [
        Verdict(
            "holds" if min(ratios) > 1 else "fails",
            f"{span(ratios, '.1f')} more instructions per K/V tile with cp.async (d={d}: {cp_i:.0f} per warp, "
            f"{cp_loads:.0f} of them copies of 16 bytes per thread, against {tma_i:.0f} per warp with "
            f"{tma_loads:.0f} TMA copies issued by one thread)",
            "the producer's load loop of FA-3 with TMA and with per-thread copies (same tiles, same ring), "
            "from the SASS; the claim's other half, that the copy engine computes the addresses, is what the "
            "register and instruction counts show",
            sel.evidence,
            gpu=ANALYTIC,
            unit="×",
        )
    ]


def _pipe_text(row) -> str:
    pipes = ("fma", "alu", "xu", "memory", "uniform", "control")
    return ", ".join(f"{p} {row[f'loop_pipe_{p}']:.0f}" for p in pipes if f"loop_pipe_{p}" in row)


@EVALUATORS("tc_inner_mix")
def tc_inner_mix(claim: Claim, ctx: Context) -> list[Verdict]:
    """The share of tensor-core instructions among the instructions of FA-2's inner loop, on our FA-2 kernel.

    Static (every machine): the hot loop's SASS of the ``mma-issue`` builds (sm_90: warpgroup MMA; sm_80:
    mma.sync), instructions by pipe, and their floating-point work on the tensor pipe and off it. Per GPU,
    where Nsight Compute ran the ``traffic-inst-mix`` pass: the warp instructions the kernel executed, by
    pipe. The share of instructions decides, since the claim counts instructions; the executed share decides
    on a GPU that has it, the static one elsewhere."""
    sel = _compiled(ctx, "mma-issue")
    rows = sel.rows.set_index("target")
    if "sm_90" not in rows.index or "loop_pipe_tensor" not in rows.columns:
        raise Untestable("the compiled-kernel table lacks the sm_90 build of the FA-2 kernel or its instruction mix")
    static = {}
    for target in [t for t in ("sm_90", "sm_80") if t in rows.index]:
        r = rows.loc[target]
        flop_share = r["loop_tensor_flops"] / (r["loop_tensor_flops"] + r["loop_other_flops"])
        static[target] = (100 * r["loop_mma"] / r["loop_instructions"], 100 * flop_share, r)
    hopper = static["sm_90"][2]
    parts = [
        f"{share:.1f}% on {t} ({r['loop_mma']:.0f} {'wgmma' if t == 'sm_90' else 'mma.sync'} of "
        f"{r['loop_instructions']:.0f} instructions per warp per K/V tile)"
        for t, (share, _, r) in static.items()
    ]
    flops = static["sm_90"][1]
    per_wgmma = hopper["loop_tensor_flops"] / max(hopper["loop_mma"], 1)
    if "sm_80" in static:
        old = static["sm_80"][2]
        per_mma = old["loop_tensor_flops"] / max(old["loop_mma"], 1)
        work = (
            f"one Hopper wgmma does the work of {per_wgmma / per_mma:.0f} mma.sync ({per_wgmma:.0f} against "
            f"{per_mma:.0f} FLOPs per warp)"
        )
    else:
        work = f"one Hopper wgmma does {per_wgmma:.0f} FLOPs per warp, a warpgroup's 64×N×16"
    note = (
        "static SASS of our FA-2 forward's hot loop (one K/V tile of a "
        f"{int(hopper['tile_m'])}×{int(hopper['tile_n'])} tile, d={int(hopper['head_dim'])}); the share of "
        f"instructions decides, as the claim counts instructions. Off the tensor pipe, sm_90: {_pipe_text(hopper)}. "
        f"By floating-point work the tensor pipe does {flops:.1f}% of the loop's, which the sentence may mean: "
        f"{work}, so on Hopper the instruction share falls while the work share stays. Nsight Compute's executed "
        "counts decide on a GPU that has the traffic-inst-mix pass"
    )
    analytic = Verdict(
        judge_part(claim, [share for share, _, _ in static.values()]),
        "; ".join(parts) + f"; {flops:.1f}% of the FLOPs",
        note,
        sel.evidence,
        gpu=ANALYTIC,
        unit="%",
    )
    traffic = ctx.table(TRAFFIC)

    def measured(gpu):
        got = traffic.select(gpu, finished=False, experiment=INST_MIX)
        ok = got.rows[got.rows["status"] == "ok"]
        if ok.empty:
            why = "; ".join(sorted(set(got.rows["message"].astype(str))))[:300]
            raise Untestable(f"Nsight Compute's instruction-mix pass did not finish ({why})")
        tensor = ok["inst_tensor_hmma"].fillna(0)
        if "inst_tensor_gmma" in ok:
            tensor = tensor + ok["inst_tensor_gmma"].fillna(0)
        share = 100 * tensor.sum() / ok["inst_executed"].sum()
        pipes = {c: ok[c].sum() for c in ("inst_fma", "inst_alu", "inst_xu", "inst_lsu", "inst_uniform") if c in ok}
        mix = ", ".join(
            f"{c.removeprefix('inst_')} {100 * v / ok['inst_executed'].sum():.0f}%" for c, v in pipes.items()
        )
        n, d = int(ok["seqlen"].iloc[0]), int(ok["head_dim"].iloc[0])
        return Verdict(
            judge_part(claim, [share]),
            f"{share:.1f}% of executed instructions ({tensor.sum():.3g} tensor of {ok['inst_executed'].sum():.3g})",
            f"Nsight Compute, our FA-2 forward at N={n}, d={d}, the whole kernel (prologue and epilogue included); "
            f"other pipes: {mix}. The static SASS mix beside it: " + "; ".join(parts),
            got.evidence,
            gpu=gpu,
            unit="%",
        )

    # a GPU whose traffic table has no instruction-mix rows (none profiled yet) adds no verdict
    gpus = [
        g
        for g in traffic.frames
        if "experiment" in traffic.frames[g] and (traffic.frames[g]["experiment"] == INST_MIX).any()
    ]
    profiled = Results({g: traffic.frames[g] for g in gpus}, {g: traffic.paths[g] for g in gpus})
    return [analytic, *per_gpu(profiled, measured)]
