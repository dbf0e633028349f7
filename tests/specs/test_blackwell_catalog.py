"""Blackwell catalog entries, FP8 peaks and NVLink domains across hosts: figures, sources, field-path errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetprof.errors import SpecError
from hetprof.specs import ClusterSpec
from hetprof.specs.catalog import builtin
from hetprof.specs.gpus import parse

ROOT = Path(__file__).resolve().parents[2]


def test_blackwell_entries_carry_their_datasheet_figures_and_sources():
    cat = builtin()
    expect = {  # name: (memory GB, bf16, fp8 dense TFLOP/s, NVLink domain GPUs, the source its comment names)
        "B200": (180, 2250, 4500, None, "hgx-b200-b300"),
        "B300": (288, 2250, 4500, None, "hgx-b200-b300"),
        "GB200": (186, 2500, 5000, 72, "gb200-nvl72"),
        "GB300": (288, 2500, 5000, 72, "gb300-nvl72"),
    }
    for name, (mem, bf16, fp8, domain, source) in expect.items():
        g = cat.lookup(name)
        assert (g.memory_GB, g.bf16_tflops, g.fp8_tflops, g.nvlink_domain_gpus) == (mem, bf16, fp8, domain)
        assert source in cat.sources and g.intra_node_GBps == 1800
        assert g.peak_flops("fp8") == fp8 * 1e12
    assert cat.lookup("NVIDIA GB200").name == "GB200"  # the driver's name


def test_fp8_peaks_and_a_type_without_fp8_names_the_missing_field():
    cat = builtin()
    assert cat.lookup("H100-SXM").peak_flops("fp8") == 1979e12
    assert cat.lookup("H20").peak_flops("fp8") == 296e12
    with pytest.raises(KeyError, match=r"gpus\.A100-40GB\.fp8_tflops"):
        cat.lookup("A100-40GB").peak_flops("fp8")
    # the FP8 matmul curve is its own, cited, and below bf16's efficiency (mamf-table-fp8)
    h100 = cat.lookup("H100-SXM").efficiency
    assert h100.matmul_fp8.source in cat.sources and h100.matmul_fp8.best < h100.matmul.best


def test_blackwell_matmul_ceilings_are_the_h100s_times_measured_training_fractions_of_peak():
    """megatron-bridge-perf-25.11, Llama3-8B FP8-CS: Model TFLOP/sec/GPU over dense FP8 peak, against the
    H100's 744 of 1979; each part's ceiling is the H100's (bf16 and FP8) times that ratio."""
    cat = builtin()
    h100 = cat.lookup("H100-SXM").efficiency
    measured = {"B200": 1576 / 4500, "B300": 1576 / 4500, "GB200": 1622 / 5000, "GB300": 1933 / 5000}
    for name, fraction in measured.items():
        eff = cat.lookup(name).efficiency
        ratio = fraction / (744 / 1979)
        assert eff.matmul.best == pytest.approx(h100.matmul.best * ratio, abs=1e-3)
        assert eff.matmul_fp8.best == pytest.approx(h100.matmul_fp8.best * ratio, abs=1e-3)
        assert eff.matmul.source == "megatron-bridge-perf-25.11" and eff.matmul.source in cat.sources
    assert cat.lookup("GB200").efficiency.matmul.best < cat.lookup("B200").efficiency.matmul.best


def test_blackwell_decodes_at_the_measured_vllm_speedup_over_h100():
    """aimultiple-vllm-b200: vLLM on a B200 is 1.77x an H100 on Llama-3.1-8B, against an HBM ratio of
    8000 / 3350; the decode curve is the default's × 1.77 / (8000 / 3350) = 0.741, so at any decode
    batch a Blackwell part moves 1.77x the H100's bytes per second."""
    from hetprof.costmodels.calibration import Calibration

    cal = Calibration(None, builtin())
    for name in ("B200", "B300", "GB200", "GB300"):
        for batch in (1, 64, 256):
            ratio = cal.memory_rate(name, batch, 1e9).value / cal.memory_rate("H100-SXM", batch, 1e9).value
            assert ratio == pytest.approx(1.77, rel=2e-3)
        assert builtin().lookup(name).efficiency.decode_memory.source == "aimultiple-vllm-b200"


@pytest.mark.parametrize(("entry", "path"), [
    ({"fp8_tflops": -1}, "gpus.X.fp8_tflops"),
    ({"fp8_tflops": "fast"}, "gpus.X.fp8_tflops"),
    ({"nvlink_domain_gpus": 1}, "gpus.X.nvlink_domain_gpus"),
    ({"nvlink_domain_gpus": 72.5}, "gpus.X.nvlink_domain_gpus"),
    ({"efficiency": {"matmul_fp8": {"points": [[1, 2.0]], "source": "s"}}}, "gpus.X.efficiency.matmul_fp8.points"),
])
def test_malformed_new_catalog_fields_name_file_and_field(entry, path):
    with pytest.raises(SpecError) as err:
        parse({"gpus": {"X": entry}}, "my-catalog.yaml")
    assert err.value.field == path and err.value.file == "my-catalog.yaml"


def _nvl(hosts: list[dict]) -> dict:
    return {"name": "racks", "hosts": hosts}


def test_example_nvl72_cluster_is_one_domain_of_72_gpus():
    cluster = ClusterSpec.load(ROOT / "examples" / "clusters" / "gb200-nvl72.yaml")
    devices = cluster.devices()
    assert len(devices) == 72 and {d.nvlink_domain for d in devices} == {"nvl72-0"}
    assert cluster.same_nvlink_domain("tray-0", "tray-17")
    assert cluster.link_between("tray-0", "tray-17") == cluster.link_between("tray-0", "tray-0")


@pytest.mark.parametrize(("hosts", "path", "says"), [
    # 19 trays of 4 is 76 GPUs: more than GB200's fabric joins
    ([{"name": "t", "count": 19, "gpus": {"type": "GB200", "count": 4}, "nvlink_domain": "r"}],
     "hosts[0].nvlink_domain", "gpus.GB200.nvlink_domain_gpus"),
    # an HGX H100 host's NVLink ends at the host
    ([{"name": "h", "count": 2, "gpus": {"type": "H100", "count": 8}, "nvlink_domain": "r"}],
     "hosts[0].nvlink_domain", "gpus.H100-SXM.nvlink_domain_gpus"),
    # one fabric, one GPU type
    ([{"name": "a", "gpus": {"type": "GB200", "count": 4}, "nvlink_domain": "r"},
      {"name": "b", "gpus": {"type": "GB300", "count": 4}, "nvlink_domain": "r"}],
     "hosts[1].nvlink_domain", "one GPU type"),
    ([{"name": "a", "gpus": {"type": "GB200", "count": 4}, "nvlink_domain": " "}], "hosts[0].nvlink_domain", ""),
])
def test_an_impossible_nvlink_domain_is_refused_with_its_field(hosts, path, says):
    with pytest.raises(SpecError) as err:
        ClusterSpec.from_dict(_nvl(hosts), file="racks.yaml")
    assert err.value.field == path and says in err.value.expected and err.value.file == "racks.yaml"


def test_two_racks_are_two_domains_joined_by_the_network():
    cluster = ClusterSpec.from_dict(_nvl([
        {"name": "r0", "count": 18, "gpus": {"type": "GB200", "count": 4}, "nvlink_domain": "rack0"},
        {"name": "r1", "count": 18, "gpus": {"type": "GB200", "count": 4}, "nvlink_domain": "rack1"}]))
    assert not cluster.same_nvlink_domain("r0-0", "r1-0")
    assert cluster.link_between("r0-0", "r1-0") == cluster.network.intra_region
