"""What the report shows of the FP8 rows beside the figures: a point's shape, as for every row of the attention
table (``analysis.families._shared.attention_report``)."""

from analysis.families._shared import attention_report

shape = attention_report.shape
