# DRAM traffic per kernel, measured with Nsight Compute (analysis/traffic.py). Measured on every measured
# GPU type unless attention.traffic.enabled is false; enabled: true makes a missing ncu or GPU fail the job.
TRAFFIC = ATT["traffic"]
TRAFFIC_GPUS = [] if TRAFFIC["enabled"] is False else measured_gpus()
TRAFFIC_SPEC = dict(
    {k: v for k, v in TRAFFIC.items() if k != "enabled"},
    require=TRAFFIC["enabled"] is True,
)
# The traffic table and its figures of every such GPU type (requested by the Snakefile's rule all).
TRAFFIC_TARGETS = [f"{RESULTS}/{g}/traffic.csv" for g in TRAFFIC_GPUS] + [
    f"{RESULTS}/report/traffic/{g}" for g in TRAFFIC_GPUS
]


# ---- hbm_traffic: DRAM bytes read and written by every kernel of every point, under Nsight Compute ----
rule hbm_traffic:
    input:
        env=f"{RESULTS}/{{gpu}}/environment.json",
    output:
        csv=f"{RESULTS}/{{gpu}}/traffic.csv",
        raw=directory(f"{RESULTS}/{{gpu}}/traffic_raw"),
    log:
        f"{RESULTS}/logs/{{gpu}}/traffic.log",
    conda:
        "../../envs/kernels.yaml"
    resources:
        gpu=1,
        slurm_partition=gpu_slurm_partition,
        slurm_extra=gpu_slurm_extra,
        constraint=gpu_constraint,
    params:
        spec=TRAFFIC_SPEC,
    script:
        "../scripts/hbm_traffic.py"


# ---- traffic_figures: measured against modelled bytes, and the block-size sweep, for one GPU type ------
rule traffic_figures:
    input:
        table=lambda w: traffic_path(w.gpu),
    output:
        report(
            update(directory(f"{RESULTS}/report/traffic/{{gpu}}")),
            patterns=["{name}.png"],
            caption="../../reports/captions/figure.rst",
            category="HBM traffic",
            subcategory="{gpu}",
            labels={"figure": "{name}"},
        ),
    log:
        f"{RESULTS}/logs/report/{{gpu}}_traffic_figures.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        captions=FIGURE_CAPTIONS,
    script:
        "../scripts/traffic_figures.py"
