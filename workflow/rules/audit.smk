# ---- audit: every claim judged against the models and every table of every GPU type in the report --------
rule audit:
    input:
        registry="analysis/audit/registry.yaml",
        specs="analysis/core/gpu_specs.yaml",
        tables=lambda w: [
            p for files in audit_tables().values() for p in files.values()
        ],
    output:
        update(f"{RESULTS}/audit/verdicts.csv"),
    log:
        f"{RESULTS}/logs/audit/audit.log",
    conda:
        "../../envs/kernels.yaml"
    params:
        tables=lambda w: audit_tables(),
    script:
        "../scripts/audit.py"
