"""What the pipeline reads back is validated, what it writes is written whole, and what it is told to read
exists: the tables against their schemas, JSON files, the shipped result sets, atomic outputs, the config.

Each bad input of issue 20 is made here from a good file, and must fail with the file, line and column named
(nothing dropped, nothing passed on): a shard truncated mid-row, a row with status "banana", an ok row whose
error is 300× its bound, random bytes, a corrupted environment.json or verdicts.csv, a truncated shipped
ops.csv, a missing reference folder, an unknown config key, seqlens and seqlen_k of different lengths.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis import audit, configuration, harness, ops_figures, ops_tables, outputs, reference, tables, validate
from analysis.experiments import grid

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "reports" / "reference" / "h200"
CONFIG = ROOT / "workflow" / "config.yaml"


def _copy(tmp_path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copy(SHIPPED / name, dst)
    return dst


# ---------------------------------------------------------------------------------------------------
# Tables against their schemas
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, reader", [("attention.csv", tables.read_rows), ("ops.csv", ops_tables.read_rows)])
def test_the_shipped_tables_are_valid(name, reader):
    df = reader([SHIPPED / name])
    assert len(df) == len(pd.read_csv(SHIPPED / name))


def test_the_shipped_traffic_table_is_valid():
    from analysis import traffic

    assert len(traffic.read_rows(SHIPPED / "traffic.csv")) == len(pd.read_csv(SHIPPED / "traffic.csv"))


def test_a_table_truncated_mid_row_is_named(tmp_path):
    """Two rows vanished and a blank 'B=? H=? N=?' row appeared in the report; now collect fails."""
    path = _copy(tmp_path, "attention.csv")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(validate.DataError, match=r"attention.csv, line \d+: (\d+ fields where the header has \d+|"
                                                r"malformed CSV)"):  # fmt: skip
        tables.read_rows([path])


def test_an_unknown_status_is_named(tmp_path):
    path = _copy(tmp_path, "attention.csv")
    df = pd.read_csv(path)
    df.loc[3, "status"] = "banana"
    df.to_csv(path, index=False)
    with pytest.raises(validate.DataError, match=r"attention.csv, line 5, column 'status': 'banana' is not one of"):
        tables.read_rows([path])


def test_an_ok_row_over_its_bound_is_named(tmp_path):
    """An error of 0.9 against a bound of 0.0034 with status ok was shown as such."""
    path = _copy(tmp_path, "ops.csv")
    df = pd.read_csv(path)
    row = df.index[(df["status"] == "ok") & df["err_bound"].notna()][0]
    df.loc[row, "max_abs_err"] = 0.9
    df.to_csv(path, index=False)
    with pytest.raises(validate.DataError, match=rf"ops.csv, line {row + 2}, column 'max_abs_err': status ok, but the "
                                                 r"error 0.9 exceeds its bound err_bound"):  # fmt: skip
        ops_tables.read_rows([path])


def test_random_bytes_name_the_file(tmp_path):
    path = tmp_path / "shard.csv"
    path.write_bytes(b"experiment,impl\n" + bytes(range(128, 256)) * 4)
    with pytest.raises(validate.DataError, match=r"shard.csv, line 2: not UTF-8 text"):
        tables.read_rows([path])


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
        tables.read_rows([path])


def test_row_rules(tmp_path):
    path = _copy(tmp_path, "attention.csv")
    df = pd.read_csv(path)
    timed = df.index[(df["status"] == "ok") & df["timed"]][0]
    df.loc[timed, "ms_p20"] = df.loc[timed, "ms_median"] * 2
    failed = df.index[df["status"] != "ok"][0]
    df.loc[failed, "message"] = ""
    df.to_csv(path, index=False)
    with pytest.raises(validate.DataError) as info:
        tables.read_rows([path])
    assert f"line {timed + 2}, column 'ms_median': percentiles out of order" in str(info.value)
    status = df.loc[failed, "status"]
    assert f"line {failed + 2}, column 'message': status {status} without a message" in str(info.value)


def test_a_missing_optional_column_is_filled_and_documented(tmp_path):
    """host_ms came after the first shipped tables: a table written before it lacks the column and reads with
    it empty; it is the schema's only unrequired ops column."""
    schema = validate.load_schema("ops_result.schema.yaml")
    assert set(schema["properties"]) - set(schema["required"]) == set(ops_tables.OPTIONAL) == {"host_ms"}
    old = tmp_path / "ops.csv"
    pd.read_csv(SHIPPED / "ops.csv").drop(columns=["host_ms"], errors="ignore").to_csv(old, index=False)
    read = ops_tables.read_rows([old])
    assert list(read.columns) == list(ops_tables.read_rows([SHIPPED / "ops.csv"]).columns)
    assert read["host_ms"].isna().all()
    att = validate.load_schema("result.schema.yaml")
    assert set(att["properties"]) - set(att["required"]) == set(tables.OPTIONAL)


def test_every_schema_property_is_described():
    for name in ("result", "ops_result", "traffic_result", "verdicts"):
        schema = validate.load_schema(f"{name}.schema.yaml")
        assert all(p.get("description") for p in schema["properties"].values()), name
        assert set(schema["required"]) <= set(schema["properties"]), name


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
    ctx = audit.Context.from_files({"h200": SHIPPED / "attention.csv"})
    registry = {c.id: c for c in audit.load_registry()}
    df = audit.audit([registry[i] for i in ("fp8-2pf", "std-flops", "flashinfer")], ctx)
    path = tmp_path / "verdicts.csv"
    outputs.write_csv(df, path)
    return path


def test_verdicts_are_validated(tmp_path):
    path = _verdicts(tmp_path)
    good = validate.read_csv(path, "verdicts.schema.yaml", keep_default_na=False)
    assert list(good.columns) == audit.COLUMNS and good["borderline"].dtype == bool
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
    assert reference.shipped_gpus(ROOT / "reports" / "reference") == ["h200"]
    assert reference.shipped_gpus(None) == []


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
    with pytest.raises(reference.ReferenceSetError, match=r"h200: ops.csv differs from the file that was published"):
        reference.shipped_gpus(root)


def test_missing_or_partial_sets_are_named(tmp_path):
    with pytest.raises(reference.ReferenceSetError, match="is not a folder.*reference_dir: null"):
        reference.shipped_gpus(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(reference.ReferenceSetError, match="holds no result set"):
        reference.shipped_gpus(tmp_path / "empty")
    root = _shipped_copy(tmp_path)
    (root / "h200" / "environment.json").unlink()
    with pytest.raises(reference.ReferenceSetError, match="environment.json is listed in MANIFEST.json but missing"):
        reference.shipped_gpus(root)
    (root / "h200" / "MANIFEST.json").unlink()
    with pytest.raises(reference.ReferenceSetError, match="no MANIFEST.json"):
        reference.shipped_gpus(root)


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


def test_a_figure_that_fails_leaves_the_last_folder(tmp_path):
    from analysis import figures

    def fine(df, png):
        Path(png).write_bytes(b"png")
        return pd.DataFrame({"a": [1]})

    def broken(df, png):
        raise RuntimeError("matplotlib fell over")

    out = tmp_path / "figs"
    figures.render_all(pd.DataFrame(), out, {"one": (fine, "w4a16_speedup.rst")})
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(RuntimeError, match="fell over"):
        figures.render_all(pd.DataFrame(), out, {"one": (fine, "w4a16_speedup.rst"), "two": (broken, "moe_layer.rst")})
    assert sorted(p.name for p in out.iterdir()) == before == ["manifest.json", "one.csv", "one.png"]
    assert [p.name for p in tmp_path.iterdir()] == ["figs"]  # the half-built folder is gone


def test_render_all_swaps_in_the_new_folder_whole(tmp_path):
    from analysis import figures
    from analysis.figures import NoDataError

    def drawn(df, png):
        Path(png).write_bytes(b"png")
        return pd.DataFrame({"a": [1]})

    def empty(df, png):
        raise NoDataError("nothing to draw")

    out = tmp_path / "figs"
    figures.render_all(pd.DataFrame(), out, {"one": (drawn, "w4a16_speedup.rst")})
    entries = figures.render_all(pd.DataFrame(), out, {"one": (empty, "w4a16_speedup.rst")})
    assert entries[0]["reason"] == "nothing to draw"
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"]  # no figure of the earlier run survives
    assert validate.read_figure_manifest(out / "manifest.json")[0]["png"] is None


# ---------------------------------------------------------------------------------------------------
# The configuration
# ---------------------------------------------------------------------------------------------------


def _config(**sections) -> dict:
    cfg = yaml.safe_load(CONFIG.read_text())
    for key, value in sections.items():
        cfg[key] = value
    return cfg


SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"


def test_an_unknown_key_is_one_line():
    """Snakemake's validate printed 2,279 lines of schema for an unknown top-level key."""
    with pytest.raises(configuration.ConfigError) as info:
        configuration.validate_config(_config(results_dri="x"), SCHEMA)
    message = str(info.value)
    assert "\n" not in message and len(message) < 300
    unexpected = "Additional properties are not allowed ('results_dri' was unexpected)"
    assert message == f"Error validating config: config: {unexpected}"


def test_nested_problems_name_their_key():
    cfg = _config()
    cfg["attention"]["decode"]["query_lens"] = [17]
    cfg["quant"]["group_sizes"] = [48]
    with pytest.raises(configuration.ConfigError) as info:
        configuration.validate_config(cfg, SCHEMA)
    assert "config.attention.decode.query_lens.0: 17 is greater than the maximum of 16" in str(info.value)
    assert "config.quant.group_sizes.0" in str(info.value)


def test_seqlens_and_seqlen_k_of_different_lengths_fail_when_planned():
    """They passed validation and then failed 16 interpreter jobs at run time."""
    cfg = _config()
    cfg["attention"]["interpreter_check"] = {"seqlens": [1, 97], "seqlen_k": [1, 97, 70]}
    message = (r"config.attention.interpreter_check \(shard check_float16_d16_full\): seqlen_k must list one key "
               r"length per entry of seqlens: 3 key lengths \[1, 97, 70\] for 2 query lengths")  # fmt: skip
    with pytest.raises(configuration.ConfigError, match=message):
        configuration.validate_config(cfg, SCHEMA)


@pytest.mark.parametrize(
    "section, change, message",
    [
        ("fa2_setting", {"hidden": 2000}, r"attention.fa2_setting .*hidden 2000 is not a multiple of head_dim 128"),
        ("block_sweep", {"configs": ["BLOCK_M=24,BLOCK_N=64,num_warps=4,num_stages=2"]}, "BLOCK_M must be a power"),
        ("decode", {"heads_kv": [3]}, r"attention.decode .*heads_kv 3 must divide heads 16"),
    ],
)
def test_cross_field_rules_fail_when_planned(section, change, message):
    cfg = _config()
    cfg["attention"][section].update(change)
    with pytest.raises(configuration.ConfigError, match=message):
        configuration.validate_config(cfg, SCHEMA)


def test_the_shipped_configs_pass():
    default = grid.load_config([CONFIG])
    assert default["reference_dir"] == "reports/reference"
    full = grid.load_config([CONFIG, ROOT / "workflow" / "config-full.yaml"])
    shards, full_shards = grid.attention_shards(default["attention"]), grid.attention_shards(full["attention"])
    assert set(shards) < set(full_shards), "the full grid holds every default shard and more"


def test_reference_dir_may_be_null():
    cfg = _config(reference_dir=None)
    assert configuration.validate_config(cfg, SCHEMA)["reference_dir"] is None


# ---------------------------------------------------------------------------------------------------
# The host-side cost of one eager call, and the figures that show it
# ---------------------------------------------------------------------------------------------------


def test_host_time_is_the_median_host_time_of_a_call(monkeypatch):
    monkeypatch.setattr(harness.torch.cuda, "synchronize", lambda *a, **k: None)  # no GPU here
    calls = []

    def call():
        calls.append(1)
        time.sleep(0.002 if len(calls) % 7 else 0.05)  # one slow call in seven: the median ignores it

    ms = harness.host_time(call, reps=21)
    assert len(calls) == 21
    assert 1.9 <= ms < 10


def test_host_ms_is_a_column_of_both_tables_and_optional_in_old_ones():
    assert "host_ms" in tables.COLUMNS and "host_ms" in ops_tables.COLUMNS
    assert "host_ms" in tables.OPTIONAL and "host_ms" in ops_tables.OPTIONAL
    df = tables.read_rows([SHIPPED / "attention.csv"])
    # rows measured before the column existed read empty; those measured since carry it where they were timed
    assert df["host_ms"].isna().any()
    timed = df[df["host_ms"].notna()]
    assert (timed["status"] == "ok").all() and (timed["host_ms"] > 0).all() and timed["ms_median"].notna().all()


def _grouped_rows(host_ours: float, host_torch: float) -> pd.DataFrame:
    df = ops_tables.read_rows([SHIPPED / "ops.csv"])
    other = np.where(df["impl"] == "torch-grouped-mm", host_torch, 0.001)
    return df.assign(host_ms=np.where(df["impl"] == "ours-grouped", host_ours, other))


def test_the_grouped_gemm_figure_shows_the_eager_cost_where_it_differs(tmp_path, monkeypatch):
    """0.19 ms of host time against 0.11 ms of GPU time: the eager line of ours is drawn, torch's is not."""
    drawn = []
    real = ops_figures._line_panels

    def spy(d, *args, **kwargs):
        drawn.append((d, kwargs.get("eager")))
        return real(d, *args, **kwargs)

    monkeypatch.setattr(ops_figures, "_line_panels", spy)
    table = ops_figures.moe_grouped_gemm(_grouped_rows(0.19, 0.02), tmp_path / "g.png")
    d, eager = drawn[-1]
    assert eager == "eager_tflops"
    ours = table[(table["impl"] == "ours-grouped") & (table["tokens"] == 256)]
    assert np.allclose(ours["eager_ms"], np.maximum(ours["ms_median"], 0.19))
    assert np.allclose(ours["eager_tflops"], ours["tflops"] * ours["ms_median"] / ours["eager_ms"])
    small = d[(d["tokens"] == 256)]
    differs = ops_figures.eager_differs(small["tflops"], small["eager_tflops"])
    assert set(small.loc[differs, "impl"]) == {"ours-grouped"}


def test_eager_lines_are_drawn_only_where_they_differ(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    labels: list[str] = []
    real = Axes.plot

    def plot(self, *args, **kwargs):
        labels.append(kwargs.get("label", ""))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Axes, "plot", plot)
    ops_figures.moe_grouped_gemm(_grouped_rows(0.19, 0.02), tmp_path / "g.png")
    assert "ours-grouped, eager call" in labels and "torch-grouped-mm, eager call" not in labels
    labels.clear()
    ops_figures.moe_grouped_gemm(ops_tables.read_rows([SHIPPED / "ops.csv"]), tmp_path / "h.png")  # no host_ms
    assert "ours-grouped" in labels and not any(label.endswith("eager call") for label in labels)
    assert math.isclose(ops_figures.EAGER_GAP, 0.2)
