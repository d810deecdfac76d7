"""GPU specification table: hand-checked peaks and ridge points, lookups, sources, and the validator."""

from __future__ import annotations

import copy
import math

import pytest
import yaml

from analysis.core import gpus
from analysis.core.gpus import (
    DEFAULT_PATH,
    FIELD_GROUPS,
    GPUSpec,
    SpecError,
    as_frame,
    load_specs,
    peak_tflops,
    ridge_point,
    spec,
)
from analysis.core.provenance import gpu_slug

REQUIRED_PRODUCTS = {
    # product -> the raw NVML name it reports (or a slug/alias that names it)
    "A100 SXM4 40GB": "NVIDIA A100-SXM4-40GB",
    "A100 SXM4 80GB": "NVIDIA A100-SXM4-80GB",
    "A100 PCIe 40GB": "NVIDIA A100-PCIE-40GB",
    "A100 PCIe 80GB": "a100-pcie-80gb",
    "H100 SXM5 80GB": "NVIDIA H100 80GB HBM3",
    "H100 PCIe 80GB": "NVIDIA H100 PCIe",
    "H200 SXM 141GB": "NVIDIA H200",
    "L40S": "NVIDIA L40S",
    "L4": "NVIDIA L4",
    "GeForce RTX 4090": "NVIDIA GeForce RTX 4090",
    "A10": "NVIDIA A10",
}


@pytest.fixture(scope="module")
def specs() -> dict[str, GPUSpec]:
    return load_specs()


@pytest.fixture
def raw_doc() -> dict:
    with open(DEFAULT_PATH, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _write(tmp_path, doc) -> str:
    path = tmp_path / "specs.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return str(path)


def _one_entry(raw_doc, slug="h200") -> dict:
    entry = next(g for g in raw_doc["gpus"] if g["slug"] == slug)
    return {"schema_version": raw_doc["schema_version"], "gpus": [copy.deepcopy(entry)]}


# --------------------------------------------------------------------------- hand-checked values


def test_a100_80gb_sxm_ridge_point_is_the_articles_knee():
    a100 = spec("a100-sxm4-80gb")
    assert a100.fp16_tflops == 312 and a100.hbm_tbps == 2.039
    assert ridge_point(a100, "fp16") == pytest.approx(312 / 2.039)
    assert ridge_point(a100) == pytest.approx(153.0, abs=0.1)


def test_h100_sxm_dense_fp16_peak():
    assert peak_tflops("h100-80gb-hbm3", "fp16") == pytest.approx(989, abs=1)
    assert peak_tflops("h100-sxm", "bf16") == pytest.approx(989, abs=1)
    assert peak_tflops("h100-sxm", "fp8") == pytest.approx(1979, abs=1)


def test_h200_anchors_and_ridge_point():
    h200 = spec("NVIDIA H200")
    assert h200.hbm_tbps == 4.8 and h200.sm_count == 132
    assert peak_tflops(h200, "bf16") == pytest.approx(989, abs=1)
    assert peak_tflops(h200, "fp8") == pytest.approx(1979, abs=1)
    assert ridge_point(h200, "fp16") == pytest.approx(989.4 / 4.8)
    assert ridge_point(h200) == pytest.approx(206, abs=0.5)
    assert ridge_point(h200, "fp8") == pytest.approx(2 * ridge_point(h200), rel=1e-3)


def test_a100_bandwidth_differs_by_memory_and_form_factor():
    assert spec("a100-sxm4-40gb").hbm_tbps == 1.555
    assert spec("a100-pcie-40gb").hbm_tbps == 1.555
    assert spec("a100-80gb-pcie").hbm_tbps == 1.935
    assert spec("a100-sxm4-80gb").hbm_tbps == 2.039


@pytest.mark.parametrize("slug", ["a100-sxm4-40gb", "a100-sxm4-80gb", "a100-pcie-40gb", "a100-80gb-pcie", "a10"])
def test_ampere_has_no_fp8(slug):
    gpu = spec(slug)
    assert gpu.fp8_tflops is None and not gpu.has_fp8
    with pytest.raises(ValueError, match="fp8"):
        ridge_point(gpu, "fp8")
    with pytest.raises(ValueError, match="fp8"):
        peak_tflops(slug, "fp8")


def test_unsupported_dtype_is_a_value_error():
    with pytest.raises(ValueError, match="unsupported dtype"):
        ridge_point("h200", "fp4")


def test_dtype_spellings():
    assert peak_tflops("h200", "torch.bfloat16") == peak_tflops("h200", "bf16")
    assert peak_tflops("h200", "float32") == peak_tflops("h200", "fp32")


def test_geforce_uses_fp32_accumulate_rate():
    rtx = spec("rtx-4090")
    assert rtx.fp16_tflops == pytest.approx(165.2)  # FP16-accumulate rate would be 330.3
    assert any("FP32 accumulate" in note for note in rtx.notes)


# --------------------------------------------------------------------------- lookups


@pytest.mark.parametrize(
    "name, slug",
    [
        ("NVIDIA H100 80GB HBM3", "h100-80gb-hbm3"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA A10", "a10"),
        ("h100-sxm5-80gb", "h100-80gb-hbm3"),  # alias
        ("H100-SXM", "h100-80gb-hbm3"),  # alias, any case
        ("a100-pcie-80gb", "a100-80gb-pcie"),  # alias
    ],
)
def test_lookup_by_nvml_name_slug_or_alias(name, slug):
    assert spec(name).slug == slug
    assert spec(slug) is spec(name)


def test_unknown_gpu_raises_key_error_listing_known_slugs():
    with pytest.raises(KeyError) as excinfo:
        spec("NVIDIA B200")
    message = str(excinfo.value)
    assert "NVIDIA B200" in message
    for slug in ("h200", "a100-sxm4-80gb", "rtx-4090"):
        assert slug in message
    with pytest.raises(KeyError, match="known slugs"):
        spec("")


# --------------------------------------------------------------------------- the table itself


def test_every_required_product_is_present(specs):
    found = {spec(name).slug for name in REQUIRED_PRODUCTS.values()}
    assert len(found) == len(REQUIRED_PRODUCTS)
    assert found <= set(specs)


def test_slugs_and_aliases_are_normalised_and_unique(specs):
    seen = set()
    for gpu in specs.values():
        for key in (gpu.slug, *gpu.aliases):
            assert gpu_slug(key) == key
            assert key not in seen
            seen.add(key)


def test_every_entry_cites_a_source_for_every_field_group(specs):
    for gpu in specs.values():
        assert set(FIELD_GROUPS) <= set(gpu.sources), gpu.slug
        for group in FIELD_GROUPS:
            assert len(gpu.sources[group].strip()) > 20, (gpu.slug, group)


def test_every_citation_says_whether_it_was_checked(specs):
    # A citation either records the check made (or the measurement) or says it was not verified, and
    # an entry with an unverified figure carries the caveat in its notes.
    for gpu in specs.values():
        unverified = []
        for group, text in gpu.sources.items():
            checked = "Checked here" in text or "Measured" in text
            unchecked = "not verified here" in text.lower()
            assert checked or unchecked, (gpu.slug, group)
            if unchecked:
                unverified.append(group)
        if unverified:
            assert any("not re-verified here" in note for note in gpu.notes), (gpu.slug, unverified)


def test_dense_figures_are_consistent(specs):
    for gpu in specs.values():
        assert gpu.bf16_tflops == pytest.approx(gpu.fp16_tflops, rel=0.005)
        assert gpu.tf32_tflops == pytest.approx(gpu.fp16_tflops / 2, rel=0.05)
        if gpu.has_fp8:
            assert gpu.fp8_tflops == pytest.approx(2 * gpu.fp16_tflops, rel=0.02)
        assert gpu.fp32_tflops < gpu.fp16_tflops
        assert gpu.smem_per_sm_kib == {"8.0": 164, "8.6": 100, "8.9": 100, "9.0": 228}[gpu.compute_capability]


def test_as_frame_has_one_row_per_gpu(specs):
    frame = as_frame()
    assert len(frame) == len(specs)
    assert list(frame["slug"]) == list(specs)
    for col in ("slug", "name", "fp16_tflops", "bf16_tflops", "fp8_tflops", "tf32_tflops", "fp32_tflops"):
        assert col in frame.columns
    for col in ("hbm_tbps", "memory_gb", "sm_count", "smem_per_sm_kib", "l2_mib", "int8_tops"):
        assert col in frame.columns
    row = frame.set_index("slug").loc["a100-sxm4-80gb"]
    assert math.isnan(row["fp8_tflops"])
    assert row["fp16_tflops"] / row["hbm_tbps"] == pytest.approx(153.0, abs=0.1)


def test_known_slugs_match_the_table(specs):
    assert gpus.known_slugs() == list(specs)


# --------------------------------------------------------------------------- the validator


def test_valid_single_entry_loads(tmp_path, raw_doc):
    loaded = load_specs(_write(tmp_path, _one_entry(raw_doc)))
    assert list(loaded) == ["h200"]


def test_validator_rejects_a_sparse_figure(tmp_path, raw_doc):
    doc = _one_entry(raw_doc)
    doc["gpus"][0]["fp16_tflops"] = 1979  # the datasheet's sparse figure, copied by mistake
    doc["gpus"][0]["bf16_tflops"] = 1979
    with pytest.raises(SpecError, match="fp8_is_2x_fp16"):
        load_specs(_write(tmp_path, doc))


@pytest.mark.parametrize(
    "mutate, match",
    [
        pytest.param(lambda e: e.pop("hbm_tbps"), "missing field", id="missing-field"),
        pytest.param(lambda e: e.update(hbm_tbps=-4.8), "hbm_tbps must be a positive number", id="negative"),
        pytest.param(lambda e: e.update(sm_count=0), "sm_count must be a positive integer", id="zero-sms"),
        pytest.param(lambda e: e.update(bf16_tflops=500.0), "bf16_equals_fp16", id="bf16-ne-fp16"),
        pytest.param(lambda e: e.update(tf32_tflops=989.4), "tf32_is_half_fp16", id="sparse-tf32"),
        pytest.param(lambda e: e["sources"].pop("memory"), "no citation for field group 'memory'", id="no-source"),
        pytest.param(lambda e: e.update(fp8_tflops=None), "fp8_tflops is null", id="hopper-without-fp8"),
        pytest.param(lambda e: e.update(smem_per_sm_kib=164), "smem_per_sm_kib", id="wrong-smem"),
        pytest.param(lambda e: e.update(slug="NVIDIA H200"), "normalised form", id="raw-slug"),
        pytest.param(lambda e: e.update(hmb_tbps=4.8), "unknown field", id="typo-field"),
        pytest.param(lambda e: e.update(compute_capability=9.0), "compute_capability", id="cc-not-string"),
        pytest.param(lambda e: e.update(exempt_checks={"no_such_check": "x"}), "unknown check", id="bad-exempt"),
    ],
)
def test_validator_rejects_broken_entries(tmp_path, raw_doc, mutate, match):
    doc = _one_entry(raw_doc)
    mutate(doc["gpus"][0])
    with pytest.raises(SpecError, match=match):
        load_specs(_write(tmp_path, doc))


def test_validator_rejects_duplicate_alias(tmp_path, raw_doc):
    doc = _one_entry(raw_doc)
    twin = copy.deepcopy(doc["gpus"][0])
    twin["slug"] = "h200-twin"
    twin["aliases"] = ["h200-sxm"]
    doc["gpus"].append(twin)
    with pytest.raises(SpecError, match="names both"):
        load_specs(_write(tmp_path, doc))


def test_validator_honours_an_explicit_exemption(tmp_path, raw_doc):
    doc = _one_entry(raw_doc)
    entry = doc["gpus"][0]
    entry["fp8_tflops"] = 2 * entry["fp16_tflops"] * 1.10  # 10 % off the 2x rule
    with pytest.raises(SpecError, match="fp8_is_2x_fp16"):
        load_specs(_write(tmp_path, doc))
    exemption = {"fp8_is_2x_fp16": "datasheet prints FP8 at a different clock (test fixture)"}
    entry["exempt_checks"] = dict(exemption)
    loaded = load_specs(_write(tmp_path, doc))
    assert loaded["h200"].exempt_checks == exemption
    entry["exempt_checks"] = {"fp8_is_2x_fp16": "  "}
    with pytest.raises(SpecError, match="needs the reason"):
        load_specs(_write(tmp_path, doc))
