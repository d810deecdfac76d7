"""Result tables: rows to frames with exactly a table's columns, the round trip through CSV, older tables
without the optional columns, the shipped table, and tables composed from the families' declared columns."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from analysis import registry
from analysis.core import points, tables

ROOT = Path(__file__).resolve().parents[2]
ATTENTION = registry.table("attention")


def _row(**overrides) -> dict:
    row = dict.fromkeys(list(ATTENTION.columns), math.nan)
    row.update(
        experiment="memory",
        family="attention",
        op="attention",
        impl="ours-fa2",
        dtype="float16",
        mode="fwd",
        inputs="normal",
        batch=1,
        heads=16,
        heads_kv=16,
        seqlen_q=1024,
        seqlen_k=1024,
        head_dim=64,
        causal=True,
        status="ok",
        message="",
        timed=True,
        ms_median=1.25,
        ms_p20=1.125,
        ms_p80=1.5,
        tflops=55.5,
        max_abs_err=0.000244140625,
        err_bound=0.001953125,
        gpu_name="NVIDIA H200",
        gpu="h200",
        torch="2.11.0",
        git_sha="abc123",
        kernel_config="BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3",
    )
    row.update(overrides)
    return row


def test_to_frame_columns_in_schema_order():
    df = ATTENTION.frame([{"status": "ok", "impl": "naive"}, _row()])
    assert list(df.columns) == list(ATTENTION.columns)
    assert df.loc[0, "impl"] == "naive" and math.isnan(df.loc[0, "ms_median"])
    assert df.loc[1, "ms_median"] == 1.25


def test_to_frame_rejects_unknown_columns():
    with pytest.raises(ValueError, match=r"outside the attention schema: \['speedup'\]"):
        ATTENTION.frame([_row(speedup=2.0)])


@pytest.mark.parametrize(
    "status",
    [pytest.param("fine", id="unknown"), pytest.param("OK", id="upper-case"), pytest.param(None, id="none")],
)
def test_to_frame_rejects_bad_status(status):
    with pytest.raises(ValueError, match="row status must be one of"):
        ATTENTION.frame([_row(), _row(status=status)])


def test_to_frame_rejects_missing_status():
    row = _row()
    del row["status"]
    with pytest.raises(ValueError, match="row status must be one of"):
        ATTENTION.frame([row])


def test_write_read_round_trip(tmp_path):
    rows = [
        _row(),
        _row(
            impl="naive",
            status="oom",
            message="OutOfMemoryError: CUDA out of memory.",
            causal=False,
            ms_median=math.nan,
            ms_p20=math.nan,
            ms_p80=math.nan,
            tflops=math.nan,
            kernel_config="",
        ),
        _row(impl="sdpa-flash", status="unsupported", message="RuntimeError: No available kernel.", seqlen_q=4096),
    ]
    path = tmp_path / "nested" / "dir" / "shard.csv"
    written = ATTENTION.write_rows(rows, path)
    assert path.exists()
    assert sorted(p.name for p in path.parent.iterdir()) == ["shard.csv"]  # no .tmp left behind
    back = ATTENTION.read_rows([path])
    assert list(back.columns) == list(ATTENTION.columns)
    assert list(written.columns) == list(ATTENTION.columns)
    assert len(back) == 3
    assert back["impl"].tolist() == ["ours-fa2", "naive", "sdpa-flash"]
    assert back["status"].tolist() == ["ok", "oom", "unsupported"]
    assert back["seqlen_q"].tolist() == [1024, 1024, 4096]
    assert back["causal"].tolist() == [True, False, True]
    assert back["timed"].tolist() == [True, True, True]
    assert back.loc[0, "ms_median"] == 1.25 and math.isnan(back.loc[1, "ms_median"])
    assert back.loc[0, "max_abs_err"] == 0.000244140625
    assert back.loc[1, "message"] == "OutOfMemoryError: CUDA out of memory."
    assert back.loc[0, "kernel_config"] == "BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3"
    assert back.loc[0, "gpu"] == "h200"


def test_write_rows_replaces_existing_file(tmp_path):
    path = tmp_path / "shard.csv"
    ATTENTION.write_rows([_row(), _row()], path)
    ATTENTION.write_rows([_row(impl="naive")], path)
    back = ATTENTION.read_rows([path])
    assert back["impl"].tolist() == ["naive"]
    assert [p.name for p in tmp_path.iterdir()] == ["shard.csv"]


def test_read_rows_concatenates_in_order(tmp_path):
    ATTENTION.write_rows([_row(seqlen_q=1)], tmp_path / "a.csv")
    ATTENTION.write_rows([], tmp_path / "empty.csv")
    ATTENTION.write_rows([_row(seqlen_q=2), _row(seqlen_q=3)], tmp_path / "b.csv")
    back = ATTENTION.read_rows([tmp_path / "a.csv", tmp_path / "empty.csv", tmp_path / "b.csv"])
    assert back["seqlen_q"].tolist() == [1, 2, 3]
    assert list(back.index) == [0, 1, 2]


def test_read_rows_of_nothing_has_the_schema(tmp_path):
    assert list(ATTENTION.read_rows([]).columns) == list(ATTENTION.columns)
    ATTENTION.write_rows([], tmp_path / "empty.csv")
    back = ATTENTION.read_rows([tmp_path / "empty.csv"])
    assert len(back) == 0 and list(back.columns) == list(ATTENTION.columns)


def test_read_rows_missing_column(tmp_path):
    path = tmp_path / "old.csv"
    ATTENTION.frame([_row()]).drop(columns=["tflops", "kernel_config"]).to_csv(path, index=False)
    missing = r"old.csv, line 1: required columns \['tflops', 'kernel_config'\] are missing"
    with pytest.raises(ValueError, match=missing):
        ATTENTION.read_rows([path])


def test_read_rows_refuses_extra_columns(tmp_path):
    """A column outside the schema is an error, not dropped: nothing in a table is passed over silently."""
    path = tmp_path / "extra.csv"
    ATTENTION.frame([_row()]).assign(note="hand-added").to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"extra.csv, line 1: columns \['note'\] are not in the schema"):
        ATTENTION.read_rows([path])


def test_read_rows_of_an_older_table_without_the_optional_columns(tmp_path):
    """Tables written before the OPTIONAL columns existed still load, with those as NaN (inputs: normal)."""
    old = tmp_path / "old.csv"
    ATTENTION.frame([_row()]).drop(columns=list(ATTENTION.optional)).to_csv(old, index=False)
    new = tmp_path / "new.csv"
    ATTENTION.write_rows([_row(experiment="decode", model_bytes=4096.0, gbps=2.0)], new)
    back = ATTENTION.read_rows([old, new])
    assert list(back.columns) == list(ATTENTION.columns)
    numeric = [c for c in list(ATTENTION.optional) if c not in ATTENTION.defaults]
    assert back[numeric].iloc[0].isna().all()
    assert back.loc[0, "inputs"] == "normal"
    assert (back.loc[1, "model_bytes"], back.loc[1, "gbps"]) == (4096.0, 2.0)


def test_shipped_reference_table_still_loads():
    shipped = ROOT / "reports" / "reference" / "h200" / "attention.csv"
    back = ATTENTION.read_rows([shipped])
    assert len(back) > 0 and list(back.columns) == list(ATTENTION.columns)
    # bandwidth goes with a byte model: decoding's rows and FP8's quantiser and copy rows carry both (the bytes
    # over the median time), every other row neither
    has = back["gbps"].notna()
    assert (has == back["model_bytes"].notna()).all()
    assert set(back.loc[has, "experiment"]) == {"decode", "fp8-speed"}
    fp8_impls = back.loc[has & (back["experiment"] == "fp8-speed"), "impl"]
    assert fp8_impls.str.match(r"^(copy-qkv|fp8-quantize-(tensor|head|block))$").all()
    rows = back[has & (back["status"] == "ok")]
    expected = [points.rate(b, ms, 1e9) for b, ms in zip(rows["model_bytes"], rows["ms_median"], strict=True)]
    assert np.allclose(rows["gbps"], expected, rtol=1e-9)


def test_result_schema_describes_every_column():
    schema = ATTENTION.schema
    assert list(schema["properties"]) == list(ATTENTION.columns)
    assert set(schema["required"]) == set(list(ATTENTION.columns)) - set(list(ATTENTION.optional))
    assert all(p.get("description") for p in schema["properties"].values())
    assert schema["properties"]["status"]["enum"] == list(ATTENTION.statuses)


def test_merge_orders_keeps_every_list_order():
    assert tables.merge_orders([["a", "b", "d"], ["a", "c", "d", "e"], ["x", "b"]]) == ["a", "x", "b", "c", "d", "e"]


def test_a_table_is_composed_from_its_families_columns():
    """Shared columns come from the shared dictionary, a family's own from its columns.yaml; the experiments
    of the table's families are the only ones its rows may name."""
    core = list(tables.CORE)
    toy = {
        "description": "Toy rows.",
        "columns": [*core, "impl", "width"],
        "properties": {"width": {"type": "integer", "description": "a toy's width"}},
    }
    table = tables.compose("toy", [toy], ["toy-run"])
    assert table.columns == (*core, "impl", "width")
    assert table.schema["properties"]["experiment"]["enum"] == ["toy-run"]
    assert table.schema["properties"]["impl"] == tables.shared_columns()["impl"]
    with pytest.raises(ValueError, match="defined nowhere"):
        tables.compose("toy", [{"columns": [*core, "nowhere"]}], ["toy-run"])
    with pytest.raises(ValueError, match="is defined in result.schema.yaml"):
        tables.compose("toy", [{"columns": core, "properties": {"impl": {"type": "string"}}}], ["toy-run"])
    with pytest.raises(ValueError, match="core columns"):
        tables.compose("toy", [{"columns": ["impl"]}], ["toy-run"])


def test_the_tables_of_families_that_share_one_merge_their_columns():
    attention, fp8 = registry.family("attention").columns(), registry.family("fp8").columns()
    assert set(ATTENTION.columns) == set(attention["columns"]) | set(fp8["columns"])
    assert set(ATTENTION.schema["properties"]["experiment"]["enum"]) == {
        *registry.family("attention").experiments,
        *registry.family("fp8").experiments,
    }


def test_read_rows_types_every_column_once_from_its_definition(tmp_path):
    """Booleans as bool, integers as nullable integers (empty: NA), numbers as float, strings as str (empty:
    NaN); an optional column an older file lacks gets its default in the column's type."""
    path = tmp_path / "shard.csv"
    ATTENTION.write_rows([_row(), _row(impl="ours-varlen", experiment="varlen", tokens=3000, causal=False)], path)
    back = ATTENTION.read_rows([path])
    assert back["causal"].dtype == bool and back["causal"].tolist() == [True, False]
    assert back["timed"].dtype == bool
    assert str(back["seqlen_q"].dtype) == "Int64" and str(back["tokens"].dtype) == "Int64"
    assert back["tokens"].isna().tolist() == [True, False] and back.loc[1, "tokens"] == 3000
    assert back["ms_median"].dtype == "float64" and back["pad_waste"].dtype == "float64"
    assert back.loc[0, "kernel_config"] == "BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3"
    assert all(isinstance(v, str) for v in back["gpu"]) and math.isnan(back.loc[0, "message"])
    old = tmp_path / "old.csv"
    ATTENTION.frame([_row()]).drop(columns=["inputs", "tokens"]).to_csv(old, index=False)
    back = ATTENTION.read_rows([old, path])
    assert back["inputs"].tolist() == ["normal", "normal", "normal"]  # the family's default
    assert str(back["tokens"].dtype) == "Int64" and back["tokens"].isna().tolist() == [True, True, False]


def test_read_rows_types_a_nullable_boolean_and_digits_that_are_text(tmp_path):
    traffic = registry.table("traffic")
    row = dict.fromkeys(traffic.columns, "")
    row.update(experiment="traffic-scaling", impl="naive", kernel="123", kernel_index=0, kernel_role="qk")
    row.update(dtype="float16", batch=1, heads=2, seqlen=64, head_dim=16, causal=False, status="ok", message="")
    path = tmp_path / "traffic.csv"
    traffic.write_rows([row, {**row, "l2_resident": True}], path)
    back = traffic.read_rows([path])
    assert str(back["l2_resident"].dtype) == "boolean"
    assert back["l2_resident"].isna().tolist() == [True, False] and back.loc[1, "l2_resident"]
    assert back["kernel"].tolist() == ["123", "123"]  # a string column, though its text is digits
    assert str(back["block_m"].dtype) == "Int64" and back["block_m"].isna().all()


def test_finished_keeps_the_timed_ok_rows_that_match():
    df = ATTENTION.frame(
        [
            _row(),
            _row(impl="naive"),
            _row(status="oom", message="out of memory"),
            _row(timed=False),
            _row(causal=False),
            _row(experiment="varlen", impl="ours-varlen", tokens=30),
        ]
    )
    df = df.astype({"tokens": "Int64"})
    assert tables.finished(df).index.tolist() == [0, 1, 4, 5]
    assert tables.finished(df, causal=True, impl="ours-fa2").index.tolist() == [0]
    assert tables.finished(df, impl=["naive", "ours-varlen"]).index.tolist() == [1, 5]
    assert tables.finished(df, tokens=30).index.tolist() == [5]  # an empty cell matches nothing
    assert tables.finished(None).empty
