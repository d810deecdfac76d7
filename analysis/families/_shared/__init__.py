"""What families share, below them all: no family imports another family's modules, and whatever two of them
use lives here (or, when it is not about kernels at all, in ``analysis.core``). Not a family: the registry
(``analysis.registry``) lists families by name, and this package is none of them.

- the attention-like families (attention and FP8, whose rows share the attention table; traffic profiles the
  same kernels): ``fa3_ablation`` (FA-3's switches and how they are named), ``attention_plan`` (implementation
  names, the ``AttentionSpec`` a shard of [B, H, N, d] points is, shard names, the cost model; torch-free),
  ``attention_measure`` (the implementations' callables, the correctness gates, one point measured: measured
  code), ``attention_plots`` (the attention table's figure helpers) and ``attention_report`` (a row's shape in
  words, for the report);
- the operator-like families (W4A16 and MoE, whose rows share the operator table ``ops.csv``):
  ``operator_plan`` (the cost model's rates, the timing fields), ``operator_rows`` (one row of a point:
  measured code), ``operator_plots`` (the figure helpers and the table's palette) and ``operator_claims``
  (a verdict per GPU with an operator table).
"""
