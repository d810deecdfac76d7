# ---- figures: every figure of a family (and the table behind each) for one GPU type ---------------------
rule figures:
    input:
        table=lambda w: table_path(w.gpu, FAMILIES[w.family].table),
    output:
        report(
            update(directory(f"{RESULTS}/report/{{gpu}}/{{family}}")),
            patterns=["{name}.png"],
            caption="../../reports/captions/figure.rst",
            category=lambda w: FAMILIES[w.family].title,
            subcategory="{gpu}",
            labels={"figure": "{name}"},
        ),
    log:
        f"{RESULTS}/logs/report/{{gpu}}_{{family}}_figures.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        captions=FIGURE_CAPTIONS,
    script:
        "../scripts/figures.py"


# ---- compare_gpus: a family's figures over the GPU types side by side (when the report holds several) -----
rule compare_gpus:
    input:
        tables=lambda w: [
            table_path(g, FAMILIES[w.family].table)
            for g in report_gpus()
            if table_path(g, FAMILIES[w.family].table)
        ],
    output:
        update(directory(f"{RESULTS}/report/compare/{{family}}")),
    log:
        f"{RESULTS}/logs/report/compare_{{family}}.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        tables=lambda w: {
            g: table_path(g, FAMILIES[w.family].table)
            for g in report_gpus()
            if table_path(g, FAMILIES[w.family].table)
        },
    script:
        "../scripts/compare_gpus.py"


# ---- report: the self-contained HTML report over every GPU type and the interpreter checks ------------
rule report:
    input:
        figures=lambda w: [d for g in report_gpus() for d in figure_dirs(g)],
        tables=lambda w: [p for g in report_gpus() for p in tables_of(g).values()],
        environments=lambda w: [environment_path(g) for g in report_gpus()],
        checks=[f"{RESULTS}/{CPU_SLUG}/checks.csv"] if CHECKS else [],
        verdicts=f"{RESULTS}/audit/verdicts.csv",
        comparison=lambda w: [
            f"{RESULTS}/report/compare/{f}" for f in comparison_families()
        ],
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
                environment=environment_path(g),
                tables=tables_of(g),
                figures=figure_dirs(g),
            )
            for g in report_gpus()
        ],
        checks=lambda w, input: input.checks[0] if input.checks else None,
        comparison=lambda w: [
            f"{RESULTS}/report/compare/{f}" for f in comparison_families()
        ],
        notices=lambda w: report_notices(),
    script:
        "../scripts/report.py"
