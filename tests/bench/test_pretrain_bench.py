"""The pre-training throughput check (bench/pretrain_bench.py): every table cites its source, every row
names a model and a system hetprof knows, and each prices to a finite throughput at its layout.

Like the published cases, this checks the tables and the harness, not how close the predictions are."""

from __future__ import annotations

import math

import pytest
from helpers.bench_modules import load_bench

from hetprof.costmodels import get_cost_model
from hetprof.specs.catalog import builtin
from hetprof.specs.models import PRESETS

bench = load_bench("pretrain_bench")
TABLES = sorted(bench.TABLES.glob("*.yaml"))


def test_tables_cite_their_source_and_cover_dense_moe_and_several_systems():
    assert TABLES
    rows = []
    for path in TABLES:
        source, systems, table = bench.load(path)
        assert source["url"].startswith("https://") and source["title"] and source["date"] and source["where"]
        assert {r.system for r in table} <= set(systems)
        rows += table
    assert {r.moe for r in rows} == {True, False}
    assert len({r.system for r in rows}) >= 4


@pytest.mark.parametrize("path", TABLES, ids=[p.stem for p in TABLES])
def test_every_row_prices_to_a_finite_throughput(path):
    cm = get_cost_model("analytical")
    _, systems, rows = bench.load(path)
    for row in rows:
        assert row.model in PRESETS
        builtin().lookup(systems[row.system]["gpu"])
        assert row.gpus % (row.tp * row.pp) == 0 and row.gbs % (row.gpus // (row.tp * row.pp)) == 0
        priced = bench.price(row, systems[row.system], cm)
        assert math.isfinite(priced["predicted"]) and priced["predicted"] > 0
        assert priced["seconds"] == pytest.approx(sum(priced["parts"].values()))


def test_groups_beyond_the_nvlink_domain_cross_the_network():
    system = {"nvlink_domain": 8, "host_Gbps": 3200}
    nvlink = bench.LinkSpec(5e-6, 4e11)
    assert bench.group_link(system, 8, nvlink) is nvlink
    network = bench.group_link(system, 16, nvlink)
    assert network.beta_Bps <= 400e9 and network.alpha_s == bench.IB_ALPHA_S
    system["host_gpus"] = 8
    assert bench.expert_link(system, 8, nvlink) is nvlink
    assert network.beta_Bps / 8 < bench.expert_link(system, 16, nvlink).beta_Bps < nvlink.beta_Bps
