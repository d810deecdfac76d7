"""What the pipeline reads back is validated, what it writes is written whole, and what it is told to read
exists: the tables against their schemas, JSON files, the shipped result sets, atomic outputs (the config:
tests/analysis/test_configuration.py).

Each bad input of issue 20 is made here from a good file, and must fail with the file, line and column named
(nothing dropped, nothing passed on): a shard truncated mid-row, a row with status "banana", an ok row whose
error is 300× its bound, random bytes, a corrupted environment.json or verdicts.csv, a truncated shipped
ops.csv, a missing reference folder, an unknown config key, seqlens and seqlen_k of different lengths.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from audit_helpers import judge

from analysis import audit, pipeline, registry
from analysis.core import outputs, plotting, shipped, validate
from analysis.core.family import Figure

ROOT = Path(__file__).resolve().parents[2]
ATTENTION, OPS, TRAFFIC = (registry.table(t) for t in ("attention", "ops", "traffic"))
SHIPPED = ROOT / "reports" / "reference" / "h200"


def _copy(tmp_path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copy(SHIPPED / name, dst)
    return dst


# ---------------------------------------------------------------------------------------------------
# Tables against their schemas
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["attention", "ops", "traffic"])
def test_the_shipped_tables_are_valid(name):
    df = registry.table(name).read_rows([SHIPPED / f"{name}.csv"])
    assert len(df) == len(pd.read_csv(SHIPPED / f"{name}.csv"))


def test_a_table_truncated_mid_row_is_named(tmp_path):
    """Two rows vanished and a blank 'B=? H=? N=?' row appeared in the report; now collect fails."""
    path = _copy(tmp_path, "attention.csv")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        validate.DataError,
        match=r"attention.csv, line \d+: (\d+ fields where the header has \d+|"
        r"malformed CSV)",
    ):
        ATTENTION.read_rows([path])


def test_an_unknown_status_is_named(tmp_path):
    path = _copy(tmp_path, "attention.csv")
    df = pd.read_csv(path)
    df.loc[3, "status"] = "banana"
    df.to_csv(path, index=False)
    with pytest.raises(validate.DataError, match=r"attention.csv, line 5, column 'status': 'banana' is not one of"):
        ATTENTION.read_rows([path])


def test_an_ok_row_over_its_bound_is_named(tmp_path):
    """An error of 0.9 against a bound of 0.0034 with status ok was shown as such."""
    path = _copy(tmp_path, "ops.csv")
    df = pd.read_csv(path)
    row = df.index[(df["status"] == "ok") & df["err_bound"].notna()][0]
    df.loc[row, "max_abs_err"] = 0.9
    df.to_csv(path, index=False)
    with pytest.raises(
        validate.DataError,
        match=rf"ops.csv, line {row + 2}, column 'max_abs_err': status ok, but the "
        r"error 0.9 exceeds its bound err_bound",
    ):
        OPS.read_rows([path])


def test_random_bytes_name_the_file(tmp_path):
    path = tmp_path / "shard.csv"
    path.write_bytes(b"experiment,impl\n" + bytes(range(128, 256)) * 4)
    with pytest.raises(validate.DataError, match=r"shard.csv, line 2: not UTF-8 text"):
        ATTENTION.read_rows([path])


@pytest.mark.parametrize(
    "column, value, why",
    [
        ("ms_median", "-1.0", "not above 0"),
        ("batch", "2.5", "not an integer"),
        ("causal", "maybe", "not True or False"),
        ("dtype", "float8", "not one of"),
        ("tflops", "fast", "not a number"),
        ("pad_waste", "1.5", "above the maximum 1"),
        ("heads", "", "empty, but the column needs a value"),
    ],
)
def test_cells_are_checked_against_their_column(tmp_path, column, value, why):
    path = _copy(tmp_path, "attention.csv")
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    df.loc[0, column] = value
    df.to_csv(path, index=False)
    with pytest.raises(validate.DataError, match=rf"line 2, column '{column}': .* is {why}"):
        ATTENTION.read_rows([path])


def test_row_rules(tmp_path):
    path = _copy(tmp_path, "attention.csv")
    df = pd.read_csv(path)
    timed = df.index[(df["status"] == "ok") & df["timed"]][0]
    df.loc[timed, "ms_p20"] = df.loc[timed, "ms_median"] * 2
    failed = df.index[df["status"] != "ok"][0]
    df.loc[failed, "message"] = ""
    df.to_csv(path, index=False)
    with pytest.raises(validate.DataError) as info:
        ATTENTION.read_rows([path])
    assert f"line {timed + 2}, column 'ms_median': percentiles out of order" in str(info.value)
    status = df.loc[failed, "status"]
    assert f"line {failed + 2}, column 'message': status {status} without a message" in str(info.value)


SPREAD = ["spread_rounds", "ms_round_min", "ms_round_max"]  # the repeat rounds' columns (harness, step 6)


def test_repeat_rounds_are_read_typed_and_in_order(tmp_path):
    """A row with repeat rounds reads them typed; a lowest round median above the highest is an error."""
    path = _copy(tmp_path, "attention.csv")
    df = pd.read_csv(path)
    timed = df.index[(df["status"] == "ok") & df["timed"]][:2]
    df.loc[timed, SPREAD] = [[3, 0.9, 1.1], [3, 1.2, 1.1]]
    df.to_csv(path, index=False)
    with pytest.raises(validate.DataError) as info:
        ATTENTION.read_rows([path])
    assert f"line {timed[1] + 2}, column 'ms_round_min': repeat rounds out of order" in str(info.value)
    assert f"line {timed[0] + 2}," not in str(info.value)
    df.loc[timed[1], "ms_round_min"] = 1.0
    df.to_csv(path, index=False)
    read = ATTENTION.read_rows([path])
    assert read.loc[timed, "spread_rounds"].tolist() == [3, 3] and read["spread_rounds"].isna().sum() == len(df) - 2


def test_a_missing_optional_column_is_filled_and_documented(tmp_path):
    """host_ms and the repeat rounds' columns came after the first shipped tables: a table written before them
    lacks the columns and reads with them empty; they are the schema's only unrequired ops columns."""
    schema = OPS.schema
    assert set(schema["properties"]) - set(schema["required"]) == set(OPS.optional) == {"host_ms", *SPREAD}
    old = tmp_path / "ops.csv"
    pd.read_csv(SHIPPED / "ops.csv").drop(columns=["host_ms", *SPREAD], errors="ignore").to_csv(old, index=False)
    read = OPS.read_rows([old])
    assert list(read.columns) == list(OPS.read_rows([SHIPPED / "ops.csv"]).columns)
    assert read[["host_ms", *SPREAD]].isna().all().all()
    assert str(read["spread_rounds"].dtype) == "Int64" and read["ms_round_min"].dtype == float
    att = ATTENTION.schema
    assert set(att["properties"]) - set(att["required"]) == set(ATTENTION.optional)
    assert "host_ms" in ATTENTION.columns and "host_ms" in OPS.columns
    df = ATTENTION.read_rows([SHIPPED / "attention.csv"])
    assert set(SPREAD) <= set(ATTENTION.optional) and df[SPREAD].isna().all().all()  # shipped before them
    # rows measured before the column existed read empty; those measured since carry it where they were timed
    assert df["host_ms"].isna().any()
    timed = df[df["host_ms"].notna()]
    assert (timed["status"] == "ok").all() and (timed["host_ms"] > 0).all() and timed["ms_median"].notna().all()


def test_every_schema_property_is_described():
    schemas = {name: t.schema for name, t in registry.tables().items()}
    schemas.update(
        result=validate.load_schema("result.schema.yaml"), verdicts=validate.load_schema("verdicts.schema.yaml")
    )
    for name, schema in schemas.items():
        assert all(p.get("description") for p in schema["properties"].values()), name
        assert set(schema.get("required", ())) <= set(schema["properties"]), name


# ---------------------------------------------------------------------------------------------------
# JSON files and the verdicts
# ---------------------------------------------------------------------------------------------------


def test_a_corrupted_environment_is_named(tmp_path):
    path = _copy(tmp_path, "environment.json")
    path.write_text(path.read_text()[:40])
    with pytest.raises(validate.DataError, match=r"environment.json, line \d+: not valid JSON"):
        validate.read_environment(path)
    path.write_text(json.dumps({"gpu": "h200"}))
    with pytest.raises(validate.DataError, match="key 'gpu_name' is missing"):
        validate.read_environment(path)
    path.write_text((SHIPPED / "environment.json").read_text())
    with pytest.raises(validate.DataError, match="the environment of GPU type 'a100'"):
        validate.read_environment(path, "a100")
    assert validate.read_environment(path, "h200")["gpu_name"] == "NVIDIA H200"


def _verdicts(tmp_path) -> Path:
    ctx = pipeline.read_context({"attention": {"h200": SHIPPED / "attention.csv"}})
    claims = {c.id: c for c in audit.load_claims(registry.evaluators(), registry.claim_documents())}
    df = judge([claims[i] for i in ("fp8-2pf", "std-flops", "flashinfer")], ctx)
    path = tmp_path / "verdicts.csv"
    outputs.write_csv(df, path)
    return path


def test_verdicts_are_validated(tmp_path):
    path = _verdicts(tmp_path)
    good = validate.read_csv(path, "verdicts.schema.yaml", keep_default_na=False)
    assert list(good.columns) == audit.COLUMNS and good["borderline"].dtype == bool
    assert good.loc[2, "band"] == "" and good.loc[2, "figure"] == ""  # empty strings stay strings
    df = pd.read_csv(path, keep_default_na=False)
    df.loc[0, "verdict"] = "mostly"
    assert df.loc[2, "claim_id"] == "std-flops" and df.loc[2, "band"] == ""
    df.loc[2, "borderline"] = True  # an analytic verdict, without a band
    df.to_csv(path, index=False)
    with pytest.raises(validate.DataError) as info:
        validate.read_csv(path, "verdicts.schema.yaml")
    assert "line 2, column 'verdict': 'mostly' is not one of" in str(info.value)
    assert "line 4, column 'borderline': borderline is True but the band is ''" in str(info.value)


def test_a_figure_manifest_naming_a_missing_figure_is_named(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps([{"name": "x", "caption": "x.rst", "png": "gone.png"}]))
    with pytest.raises(validate.DataError, match="entry 0 .x. names png 'gone.png', which does not exist"):
        validate.read_figure_manifest(tmp_path / "manifest.json")


# ---------------------------------------------------------------------------------------------------
# The shipped result sets
# ---------------------------------------------------------------------------------------------------


def test_the_shipped_sets_verify():
    assert shipped.verified_gpus(ROOT / "reports" / "reference") == ["h200"]
    assert shipped.verified_gpus(None) == []


def _shipped_copy(tmp_path) -> Path:
    root = tmp_path / "reference"
    shutil.copytree(SHIPPED, root / "h200")
    return root


def test_a_truncated_shipped_table_stops_the_run(tmp_path):
    """A truncated ops.csv (cut at a row boundary, so valid CSV) flipped two verdicts silently."""
    root = _shipped_copy(tmp_path)
    ops = root / "h200" / "ops.csv"
    lines = ops.read_text().splitlines(keepends=True)
    ops.write_text("".join(lines[: len(lines) // 2]))
    with pytest.raises(shipped.ShippedSetError, match=r"h200: ops.csv differs from the file that was published"):
        shipped.verified_gpus(root)


def test_missing_or_partial_sets_are_named(tmp_path):
    with pytest.raises(shipped.ShippedSetError, match="is not a folder.*reference_dir: null"):
        shipped.verified_gpus(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(shipped.ShippedSetError, match="holds no result set"):
        shipped.verified_gpus(tmp_path / "empty")
    root = _shipped_copy(tmp_path)
    (root / "h200" / "environment.json").unlink()
    with pytest.raises(shipped.ShippedSetError, match="environment.json is listed in MANIFEST.json but missing"):
        shipped.verified_gpus(root)
    (root / "h200" / "MANIFEST.json").unlink()
    with pytest.raises(shipped.ShippedSetError, match="no MANIFEST.json"):
        shipped.verified_gpus(root)


# ---------------------------------------------------------------------------------------------------
# Atomic outputs
# ---------------------------------------------------------------------------------------------------


def test_a_failed_write_leaves_the_last_file(tmp_path, monkeypatch):
    path = tmp_path / "report.html"
    outputs.write_text(path, "good")

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(Path, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        outputs.write_text(path, "half")
    monkeypatch.undo()
    assert path.read_text() == "good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # no temporary file left


def _render(out, figures: dict) -> list[dict]:
    captions = {
        "one": "analysis/families/w4a16/captions/w4a16_speedup.rst",
        "two": "analysis/families/moe/captions/moe_layer.rst",
    }
    return plotting.render_all(pd.DataFrame(), out, {n: Figure(f) for n, f in figures.items()}, captions.get)


def test_a_figure_that_fails_leaves_the_last_folder(tmp_path):
    def fine(df, png):
        Path(png).write_bytes(b"png")
        return pd.DataFrame({"a": [1]})

    def broken(df, png):
        raise RuntimeError("matplotlib fell over")

    out = tmp_path / "figs"
    _render(out, {"one": fine})
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(RuntimeError, match="fell over"):
        _render(out, {"one": fine, "two": broken})
    assert sorted(p.name for p in out.iterdir()) == before == ["manifest.json", "one.csv", "one.png"]
    assert [p.name for p in tmp_path.iterdir()] == ["figs"]  # the half-built folder is gone


def test_render_all_swaps_in_the_new_folder_whole(tmp_path):
    from analysis.core.plotting import NoDataError

    def drawn(df, png):
        Path(png).write_bytes(b"png")
        return pd.DataFrame({"a": [1]})

    def empty(df, png):
        raise NoDataError("nothing to draw")

    out = tmp_path / "figs"
    _render(out, {"one": drawn})
    entries = _render(out, {"one": empty})
    assert entries[0]["reason"] == "nothing to draw"
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"]  # no figure of the earlier run survives
    assert validate.read_figure_manifest(out / "manifest.json")[0]["png"] is None
