# Every family's jobs (analysis/families/<family>/): one benchmark job per shard and GPU type, a table per GPU
# type collected from them, the CPU's interpreter checks, and the GPU-independent families' jobs.
# SHARDS, MACHINE, CHECKS and the table paths are defined in common.smk.


# ---- benchmark: one shard of a family, measured on a GPU of its type --------------------------------------
rule benchmark:
    input:
        env=f"{RESULTS}/{{gpu}}/environment.json",
    output:
        f"{RESULTS}/{{gpu}}/{{family}}/{{shard}}.csv",
    log:
        job=f"{RESULTS}/logs/{{gpu}}/{{family}}/{{shard}}.log",
        files=directory(f"{RESULTS}/logs/{{gpu}}/{{family}}/{{shard}}"),
    conda:
        "../../envs/kernels.yaml"
    resources:
        gpu=1,
        runtime=lambda w: FAMILIES[w.family].minutes,
        slurm_partition=gpu_slurm_partition,
        slurm_extra=gpu_slurm_extra,
        constraint=gpu_constraint,
    params:
        spec=lambda w: SHARDS[w.family][w.shard],
    script:
        "../scripts/benchmark.py"


# ---- collect: one table of a GPU type from the shards of the families that share it -----------------------
rule collect:
    input:
        lambda w: shard_paths(w.gpu, w.table),
    output:
        update(f"{RESULTS}/{{gpu}}/{{table}}.csv"),
    log:
        f"{RESULTS}/logs/{{gpu}}/{{table}}_collect.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/collect.py"


# ---- interpreter_check: a family's kernel in Triton's interpreter on the CPU (correctness, no timing) -----
rule interpreter_check:
    output:
        f"{RESULTS}/{CPU_SLUG}/checks/{{check}}.csv",
    log:
        f"{RESULTS}/logs/{CPU_SLUG}/checks/{{check}}.log",
    conda:
        "../../envs/kernels.yaml"
    threads: 1
    params:
        family=lambda w: CHECKS[w.check][0],
        spec=lambda w: CHECKS[w.check][1],
    script:
        "../scripts/check.py"


# ---- checks_collect: one table of every interpreter check ---------------------------------------------
rule checks_collect:
    input:
        expand(f"{RESULTS}/{CPU_SLUG}/checks/{{check}}.csv", check=sorted(CHECKS)),
    output:
        update(f"{RESULTS}/{CPU_SLUG}/checks.csv"),
    log:
        f"{RESULTS}/logs/{CPU_SLUG}/checks_collect.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        table=CHECKS_TABLE,
    script:
        "../scripts/collect.py"


# ---- machine: a GPU-independent family's job, once per run on this machine (compiled kernels) ----------
rule machine:
    output:
        f"{RESULTS}/{{family}}/{{shard}}.csv",
    log:
        f"{RESULTS}/logs/{{family}}/{{shard}}.log",
    conda:
        "../../envs/kernels.yaml"
    threads: lambda w: MACHINE[w.family][w.shard].get("workers", 1)
    params:
        spec=lambda w: MACHINE[w.family][w.shard],
    script:
        "../scripts/machine.py"
