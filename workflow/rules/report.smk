# ---- figures: every figure (and the table behind it) for one GPU type ---------------------------------
rule figures:
    input:
        table=lambda w: table_path(w.gpu),
    output:
        report(
            update(directory(f"{RESULTS}/report/{{gpu}}")),
            patterns=["{name}.png"],
            caption="../../reports/captions/figure.rst",
            category="Attention",
            subcategory="{gpu}",
            labels={"figure": "{name}"},
        ),
    log:
        f"{RESULTS}/logs/report/{{gpu}}_figures.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        captions=FIGURE_CAPTIONS,
    script:
        "../scripts/figures.py"


# ---- compare_gpus: the GPU types side by side (only when the report holds several) ---------------------
rule compare_gpus:
    input:
        tables=lambda w: [table_path(g) for g in report_gpus()],
    output:
        update(directory(f"{RESULTS}/report/compare")),
    log:
        f"{RESULTS}/logs/report/compare_gpus.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        tables=lambda w: {g: table_path(g) for g in report_gpus()},
    script:
        "../scripts/compare_gpus.py"


# ---- report: the self-contained HTML report over every GPU type and the interpreter checks ------------
rule report:
    input:
        figures=lambda w: [f"{RESULTS}/report/{g}" for g in report_gpus()],
        tables=lambda w: [table_path(g) for g in report_gpus()],
        environments=lambda w: [environment_path(g) for g in report_gpus()],
        checks=lambda w: [checks_path()] if checks_path() else [],
        verdicts=f"{RESULTS}/audit/verdicts.csv",
        traffic_figures=lambda w: [
            f"{RESULTS}/report/traffic/{g}" for g in traffic_gpus()
        ],
        comparison=lambda w: [comparison_dir()] if comparison_dir() else [],
        ops_figures=lambda w: [f"{RESULTS}/report/ops/{g}" for g in ops_gpus()],
        ops_tables=lambda w: [ops_path(g) for g in ops_gpus()],
    output:
        update(config["report"]),
    log:
        f"{RESULTS}/logs/report/report.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        gpus=lambda w: [
            dict(
                slug=g,
                source=source_text(g),
                table=table_path(g),
                environment=environment_path(g),
                figures_dir=f"{RESULTS}/report/{g}",
                traffic_figures_dir=(
                    f"{RESULTS}/report/traffic/{g}" if g in traffic_gpus() else None
                ),
                ops_figures_dir=(
                    f"{RESULTS}/report/ops/{g}" if g in ops_gpus() else None
                ),
                ops_table=ops_path(g),
            )
            for g in report_gpus()
        ],
        checks=lambda w: checks_path(),
        comparison=lambda w: comparison_dir(),
        notices=lambda w: report_notices(),
    script:
        "../scripts/report.py"
