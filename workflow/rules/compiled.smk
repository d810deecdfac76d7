# Compiled-kernel facts (analysis/experiments/compiled.py): registers, spills and SASS instruction counts of
# the FA-3 kernel's schedules and of FA-2 for sm_90 and sm_80, compiled on the CPU (no GPU needed).
COMPILED = config["compiled"]
COMPILED_TABLE = f"{RESULTS}/compiled/kernels.csv" if COMPILED["enabled"] else None


# ---- compiled_kernels: every kernel variant of the `compiled` config section, compiled and read -----
rule compiled_kernels:
    output:
        f"{RESULTS}/compiled/kernels.csv",
    log:
        f"{RESULTS}/logs/compiled/kernels.log",
    conda:
        "../../envs/kernels.yaml"
    threads: COMPILED["workers"]
    params:
        section=COMPILED,
    script:
        "../scripts/compiled_kernels.py"
