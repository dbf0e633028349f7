"""The planner bench's grid, its sub-pool clusters, and a smoke run of each kind of row.

The bench's figures are its own job (bench/planner_bench.py); these check that every row kind
runs end to end on a tiny evaluation budget and that the grids are the ones the issue names.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter

import pytest
from helpers.bench_modules import load_bench

from hetprof.costmodels import get_cost_model
from hetprof.planner.search.subpools import restricted_cluster, sub_clusters

checks = load_bench("planner_checks")
bench = load_bench("planner_bench")


def test_the_full_grid_and_the_subset():
    grid = checks.full_grid()
    assert len(grid) == len(set(grid)) == 48
    sub = checks.subset12()
    assert len(sub) == 12 and set(sub) <= set(grid)
    assert {(s, m) for s, m, _, _ in sub} == {(s, m) for s in checks.SCENARIOS for m in checks.MODELS}
    assert set(Counter((a, o) for _, _, a, o in sub).values()) == {3}     # algorithms and modes mixed


def test_sub_clusters_keep_host_names_and_drop_links_to_what_is_gone():
    cluster, _ = bench.load("multi-region", "8b", "ppo", "sync")
    east = restricted_cluster(cluster, region="us-east")
    assert {h.region for h in east.hosts} == {"us-east"}
    assert set(east.host_names()) == {h.name for h in cluster.expanded_hosts() if h.region == "us-east"}
    assert not east.network.links                    # both overrides name us-central
    assert restricted_cluster(cluster, region="mars") is None
    names = [n for n, _ in sub_clusters(cluster)]
    assert names == ["region us-central", "region us-east", "region us-west", "type A100-40GB", "type L40S"]
    # all L4s are in us-central: that type is that region, listed once
    central = dict(sub_clusters(cluster))["region us-central"]
    assert central.gpu_counts() == {"L4": cluster.gpu_counts()["L4"]}
    within = [n for n, _ in sub_clusters(cluster, within=True)]
    assert within == names + ["A100-40GB in us-east", "L40S in us-east", "A100-40GB in us-west", "L40S in us-west"]


def _args(**kw) -> argparse.Namespace:
    args = bench.options().parse_args([])
    args.budget_s, args.ilp_limit_s = 600.0, 5.0
    for k, v in kw.items():
        setattr(args, k, v)
    return args


@pytest.mark.parametrize("key", [("multi-continent", "4b", "ppo", "async"), ("single-region", "14b", "grpo", "sync")])
def test_a_row_of_each_kind_runs_on_a_tiny_budget(key):
    """Async rows add the arealhex baseline; the row carries every column the table prints. On so
    small a budget a baseline may find nothing feasible: then its row says why."""
    row = bench.run_row(*key, _args(equal_evals=8, no_ilp=True), get_cost_model("analytical"))
    assert row["hetrl_evals"] == 8 and math.isfinite(row["hetrl_iter_s"])
    baselines = ("verl", "streamrl") + (("arealhex",) if key[3] == "async" else ())
    for name in baselines:
        assert row[f"{name}_evals"] <= 8 and row[f"{name}_chosen"], name
        assert (row[f"{name}_evals"] > 0) != bool(row[f"{name}_error"]), name
    assert ("arealhex" in row) == (key[3] == "async")
    found = [row[n] for n in baselines if row[n] == row[n]]
    assert found and row["best"] == min(found)


def test_an_anytime_row_takes_medians_and_the_evaluations_to_within_5_percent():
    import types

    def res(iter_s: float, evals: int, trace: list[tuple[int, float]]):
        return types.SimpleNamespace(score=types.SimpleNamespace(iteration_s=iter_s), evaluations=evals,
                                     objective_value=iter_s, trace=[{"evals": n, "best": b} for n, b in trace])

    short = [(res(12.0, 900, []), 9.8), (res(10.0, 1000, []), 9.9), (res(11.0, 950, []), 9.7)]
    long = [(res(10.0, 6000, [(1, 30.0), (400, 10.4), (900, 10.0)]), 59.0),
            (res(10.0, 6100, [(5, 20.0), (2000, 10.0)]), 59.5),
            (res(10.0, 5900, [(3, 10.5), (50, 10.0)]), 58.0)]
    row = bench.anytime_row(("multi-region", "8b", "ppo", "sync"), True, short, long)
    assert row["ratio"] == pytest.approx(1.1)
    assert row["evals_short"] == 950 and row["evals_long"] == 6000
    assert row["evals_to_5pct"] == 400          # of 400, 2000 and 3
    assert row["seconds_short"] == 9.9 and row["load"] is True
