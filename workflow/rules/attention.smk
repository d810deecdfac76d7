# ---- attention_benchmark: one shard of the attention grid, timed on the GPU ---------------------------
rule attention_benchmark:
    input:
        env=f"{RESULTS}/{{gpu}}/environment.json",
    output:
        f"{RESULTS}/{{gpu}}/attention/{{shard}}.csv",
    log:
        f"{RESULTS}/logs/{{gpu}}/attention/{{shard}}.log",
    conda:
        "../../envs/kernels.yaml"
    resources:
        gpu=1,
        slurm_partition=gpu_slurm_partition,
        slurm_extra=gpu_slurm_extra,
        constraint=gpu_constraint,
    params:
        spec=lambda w: ATTENTION_SHARDS[w.shard],
    script:
        "../scripts/attention_benchmark.py"


# ---- attention_collect: one table of every attention row measured on a GPU ----------------------------
rule attention_collect:
    input:
        lambda w: expand(
            f"{RESULTS}/{w.gpu}/attention/{{shard}}.csv",
            shard=sorted(ATTENTION_SHARDS),
        ),
    output:
        update(f"{RESULTS}/{{gpu}}/attention.csv"),
    log:
        f"{RESULTS}/logs/{{gpu}}/attention_collect.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/collect.py"


# ---- interpreter_check: the kernel's output in Triton's interpreter on the CPU (no timing) -------------
rule interpreter_check:
    output:
        f"{RESULTS}/{CPU_SLUG}/checks/{{check}}.csv",
    log:
        f"{RESULTS}/logs/{CPU_SLUG}/checks/{{check}}.log",
    conda:
        "../../envs/kernels.yaml"
    threads: 1
    params:
        spec=lambda w: CHECK_SHARDS[w.check],
    script:
        "../scripts/interpreter_check.py"


# ---- checks_collect: one table of every interpreter check ---------------------------------------------
rule checks_collect:
    input:
        expand(f"{RESULTS}/{CPU_SLUG}/checks/{{check}}.csv", check=sorted(CHECK_SHARDS)),
    output:
        update(f"{RESULTS}/{CPU_SLUG}/checks.csv"),
    log:
        f"{RESULTS}/logs/{CPU_SLUG}/checks_collect.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/collect.py"
