"""The report: one self-contained HTML file of the claims audit and, per GPU type, the families' summaries,
figures, failures and checks.

``render`` fills the template and writes the file; ``claims`` turns the audit's verdict rows into what the
report shows of each claim; ``provenance`` says which commits a section's rows were measured at;
``quote_font`` makes the font subset the articles' quoted words are drawn with.
"""

from analysis.report.render import render_report

__all__ = ["render_report"]
