"""The traffic family's reading of Nsight Compute: ncu CSV parsing, splitting at markers, the byte models
attached to each row. The CSV is a fixture in ncu's format (``traffic_fixture``)."""

from __future__ import annotations

import math

import pytest
from traffic_fixture import ENV, L2, NCU_CSV, SIDECAR, SOFTMAX, B, D, H, N

from analysis import registry
from analysis.core import models
from analysis.families.traffic import run as traffic

TRAFFIC = registry.table("traffic")


# ---- parsing -----------------------------------------------------------------------------------------


def test_numbers_with_thousands_separators_quotes_and_missing_values():
    assert traffic.parse_number('"33,554,432"') == 33554432
    assert traffic.parse_number("2,208") == 2208
    assert traffic.parse_number("35,651.58") == pytest.approx(35651.58)
    assert traffic.parse_number("12.5") == 12.5
    assert math.isnan(traffic.parse_number("n/a"))


def test_a_decimal_comma_is_refused_not_misread():
    with pytest.raises(traffic.NcuOutputError, match="thousands"):
        traffic.parse_number("9,00")


def test_units_convert_to_bytes_and_nanoseconds():
    assert traffic.to_base_unit("dram__bytes_read.sum", "byte", "1,024") == 1024
    assert traffic.to_base_unit("dram__bytes_read.sum", "Kbyte", "2") == 2e3  # ncu's prefixes are decimal
    assert traffic.to_base_unit("dram__bytes_write.sum", "Mbyte", "33.55") == pytest.approx(33.55e6)
    assert traffic.to_base_unit("dram__bytes_write.sum", "Gbyte", "1.5") == pytest.approx(1.5e9)
    assert traffic.to_base_unit("gpu__time_duration.sum", "nsecond", "2,208") == 2208
    assert traffic.to_base_unit("gpu__time_duration.sum", "usecond", "12.35") == pytest.approx(12350)
    assert traffic.to_base_unit("gpu__time_duration.sum", "msecond", "1.5") == pytest.approx(1.5e6)
    with pytest.raises(traffic.NcuOutputError, match="unknown unit"):
        traffic.to_base_unit("dram__bytes_read.sum", "sector", "3")


def test_parse_skips_preamble_and_program_output_and_groups_metrics_by_kernel():
    kernels = traffic.parse_ncu_csv(NCU_CSV)
    assert [k.id for k in kernels] == list(range(10))
    assert [traffic.is_marker(k) for k in kernels].count(True) == 4
    softmax = kernels[2]
    assert softmax.name == SOFTMAX  # commas inside the quoted name survive
    assert softmax.values == {
        "dram_read_bytes": pytest.approx(33.55e6),
        "dram_write_bytes": 33554432,
        "gpu_time_ns": pytest.approx(20100),
    }
    assert kernels[3].values["dram_read_bytes"] == pytest.approx(35651.58e3)
    assert kernels[3].values["gpu_time_ns"] == pytest.approx(1e4)


def test_parse_reads_the_raw_page_too():
    text = "\n".join(
        [
            "==PROF== Connected to process 7",
            '"ID","Kernel Name","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum"',
            '"","","Mbyte","byte","usecond"',
            '"0","_traffic_point_marker","0","32","2.1"',
            '"1","_attn_fwd_kernel","6.30","2,162,688","8"',
        ]
    )
    kernels = traffic.parse_ncu_csv(text)
    assert [k.name for k in kernels] == ["_traffic_point_marker", "_attn_fwd_kernel"]
    assert kernels[1].values == {
        "dram_read_bytes": pytest.approx(6.3e6),
        "dram_write_bytes": 2162688,
        "gpu_time_ns": pytest.approx(8000),
    }


def test_no_table_means_no_kernels():
    assert traffic.parse_ncu_csv("==PROF== Connected\n==ERROR== ERR_NVGPUCTRPERM\n") == []


def test_split_at_markers_drops_the_markers():
    before, segments = traffic.split_points(traffic.parse_ncu_csv(NCU_CSV))
    assert before == []
    assert [[k.id for k in seg] for seg in segments] == [[1, 2, 3], [5], [7], [9]]


# ---- rows and models ---------------------------------------------------------------------------------


def _assembled():
    return traffic.assemble(SIDECAR, traffic.parse_ncu_csv(NCU_CSV), ENV)


def test_assemble_gives_one_row_per_kernel_and_one_per_failed_point():
    rows = _assembled()
    df = TRAFFIC.frame(rows)
    assert list(df.columns) == list(traffic.COLUMNS)
    assert len(df) == 3 + 1 + 1 + 1 + 1
    assert list(df["impl"]) == ["naive"] * 3 + ["sdpa-flash", "sdpa-cudnn", "ours-fa2", "naive"]
    assert list(df["status"]) == ["ok"] * 4 + ["unsupported", "ok", "oom"]
    naive = df[(df["impl"] == "naive") & (df["status"] == "ok")]
    assert list(naive["kernel_index"]) == [0, 1, 2]
    assert list(naive["kernel_role"]) == ["qk", "softmax", "pv"]
    assert not df["kernel"].str.contains("_traffic_point_marker").any()
    # the out-of-memory point's marker segment (one GEMM) is not attributed to anything
    oom = df[df["status"] == "oom"].iloc[0]
    assert oom["kernel"] == "" and math.isnan(oom["dram_read_bytes"]) and "out of memory" in oom["message"]
    assert df["gpu"].eq("h200").all() and df["git_sha"].eq("abc1234").all() and df["timestamp"].ne("").all()


def test_models_are_attached_per_point_and_per_naive_kernel():
    df = TRAFFIC.frame(_assembled())
    naive = df[(df["impl"] == "naive") & (df["status"] == "ok")]
    total = models.standard_attention_total_bytes(N, D, B, H, 2)
    assert total == 2 * B * H * (4 * N * N + 4 * N * D)  # 8N² + 8Nd bytes per head in fp16
    assert (naive["model_bytes"] == total).all()
    parts = models.standard_attention_bytes(N, D, B, H, 2)
    assert list(naive["model_kernel_bytes"]) == [parts["qk"], parts["softmax"], parts["pv"]]
    flash = df[df["impl"] == "sdpa-flash"].iloc[0]
    assert flash["model_bytes"] == models.minimum_attention_bytes(N, D, B, H, 2) == 2 * B * H * 4 * N * D
    assert math.isnan(flash["model_bytes_nocache"])
    ours = df[df["impl"] == "ours-fa2"].iloc[0]
    assert (ours["block_m"], ours["block_n"], ours["num_warps"], ours["num_stages"]) == (128, 64, 8, 3)
    assert ours["model_bytes_nocache"] == models.fa2_forward_bytes(N, D, 128, B, H, 2)
    assert ours["model_bytes"] == models.minimum_attention_bytes(N, D, B, H, 2)


def test_l2_resident_follows_the_size_of_the_n_by_n_tensor():
    df = TRAFFIC.frame(_assembled())
    # 16 heads × 1024² × 2 B = 32 MiB fits a 50 MiB L2; at N = 65536 it does not
    assert df.loc[df["seqlen"] == N, "l2_resident"].eq(True).all()
    assert df.loc[df["seqlen"] == 65536, "l2_resident"].eq(False).all()
    assert (df["l2_cache_bytes"] == L2).all()


def test_causal_points_get_no_model():
    point = dict(SIDECAR["points"][0], causal=True)
    assert all(math.isnan(v) for v in traffic.point_models(point).values())


def test_a_marker_count_that_does_not_match_the_sidecar_is_an_error():
    kernels = [k for k in traffic.parse_ncu_csv(NCU_CSV) if k.id != 8]  # the oom point's marker is lost
    with pytest.raises(traffic.NcuOutputError, match="3 point markers but the target marked 4"):
        traffic.assemble(SIDECAR, kernels, ENV)


def test_a_kernel_without_a_value_is_an_error_row():
    text = NCU_CSV.replace('"dram__bytes_write.sum","Mbyte","2.10"', '"dram__bytes_write.sum","Mbyte","n/a"', 1)
    df = TRAFFIC.frame(traffic.assemble(SIDECAR, traffic.parse_ncu_csv(text), ENV))
    bad = df[df["status"] == "error"]
    assert len(bad) == 1 and "dram_write_bytes" in bad.iloc[0]["message"]
