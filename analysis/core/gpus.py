"""GPU specification table: datasheet peaks, memory bandwidth and on-chip sizes, each with its source.

The data live in ``gpu_specs.yaml`` next to this module (one entry per product, keyed by the slug of
the name NVML reports, the same key the workflow uses for a GPU type). :func:`load_specs` reads and
validates the table; :func:`spec` looks a GPU up by slug, alias or raw NVML name; :func:`peak_tflops`
and :func:`ridge_point` give the numbers the analytic (roofline) models need; :func:`as_frame` gives
the table for the report.

Every tensor-core figure is a DENSE peak (datasheets print the 2:4-sparsity figure with an asterisk;
the dense one is half of it), fp16/bf16 with FP32 accumulate. The loader checks the published sets
against each other (bf16 == fp16, fp8 == 2 x fp16, tf32 == fp16 / 2) so that a sparse figure copied by
mistake is caught; a real datasheet that breaks a check must be exempted in the data, with its reason.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path

import yaml

from analysis.core.provenance import gpu_slug

DEFAULT_PATH = Path(__file__).with_name("gpu_specs.yaml")
SCHEMA_VERSION = 1

# dtype -> the GPUSpec field holding its dense peak (TFLOP/s)
DTYPE_FIELDS = {
    "fp16": "fp16_tflops",
    "bf16": "bf16_tflops",
    "fp8": "fp8_tflops",
    "tf32": "tf32_tflops",
    "fp32": "fp32_tflops",
}
DTYPE_ALIASES = {
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
    "tensorfloat32": "tf32",
    "float32": "fp32",
    "float": "fp32",
}

# Field groups that need a citation in ``sources`` (the numeric ones, plus the compute capability).
FIELD_GROUPS: dict[str, tuple[str, ...]] = {
    "tensor": ("fp16_tflops", "bf16_tflops", "fp8_tflops", "tf32_tflops", "int8_tops"),
    "fp32": ("fp32_tflops",),
    "memory": ("hbm_tbps", "memory_gb"),
    "sm_count": ("sm_count",),
    "l2": ("l2_mib",),
    "smem": ("smem_per_sm_kib",),
    "compute_capability": ("compute_capability",),
}
NUMERIC_FIELD_GROUPS = tuple(g for g in FIELD_GROUPS if g != "compute_capability")

# Consistency checks on the dense figures: name -> (numerator, denominator, expected ratio, rel. tolerance)
DENSE_CHECKS: dict[str, tuple[str, str, float, float]] = {
    "bf16_equals_fp16": ("bf16_tflops", "fp16_tflops", 1.0, 0.005),
    "fp8_is_2x_fp16": ("fp8_tflops", "fp16_tflops", 2.0, 0.02),
    "tf32_is_half_fp16": ("tf32_tflops", "fp16_tflops", 0.5, 0.05),
}

# Largest shared-memory carve-out per SM (KiB) by compute capability (CUDA C++ Programming Guide,
# architecture tuning guides). Used to cross-check each entry's smem_per_sm_kib.
SMEM_PER_SM_KIB_BY_CC = {"8.0": 164, "8.6": 100, "8.9": 100, "9.0": 228}
FIRST_FP8_CC = (8, 9)  # FP8 tensor cores arrive with Ada (8.9) and Hopper (9.0)


class SpecError(ValueError):
    """The specification table (or one entry of it) is malformed or implausible."""


@dataclass(frozen=True)
class GPUSpec:
    """One GPU product. Peaks are dense, in TFLOP/s (int8 in TOP/s); bandwidth in TB/s (10^12 B/s)."""

    slug: str
    name: str
    architecture: str
    compute_capability: str
    fp16_tflops: float
    bf16_tflops: float
    fp8_tflops: float | None
    tf32_tflops: float
    fp32_tflops: float
    hbm_tbps: float
    memory_gb: float
    memory_type: str
    sm_count: int
    smem_per_sm_kib: int
    l2_mib: float
    int8_tops: float | None = None
    aliases: tuple[str, ...] = ()
    sources: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    exempt_checks: dict = field(default_factory=dict)

    @property
    def cc(self) -> tuple[int, int]:
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)

    @property
    def has_fp8(self) -> bool:
        return self.fp8_tflops is not None


REQUIRED_FIELDS = (
    "slug",
    "name",
    "architecture",
    "compute_capability",
    "fp16_tflops",
    "bf16_tflops",
    "fp8_tflops",  # required key, may be null
    "tf32_tflops",
    "fp32_tflops",
    "hbm_tbps",
    "memory_gb",
    "memory_type",
    "sm_count",
    "smem_per_sm_kib",
    "l2_mib",
    "sources",
)
NULLABLE_FIELDS = ("fp8_tflops", "int8_tops")
POSITIVE_NUMBER_FIELDS = (
    "fp16_tflops",
    "bf16_tflops",
    "fp8_tflops",
    "tf32_tflops",
    "fp32_tflops",
    "int8_tops",
    "hbm_tbps",
    "memory_gb",
    "l2_mib",
)
POSITIVE_INT_FIELDS = ("sm_count", "smem_per_sm_kib")
NUMERIC_FIELDS = POSITIVE_NUMBER_FIELDS + POSITIVE_INT_FIELDS
KNOWN_FIELDS = frozenset(f.name for f in fields(GPUSpec))


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _entry_to_spec(raw, where: str) -> GPUSpec:
    """Validate one YAML entry and build its GPUSpec; raise SpecError naming the entry and the problem."""
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: an entry must be a mapping, got {type(raw).__name__}")
    label = f"{where} ({raw.get('slug', '?')})"
    problems: list[str] = []

    missing = [k for k in REQUIRED_FIELDS if k not in raw]
    if missing:
        problems.append(f"missing field(s): {', '.join(missing)}")
    unknown = sorted(set(raw) - KNOWN_FIELDS)
    if unknown:
        problems.append(f"unknown field(s): {', '.join(unknown)}")
    if problems:
        raise SpecError(f"{label}: " + "; ".join(problems))

    for key in ("slug", "name", "architecture", "memory_type"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            problems.append(f"{key} must be a non-empty string")
    slug = raw["slug"]
    if isinstance(slug, str) and slug.strip():
        try:
            normal = gpu_slug(slug)
        except ValueError:
            normal = None
        if normal != slug:
            problems.append(f"slug {slug!r} is not in normalised form (gpu_slug gives {normal!r})")

    cc = raw["compute_capability"]
    if not isinstance(cc, str) or not re.fullmatch(r"\d+\.\d+", cc):
        problems.append(f"compute_capability must be a string like '9.0', got {cc!r}")
        cc = None

    for key in POSITIVE_NUMBER_FIELDS:
        value = raw.get(key)
        if value is None:
            if key not in NULLABLE_FIELDS:
                problems.append(f"{key} must not be null")
            continue
        if not _is_number(value) or value <= 0:
            problems.append(f"{key} must be a positive number, got {value!r}")
    for key in POSITIVE_INT_FIELDS:
        value = raw.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            problems.append(f"{key} must be a positive integer, got {value!r}")

    aliases = raw.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        problems.append("aliases must be a list of strings")
        aliases = []
    for alias in aliases:
        try:
            normal = gpu_slug(alias)
        except ValueError:
            normal = None
        if normal != alias:
            problems.append(f"alias {alias!r} is not in normalised form (gpu_slug gives {normal!r})")

    notes = raw.get("notes") or []
    if not isinstance(notes, list) or not all(isinstance(n, str) and n.strip() for n in notes):
        problems.append("notes must be a list of non-empty strings")
        notes = []

    sources = raw["sources"]
    if not isinstance(sources, Mapping):
        problems.append("sources must be a mapping from field group to citation")
        sources = {}
    else:
        for group in FIELD_GROUPS:
            citation = sources.get(group)
            if not isinstance(citation, str) or not citation.strip():
                problems.append(f"sources has no citation for field group {group!r}")
        extra = sorted(set(sources) - set(FIELD_GROUPS))
        if extra:
            problems.append(f"sources has unknown field group(s): {', '.join(map(str, extra))}")

    exempt = raw.get("exempt_checks") or {}
    if not isinstance(exempt, Mapping):
        problems.append("exempt_checks must be a mapping from check name to reason")
        exempt = {}
    for check, reason in exempt.items():
        if check not in DENSE_CHECKS:
            problems.append(f"exempt_checks names unknown check {check!r} (known: {', '.join(DENSE_CHECKS)})")
        if not isinstance(reason, str) or not reason.strip():
            problems.append(f"exempt_checks[{check!r}] needs the reason (the datasheet caveat) as text")

    if problems:
        raise SpecError(f"{label}: " + "; ".join(problems))

    # Plausibility of the dense figures (catches a sparse figure copied by mistake).
    for check, (num_key, den_key, expected, tol) in DENSE_CHECKS.items():
        num, den = raw.get(num_key), raw[den_key]
        if num is None or check in exempt:
            continue
        ratio = num / den
        if abs(ratio - expected) > tol * expected:
            problems.append(
                f"{check}: {num_key}/{den_key} = {num}/{den} = {ratio:.4f}, expected {expected} within "
                f"{tol:.1%} (dense figures? if the datasheet really says so, exempt the check with a reason)"
            )

    major, minor = (int(x) for x in cc.split("."))
    if (major, minor) < FIRST_FP8_CC and raw["fp8_tflops"] is not None:
        problems.append(f"fp8_tflops given for compute capability {cc}, which has no FP8 tensor cores")
    if (major, minor) >= FIRST_FP8_CC and raw["fp8_tflops"] is None:
        problems.append(f"fp8_tflops is null but compute capability {cc} has FP8 tensor cores")
    expected_smem = SMEM_PER_SM_KIB_BY_CC.get(cc)
    if expected_smem is not None and raw["smem_per_sm_kib"] != expected_smem:
        problems.append(
            f"smem_per_sm_kib = {raw['smem_per_sm_kib']} but compute capability {cc} allows {expected_smem} KiB per SM"
        )
    if raw["fp32_tflops"] > raw["fp16_tflops"] * 1.01:
        problems.append("fp32_tflops (non-tensor) exceeds the fp16 tensor-core peak")

    if problems:
        raise SpecError(f"{label}: " + "; ".join(problems))

    values = {k: raw[k] for k in KNOWN_FIELDS if k in raw}
    values["aliases"] = tuple(aliases)
    values["sources"] = dict(sources)
    values["notes"] = list(notes)
    values["exempt_checks"] = dict(exempt)
    for key in POSITIVE_NUMBER_FIELDS:
        if values.get(key) is not None:
            values[key] = float(values[key])
    return GPUSpec(**values)


def load_specs(path: str | Path | None = None) -> dict[str, GPUSpec]:
    """Read and validate a specification table; return ``{slug: GPUSpec}`` in file order.

    Raises SpecError (a ValueError) for a malformed table, an entry missing a field or a source, a
    non-positive number, an implausible set of dense figures, or a slug/alias used twice.
    """
    path = Path(path) if path is not None else DEFAULT_PATH
    with open(path, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    if not isinstance(doc, Mapping) or not isinstance(doc.get("gpus"), list) or not doc["gpus"]:
        raise SpecError(f"{path}: expected a mapping with a non-empty 'gpus' list")
    version = doc.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise SpecError(f"{path}: schema_version {version!r}, this loader reads {SCHEMA_VERSION}")

    specs: dict[str, GPUSpec] = {}
    owner: dict[str, str] = {}  # slug or alias -> owning slug
    for i, raw in enumerate(doc["gpus"]):
        gpu = _entry_to_spec(raw, f"{path.name}: gpus[{i}]")
        for key in (gpu.slug, *gpu.aliases):
            if key in owner:
                raise SpecError(f"{path.name}: {key!r} names both {owner[key]!r} and {gpu.slug!r}")
            owner[key] = gpu.slug
        specs[gpu.slug] = gpu
    return specs


@lru_cache(maxsize=1)
def _default_specs() -> dict[str, GPUSpec]:
    return load_specs()


@lru_cache(maxsize=1)
def _default_index() -> dict[str, str]:
    index = {}
    for gpu in _default_specs().values():
        for key in (gpu.slug, *gpu.aliases):
            index[key] = gpu.slug
    return index


def known_slugs() -> list[str]:
    """The slugs of the shipped table, in file order."""
    return list(_default_specs())


def spec(slug_or_name: str) -> GPUSpec:
    """The shipped spec for a slug, an alias, or a raw NVML name (``NVIDIA H100 80GB HBM3``).

    Raises KeyError, listing the known slugs, when nothing matches.
    """
    if isinstance(slug_or_name, GPUSpec):
        return slug_or_name
    specs, index = _default_specs(), _default_index()
    text = str(slug_or_name).strip()
    candidates = [text, text.lower()]
    try:
        candidates.append(gpu_slug(text))
    except ValueError:
        pass
    for key in candidates:
        if key in index:
            return specs[index[key]]
    raise KeyError(
        f"unknown GPU {slug_or_name!r}; known slugs: {', '.join(specs)} "
        f"(aliases: {', '.join(k for k, v in index.items() if k != v)})"
    )


def _resolve(gpu: GPUSpec | str) -> GPUSpec:
    return gpu if isinstance(gpu, GPUSpec) else spec(gpu)


def _dtype_key(dtype) -> str:
    text = str(dtype).lower().removeprefix("torch.").strip()
    key = DTYPE_ALIASES.get(text, text)
    if key not in DTYPE_FIELDS:
        raise ValueError(f"unsupported dtype {dtype!r}; expected one of {', '.join(DTYPE_FIELDS)}")
    return key


def peak_tflops(gpu: GPUSpec | str, dtype: str) -> float:
    """Dense peak in TFLOP/s for ``dtype`` (fp16, bf16, fp8, tf32: tensor cores; fp32: CUDA cores).

    Raises ValueError for an unknown dtype or one this GPU has no peak for (fp8 on Ampere).
    """
    gpu = _resolve(gpu)
    key = _dtype_key(dtype)
    value = getattr(gpu, DTYPE_FIELDS[key])
    if value is None:
        raise ValueError(f"{gpu.slug} ({gpu.architecture}) has no {key} tensor-core peak")
    return float(value)


def ridge_point(gpu: GPUSpec | str, dtype: str = "fp16") -> float:
    """Roofline ridge point in FLOP per byte of DRAM traffic: peak FLOP/s over bandwidth (B/s)."""
    gpu = _resolve(gpu)
    return peak_tflops(gpu, dtype) * 1e12 / (gpu.hbm_tbps * 1e12)


FRAME_COLUMNS = ("slug", "name") + tuple(f.name for f in fields(GPUSpec) if f.name in NUMERIC_FIELDS)


def as_frame(path: str | Path | None = None):
    """The table as a pandas DataFrame: one row per GPU, columns slug, name and the numeric fields."""
    import pandas as pd

    specs = _default_specs() if path is None else load_specs(path)
    rows = [{col: getattr(gpu, col) for col in FRAME_COLUMNS} for gpu in specs.values()]
    frame = pd.DataFrame(rows, columns=list(FRAME_COLUMNS))
    for col in ("fp8_tflops", "int8_tops"):
        frame[col] = frame[col].astype(float)  # None -> NaN
    return frame
