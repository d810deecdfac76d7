"""One shard of the attention grid: what it measures (``Spec``) and which experiments, implementations
and modes exist. Kept free of torch and Triton so that the workflow can plan its jobs without importing
them; ``analysis.experiments.attention`` measures a Spec.
"""

from __future__ import annotations

import dataclasses
import re

# Dense attention on [B, H, N, d] tensors: every experiment may compare these.
DENSE_IMPLS = ("ours-fa2", "ours-fa1", "naive", "sdpa-math", "sdpa-efficient", "sdpa-flash", "sdpa-cudnn")
DECODE_IMPLS = ("ours-decode", "ours-decode-unsplit", "copy-kv")
VARLEN_IMPLS = ("ours-varlen", "ours-fa2-padded", "sdpa-efficient-padded")
# FP8 attention (kernels/attention/fp8.py): ours-fp8-<granularity>[-rot][-p1][-triton][-e2e]: the scales'
# granularity ("none": cast without scaling), -rot: incoherent processing (Q and K rotated before
# quantising), -p1: P cast to e4m3 without its scale of 256, -triton: the portable Triton kernel (else the
# FA-3 kernel on Hopper, the Triton one elsewhere), -e2e: fp8.attention on the 16-bit inputs, quantisation
# timed with the kernel (else inputs quantised before timing, FlashAttention-3's convention). fp8-mm /
# bf16-mm: this run's GEMM ceilings (torch._scaled_mm in e4m3, torch.matmul in bf16, 8192³), measured once
# per fp8-speed shard.
FP8_GRANULARITIES = ("none", "tensor", "head", "block")
_FP8_BASE = tuple(f"ours-fp8-{g}{rot}" for g in FP8_GRANULARITIES for rot in ("", "-rot")) + ("ours-fp8-block-p1",)
FP8_IMPLS = tuple(f"{base}{kernel}{e2e}" for base in _FP8_BASE for kernel in ("", "-triton") for e2e in ("", "-e2e"))
CEILING_IMPLS = ("fp8-mm", "bf16-mm")
# FlashAttention-3 (kernels/attention/fa3.py, Gluon, sm_90): ours-fa3 is its full schedule; ours-fa3-<name>
# the same kernel with one technique switched off (the names of fa3.SCHEDULES; a test keeps them equal).
FA3_ABLATIONS = ("no-warp-specialize", "no-pingpong", "no-overlap", "no-tma")
FA3_IMPLS = ("ours-fa3",) + tuple(f"ours-fa3-{a}" for a in FA3_ABLATIONS)
IMPLS = DENSE_IMPLS + ("ours-fa2-eager",) + DECODE_IMPLS + VARLEN_IMPLS + FP8_IMPLS + CEILING_IMPLS + FA3_IMPLS
# Which implementations each experiment can run, and in which modes.
EXPERIMENT_IMPLS = {
    "fa2-setting": ("ours-fa3",) + DENSE_IMPLS,
    "fa1-setting": DENSE_IMPLS,
    "gain-surface": DENSE_IMPLS,
    "block-sweep": ("ours-fa2",),
    "rescale-ablation": ("ours-fa2", "ours-fa2-eager"),
    "memory": DENSE_IMPLS,
    "decode": DECODE_IMPLS + DENSE_IMPLS,
    "varlen": VARLEN_IMPLS,
    "fp8-speed": FP8_IMPLS + ("ours-fa3",) + DENSE_IMPLS + CEILING_IMPLS,
    "fp8-accuracy": FP8_IMPLS + DENSE_IMPLS,
    "fa3-ablation": FA3_IMPLS + ("ours-fa2", "sdpa-cudnn"),
    "interpreter-check": DENSE_IMPLS,
}
# The input distributions of fp8-accuracy: N(0,1); FlashAttention-3's outlier setting, N(0,1) plus N(0,100)
# on a 0.1% Bernoulli mask; large, V times 1000 (past e4m3's ±448 without scales); small, Q, K, V times
# 1/1000 (below e4m3's smallest normal, 2⁻⁶, without scales).
INPUTS = ("normal", "outliers", "large", "small")
EXPERIMENTS = tuple(EXPERIMENT_IMPLS)
MODES = ("fwd", "bwd", "fwd+bwd")
FORWARD_ONLY = ("block-sweep", "rescale-ablation", "decode", "interpreter-check", "fp8-speed", "fp8-accuracy",
                "fa3-ablation")  # fmt: skip
DTYPE_NAMES = ("float16", "bfloat16", "float32")
# The harness's defaults (analysis.harness.DEFAULT_WARMUP_MS / DEFAULT_REP_MS; a test keeps them equal).
DEFAULT_WARMUP_MS = 25
DEFAULT_REP_MS = 100
# The form FA2Config prints and parses (kernels/attention/fa2.py), checked here without importing Triton.
CONFIG_PATTERN = re.compile(r"^BLOCK_M=\d+,BLOCK_N=\d+,num_warps=\d+,num_stages=\d+$")


def _check_tiles(text: str) -> None:
    """The rule FA2Config (kernels/attention/fa2.py) enforces when it is made, checked here without Triton:
    BLOCK_M and BLOCK_N powers of two >= 16, num_warps a power of two, num_stages >= 1."""
    fields = {k: int(v) for k, v in (part.split("=") for part in text.split(","))}
    for key in ("BLOCK_M", "BLOCK_N"):
        if fields[key] < 16 or fields[key] & (fields[key] - 1):
            raise ValueError(f"FA-2 config {text!r}: {key} must be a power of two >= 16, got {fields[key]}")
    if fields["num_warps"] < 1 or fields["num_warps"] & (fields["num_warps"] - 1):
        raise ValueError(f"FA-2 config {text!r}: num_warps must be a power of two, got {fields['num_warps']}")
    if fields["num_stages"] < 1:
        raise ValueError(f"FA-2 config {text!r}: num_stages must be >= 1, got {fields['num_stages']}")


@dataclasses.dataclass
class Spec:
    """One shard of the attention grid (see ``workflow/config.yaml`` for what each field means)."""

    experiment: str
    dtype: str
    head_dim: int
    causal: bool
    seqlens: list[int]  # query lengths (varlen: the lengths of the batch's sequences)
    impls: list[str]
    mode: str = "fwd"
    tokens: int = 16384
    hidden: int = 2048
    batch: int = 1
    heads: int = 16
    heads_kv: int | None = None  # K/V heads (default: = heads); fewer is grouped-query attention
    seqlen_k: list[int] | None = None  # key lengths, one per entry of seqlens (default: = seqlens)
    configs: list[str] | None = None  # block-sweep: the FA2Config strings our kernel is pinned to
    check_rows: int = 128
    inputs: str = "normal"  # the input distribution (fp8-accuracy; INPUTS)
    warmup_ms: float = DEFAULT_WARMUP_MS
    rep_ms: float = DEFAULT_REP_MS
    seed: int = 0

    def __post_init__(self):
        if self.experiment not in EXPERIMENTS:
            raise ValueError(f"unknown experiment {self.experiment!r}; known: {EXPERIMENTS}")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"unknown dtype {self.dtype!r}; known: {list(DTYPE_NAMES)}")
        unknown = set(self.impls) - set(IMPLS)
        if unknown:
            raise ValueError(f"unknown implementations {sorted(unknown)}; known: {IMPLS}")
        foreign = [i for i in self.impls if i not in EXPERIMENT_IMPLS[self.experiment]]
        if foreign:
            raise ValueError(
                f"implementations {foreign} do not belong to experiment {self.experiment!r} "
                f"(it runs {list(EXPERIMENT_IMPLS[self.experiment])})"
            )
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; known: {MODES}")
        if self.mode != "fwd" and self.experiment in FORWARD_ONLY:
            raise ValueError(f"experiment {self.experiment!r} measures the forward pass only, got mode {self.mode!r}")
        if self.seqlen_k is not None and len(self.seqlen_k) != len(self.seqlens):
            raise ValueError(
                f"seqlen_k must list one key length per entry of seqlens: {len(self.seqlen_k)} key lengths "
                f"{list(self.seqlen_k)} for {len(self.seqlens)} query lengths {list(self.seqlens)}"
            )
        if self.heads_kv is not None and (self.heads_kv < 1 or self.heads % self.heads_kv):
            raise ValueError(f"heads_kv {self.heads_kv} must divide heads {self.heads}")
        if self.experiment == "block-sweep":
            if not self.configs:
                raise ValueError("block-sweep needs a list of configs")
            for text in self.configs:  # a typo fails when the workflow is planned, not in a GPU job
                if not CONFIG_PATTERN.match(text):
                    raise ValueError(f"cannot parse FA-2 config {text!r}: expected the form {CONFIG_PATTERN.pattern}")
                _check_tiles(text)
        elif self.configs:
            raise ValueError(f"configs apply to block-sweep only, not to {self.experiment!r}")
        if self.inputs not in INPUTS:
            raise ValueError(f"unknown inputs {self.inputs!r}; known: {INPUTS}")
        if self.inputs != "normal" and self.experiment != "fp8-accuracy":
            raise ValueError(f"inputs {self.inputs!r} apply to fp8-accuracy only, not to {self.experiment!r}")
        if self.experiment == "varlen" and (not self.seqlens or min(self.seqlens) < 1):
            raise ValueError("varlen needs at least one sequence, each of length >= 1")

    def shape(self, index: int) -> tuple[int, int, int, int]:
        """(batch, heads, seqlen_q, seqlen_k) of the index-th point."""
        n = self.seqlens[index]
        nk = self.seqlen_k[index] if self.seqlen_k else n
        if self.experiment in ("fa2-setting", "rescale-ablation", "fp8-speed", "fa3-ablation"):
            if self.hidden % self.head_dim:
                raise ValueError(f"hidden {self.hidden} is not a multiple of head_dim {self.head_dim}")
            return max(1, self.tokens // n), self.hidden // self.head_dim, n, nk
        if self.experiment in ("gain-surface", "block-sweep"):
            return max(1, self.tokens // n), self.heads, n, nk
        return self.batch, self.heads, n, nk

    def kv_heads(self, heads: int) -> int:
        return self.heads_kv or heads

    def variants(self) -> list[tuple[str, str | None]]:
        """(implementation, pinned config) of every measurement at one shape."""
        if self.experiment == "block-sweep":
            return [(impl, cfg) for impl in self.impls for cfg in self.configs]
        return [(impl, None) for impl in self.impls]

    def points(self) -> int:
        if self.experiment == "varlen":
            return len(self.impls)
        return len(self.seqlens) * len(self.variants())
