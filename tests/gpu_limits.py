"""Hardware limits the tests compare compiled kernels with (as Triton reports them), in one place."""

HOPPER_SMEM_PER_BLOCK = 232448  # bytes of shared memory per block that Triton reports for an H100/H200
