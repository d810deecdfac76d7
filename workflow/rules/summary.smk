# ---- summary: a result set's measured summary, generated from its tables (analysis/summary.py) ----------
# {REFERENCE}/{gpu}/summary.md for a shipped set (not in its MANIFEST.json: derived, never published) and
# {RESULTS}/{gpu}/summary.md for a GPU type measured now. Target `summaries` writes every one of them,
# target `readme` the README's measured tables; neither is part of `all`.
SUMMARY_ROOTS = [r for r in (RESULTS, REFERENCE) if r is not None]


def set_tables(root, gpu):
    """The tables (and environment) a result set's summary is made from."""
    if root == RESULTS:
        files = list(tables_of(gpu).values()) if gpu in measured_gpus() else []
    else:
        files = [str(p) for p in sorted(Path(root, gpu).glob("*.csv"))]
    return files + [f"{root}/{gpu}/environment.json"]


def summary_paths():
    return [f"{RESULTS}/{g}/summary.md" for g in measured_gpus()] + [
        f"{REFERENCE}/{g}/summary.md" for g in SHIPPED
    ]


rule summary:
    input:
        lambda w: set_tables(w.root, w.gpu),
    output:
        "{root}/{gpu}/summary.md",
    wildcard_constraints:
        root=_alternatives(SUMMARY_ROOTS),
    log:
        f"{RESULTS}/logs/summary/{{root}}/{{gpu}}.log",
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
