"""Measurement and analysis: timing harness, FLOP model, provenance, experiments, tables, figures, report."""
