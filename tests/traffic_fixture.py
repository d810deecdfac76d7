"""Fixtures of the traffic family's tests: an environment, ncu's CSV of a profiled run and the sidecar its
target wrote."""

from __future__ import annotations

B, H = 1, 16
N, D = 1024, 64
ENV = {
    "gpu_name": "NVIDIA H200",
    "gpu": "h200",
    "driver": "580.1",
    "cuda": "13.0",
    "torch": "2.11.0",
    "triton": "3.6.0",
    "git_sha": "abc1234",
    "python": "3.12.3",
}
L2 = 50 * 2**20
OURS_CFG = "BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3"

HEADER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
    '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
)
GEMM = "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
SOFTMAX = (
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::Half, float, c10::Half, "
    "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(T4 *, const T2 *, int)"
)
FLASH = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false>>(Flash_fwd_params)"


def _metric_lines(kid: int, name: str, read: tuple[str, str], write: tuple[str, str], time: tuple[str, str]):
    pre = f'"{kid}","41877","python3.12","127.0.0.1","{name}","1","7","(128, 1, 1)","(8, 16, 1)","0","9.0",'
    sec = '"Command line profiler metrics",'
    return [
        pre + sec + f'"dram__bytes_read.sum","{read[0]}","{read[1]}"',
        pre + sec + f'"dram__bytes_write.sum","{write[0]}","{write[1]}"',
        pre + sec + f'"gpu__time_duration.sum","{time[0]}","{time[1]}"',
    ]


def _marker(kid: int):
    return _metric_lines(kid, "_traffic_point_marker", ("byte", "0"), ("byte", "32"), ("nsecond", "2,208"))


# Points of the fixture, in the order the target ran them: naive (three kernels), sdpa-flash (one), sdpa-cudnn
# (refused before its marker), ours (one), naive at a larger N (out of memory after its marker and one kernel).
SIDECAR = {
    "device": "NVIDIA H200",
    "l2_cache_bytes": L2,
    "points": [
        {"experiment": "traffic-scaling", "impl": "naive", "seqlen": N, "marked": True, "status": "ok"},
        {"experiment": "traffic-scaling", "impl": "sdpa-flash", "seqlen": N, "marked": True, "status": "ok"},
        {
            "experiment": "traffic-scaling",
            "impl": "sdpa-cudnn",
            "seqlen": N,
            "marked": False,
            "status": "unsupported",
            "message": "RuntimeError: No available kernel. Aborting execution.",
        },
        {
            "experiment": "traffic-scaling",
            "impl": "ours-fa2",
            "seqlen": N,
            "marked": True,
            "status": "ok",
            "kernel_config": OURS_CFG,
        },
        {
            "experiment": "traffic-scaling",
            "impl": "naive",
            "seqlen": 65536,
            "marked": True,
            "status": "oom",
            "message": "OutOfMemoryError: CUDA out of memory.",
        },
    ],
}
for _p in SIDECAR["points"]:
    _p.update(dtype="float16", batch=B, heads=H, head_dim=D, causal=False, config=None)
    _p.setdefault("message", "")
    _p.setdefault("kernel_config", "")

NCU_CSV = "\n".join(
    [
        "==PROF== Connected to process 41877 (/usr/bin/python3.12)",
        '==PROF== Profiling "_traffic_point_marker" - 0: 0%....50%....100% - 1 pass',
        f'==PROF== Profiling "{GEMM}" - 1: 0%....50%....100% - 1 pass',
        "some line the profiled program printed, with, commas",
        "==PROF== Disconnected from process 41877",
        HEADER,
        *_marker(0),
        *_metric_lines(1, GEMM, ("Mbyte", "4.19"), ("Mbyte", "33.55"), ("usecond", "12.35")),
        *_metric_lines(2, SOFTMAX, ("Mbyte", "33.55"), ("byte", "33,554,432"), ("usecond", "20.10")),
        *_metric_lines(3, GEMM, ("Kbyte", "35,651.58"), ("Mbyte", "2.10"), ("msecond", "0.01")),
        *_marker(4),
        *_metric_lines(5, FLASH, ("Mbyte", "6.29"), ("Mbyte", "2.10"), ("usecond", "9.50")),
        *_marker(6),
        *_metric_lines(7, "_attn_fwd_kernel", ("Mbyte", "6.30"), ("Mbyte", "2.16"), ("usecond", "8.00")),
        *_marker(8),
        *_metric_lines(9, GEMM, ("Gbyte", "1.07"), ("Gbyte", "8.59"), ("msecond", "1.50")),
    ]
)
