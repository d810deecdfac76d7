"""The traffic family: the DRAM bytes attention kernels move, measured per kernel with Nsight Compute, against
the byte models of ``analysis.core.models``."""

from analysis.core.family import Family

FAMILY = Family(
    name="traffic",
    package=__name__,
    title="HBM traffic",
    sections=(("traffic", "HBM traffic"),),
    minutes=180,  # every point under ncu, which replays each kernel many times: the longest GPU job
)
