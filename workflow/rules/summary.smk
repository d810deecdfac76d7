# ---- summary: a result set's measured summary, generated from its tables (analysis/summary.py) ----------
# {REFERENCE}/{gpu}/summary.md for a shipped set (not in its MANIFEST.json: derived, never published) and
# {RESULTS}/{gpu}/summary.md for a GPU type measured now. Target `summaries` writes every one of them,
# target `readme` the README's measured tables; neither is part of `all`.
rule summary:
    input:
        lambda w: set_tables(w.root, w.gpu),
    output:
        "{root}/{gpu}/summary.md",
    log:
        f"{RESULTS}/logs/summary/{{root}}/{{gpu}}.log",
    wildcard_constraints:
        root=_alternatives(SUMMARY_ROOTS),
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/summary.py"


rule summaries:
    input:
        summary_paths(),


rule readme:
    input:
        summary_paths(),
    log:
        f"{RESULTS}/logs/summary/readme.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        readme=f"{workflow.basedir}/README.md",
    script:
        "../scripts/readme.py"
