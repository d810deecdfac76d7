"""The compiled family: registers, spills and SASS instruction counts of kernel variants (FA-3's schedules,
FA-2 for sm_90 and sm_80), compiled on the CPU; GPU-independent."""

from analysis.core.family import Family

FAMILY = Family(name="compiled", package=__name__, title="Compiled kernels", scope="machine")
