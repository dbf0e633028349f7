"""Specs within their caps (issue 37): figures that would make a cost model divide to inf/NaN, and
length distributions whose spread overflows, are refused in one line naming the field."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetprof.errors import SpecError
from hetprof.specs import gpus
from hetprof.specs.loader import from_data
from hetprof.specs.workload import MAX_SPREAD, LengthDist


@pytest.mark.parametrize("figure", ["memory_GB", "hbm_GBps", "bf16_tflops", "fp32_tflops", "intra_node_GBps",
                                    "host_link_GBps"])
@pytest.mark.parametrize("value", [1e-300, 1e-9, 1e300])
def test_absurd_gpu_figures_are_refused_naming_the_field(figure, value):
    with pytest.raises(SpecError, match=f"gpus.x.{figure}") as err:
        gpus.parse({"gpus": {"x": {"memory_GB": 80, figure: value}}}, file="catalog.yaml")
    assert err.value.exit_code == 2 and "catalog.yaml" in str(err.value)


def test_the_packaged_catalog_is_within_the_figure_range():
    from importlib.resources import files

    import yaml

    data = yaml.safe_load(files("hetprof").joinpath("data/gpus.yaml").read_text())
    assert gpus.parse(data).gpus["cpu"].fp32_tflops == 0.1


@pytest.mark.parametrize("dist", ["normal", "lognormal"])
def test_an_extreme_spread_is_refused_and_the_largest_accepted_one_samples_finite(dist):
    with pytest.raises(SpecError, match="std"):
        from_data(LengthDist, {"mean": 1e-3, "std": 1e6, "dist": dist, "max": 10})
    edge = from_data(LengthDist, {"mean": 1.0, "std": float(MAX_SPREAD), "dist": dist, "max": 4096})
    lengths = edge.sample(1000, np.random.default_rng(0))
    assert lengths.min() >= 1 and lengths.max() <= 4096 and math.isfinite(edge.expected_longest(8))


def _plan_cli(tmp_path, cluster: str, *args: str):
    from pathlib import Path

    from click.testing import CliRunner

    from hetprof.cli import cli

    root = Path(__file__).resolve().parents[2]
    path = tmp_path / "cluster.yaml"
    path.write_text(cluster)
    result = CliRunner().invoke(cli, ["--db", str(tmp_path / "db.sqlite"), "plan", "-c", str(path), "-w",
                                      str(root / "examples" / "workloads" / "grpo-tiny.yaml"), *args])
    return result, [ln for ln in result.output.splitlines() if ln.strip()]


def test_a_cluster_beyond_the_planners_reach_is_refused_before_the_search(tmp_path):
    import time

    from hetprof.specs.cluster import MAX_PLANNED_DEVICES

    started = time.process_time()
    result, lines = _plan_cli(tmp_path, "name: big\nhosts:\n  - {name: h, count: 4096, gpus: {type: H100, count: 16}}\n")
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert f"at most {MAX_PLANNED_DEVICES:,} devices" in lines[0] and "65536" in lines[0] and "cluster.yaml" in lines[0]
    assert time.process_time() - started < 30


def test_a_what_if_beyond_the_planners_reach_is_refused_before_the_search(tmp_path):
    result, lines = _plan_cli(tmp_path, "name: small\nhosts:\n  - {name: h, gpus: {type: H100, count: 8}, region: a}\n",
                              "--what-if", "add 60000xH100@a")
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "--what-if add 60000xH100@a" in lines[0] and "devices for `hetprof plan`" in lines[0]


def test_a_large_flow_style_yaml_is_refused_by_size_before_parsing(tmp_path):
    import time

    from hetprof.specs import ClusterSpec
    from hetprof.specs.loader import MAX_YAML_BYTES

    entry = "  - {name: h%d, gpus: {type: H100, count: 8}, region: r}\n"
    lines, size, i = ["name: x\nhosts:\n"], 0, 0
    while size <= MAX_YAML_BYTES:
        lines.append(entry % i)
        size += len(lines[-1])
        i += 1
    path = tmp_path / "big.yaml"
    path.write_text("".join(lines) + "bogus: 1\n")
    started = time.process_time()
    with pytest.raises(SpecError, match="larger than") as err:
        ClusterSpec.load(path)
    assert err.value.exit_code == 2 and "big.yaml" in str(err.value) and time.process_time() - started < 5
    path.write_text("".join(lines[: len(lines) // 4]) + "bogus: 1\n")  # within the cap: named in seconds
    started = time.process_time()
    with pytest.raises(SpecError, match="bogus"):
        ClusterSpec.load(path)
    assert time.process_time() - started < 30
