# ---- environment: what GPU, driver and software a result set was measured with ------------------------
rule environment:
    output:
        f"{RESULTS}/{{gpu}}/environment.json",
    log:
        f"{RESULTS}/logs/{{gpu}}/environment.log",
    conda:
        "../../envs/kernels.yaml"
    resources:
        gpu=1,
    script:
        "../scripts/environment.py"
