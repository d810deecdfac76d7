"""What the report shows of the FP8 rows beside the figures: a point's shape, as the attention family's."""

from analysis.families.attention.report import shape

__all__ = ["shape"]
