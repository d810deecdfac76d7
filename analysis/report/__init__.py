"""The report: one self-contained HTML file of the claims audit and, per GPU type, the families' summaries,
figures, failures and checks.

``render`` fills the template and writes the file; ``claims`` turns the audit's verdict rows into what the
report shows of each claim; ``provenance`` says which commits a section's rows were measured at and where each
GPU type's numbers come from; ``quote_math`` holds the articles' math as MathML and ``quote_font`` makes the
font subsets the quoted words and their math are drawn with.
"""

__all__ = ["render_report"]


def __getattr__(name: str):
    # imported on first use, so that ``python -m analysis.report.<module>`` does not import its module twice
    if name == "render_report":
        from analysis.report.render import render_report

        return render_report
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
