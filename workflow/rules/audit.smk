# ---- audit: every claim of the registry judged against the models and each GPU's measured table -------
rule audit:
    input:
        registry="analysis/claims/registry.yaml",
        specs="analysis/core/gpu_specs.yaml",
        tables=lambda w: [table_path(g) for g in report_gpus()],
        traffic=lambda w: [traffic_path(g) for g in traffic_gpus()],
        ops=lambda w: [ops_path(g) for g in ops_gpus()],
        compiled=[COMPILED_TABLE] if COMPILED_TABLE else [],
    output:
        update(f"{RESULTS}/audit/verdicts.csv"),
    log:
        f"{RESULTS}/logs/audit/audit.log",
    conda:
        "../../envs/kernels.yaml"
    params:
        tables=lambda w: {g: table_path(g) for g in report_gpus()},
        traffic=lambda w: {g: traffic_path(g) for g in traffic_gpus()},
        ops=lambda w: {g: ops_path(g) for g in ops_gpus()},
        compiled=lambda w, input: input.compiled[0] if input.compiled else None,
    script:
        "../scripts/audit.py"
