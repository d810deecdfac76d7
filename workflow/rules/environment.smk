# ---- environment: what GPU, driver and software a result set was measured with ------------------------
# environment.json: GPU, driver, CUDA, cuDNN, torch, Triton, commit; packages.txt: every Python package.
rule environment:
    output:
        env=f"{RESULTS}/{{gpu}}/environment.json",
        packages=f"{RESULTS}/{{gpu}}/packages.txt",
    log:
        f"{RESULTS}/logs/{{gpu}}/environment.log",
    conda:
        "../../envs/kernels.yaml"
    resources:
        gpu=1,
        slurm_partition=gpu_slurm_partition,
        slurm_extra=gpu_slurm_extra,
        constraint=gpu_constraint,
    script:
        "../scripts/environment.py"
