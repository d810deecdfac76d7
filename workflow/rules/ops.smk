# Operator experiments: W4A16 / W8A16 linear layers and MoE layers (analysis/experiments/quant.py, moe.py),
# one GPU job per shard of the config's quant: and moe: sections (analysis/experiments/ops_grid.py).
# Without a GPU nothing is measured: the report and the audit use shipped results where there are some.
# OPS_SHARDS, ops_path() and ops_gpus() are defined in common.smk.


# ---- ops_benchmark: one shard of the W4A16 or MoE grid, timed on the GPU ----------------------------------
rule ops_benchmark:
    input:
        env=f"{RESULTS}/{{gpu}}/environment.json",
    output:
        f"{RESULTS}/{{gpu}}/ops/{{opshard}}.csv",
    log:
        f"{RESULTS}/logs/{{gpu}}/ops/{{opshard}}.log",
    wildcard_constraints:
        opshard=_alternatives(OPS_SHARDS),
    conda:
        "../../envs/kernels.yaml"
    resources:
        gpu=1,
        slurm_partition=gpu_slurm_partition,
        slurm_extra=gpu_slurm_extra,
        constraint=gpu_constraint,
    params:
        spec=lambda w: OPS_SHARDS[w.opshard],
    script:
        "../scripts/ops_benchmark.py"


# ---- ops_collect: one table of every W4A16 and MoE row measured on a GPU ----------------------------------
rule ops_collect:
    input:
        lambda w: expand(
            f"{RESULTS}/{w.gpu}/ops/{{opshard}}.csv", opshard=sorted(OPS_SHARDS)
        ),
    output:
        update(f"{RESULTS}/{{gpu}}/ops.csv"),
    log:
        f"{RESULTS}/logs/{{gpu}}/ops_collect.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/ops_collect.py"


# ---- ops_figures: W4A16 speed-up and bandwidth against M, MoE time split and baselines, for one GPU type ---
rule ops_figures:
    input:
        table=lambda w: ops_path(w.gpu),
    output:
        report(
            update(directory(f"{RESULTS}/report/ops/{{gpu}}")),
            patterns=["{name}.png"],
            caption="../../reports/captions/figure.rst",
            category="W4A16 and MoE",
            subcategory="{gpu}",
            labels={"figure": "{name}"},
        ),
    log:
        f"{RESULTS}/logs/report/{{gpu}}_ops_figures.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        captions=FIGURE_CAPTIONS,
    script:
        "../scripts/ops_figures.py"
