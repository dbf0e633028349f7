"""Collectives among real gloo processes: the rows' busbw follows the nccl-tests factor per world."""

from __future__ import annotations

import pytest

from hetprof.profiler.collective_worker import bus_factor
from hetprof.profiler.context import ProfileContext
from hetprof.profiler.suites.collectives import CollectivesSuite
from hetprof.profiles import ProfileDB

pytestmark = pytest.mark.slow

EXPECTED = {"all_reduce": {2: 1.0, 4: 1.5}, "all_gather": {2: 0.5, 4: 0.75}, "broadcast": {2: 1.0, 4: 1.0}}


def test_bus_factors_are_the_nccl_tests_ones():
    for op, by_world in EXPECTED.items():
        for world, factor in by_world.items():
            assert bus_factor(op, world) == pytest.approx(factor)


@pytest.fixture(scope="module")
def collective_rows(tmp_path_factory):
    path = tmp_path_factory.mktemp("coll") / "p.db"
    with ProfileDB(path) as db:
        ctx = ProfileContext(db=db, host="t", device="cpu", device_id=None, quick=True, threads=1,
                             devices=["cpu"], options={"worlds": [2, 4], "collective_max_bytes": 1024**2})
        CollectivesSuite().run(ctx)
        return db.samples("collective."), ctx.summary


def test_rows_for_2_and_4_gloo_processes(collective_rows):
    df, summary = collective_rows
    assert set(df["benchmark"]) == {"collective.all_reduce", "collective.all_gather", "collective.broadcast"}
    assert set(df["world"]) == {2, 4}
    assert set(df["backend"]) == {"gloo"}
    assert len(summary) == 6
    for (bench, world), g in df.groupby(["benchmark", "world"]):
        op = bench.split(".", 1)[1]
        ratio = g["busbw_Bps"] / g["algbw_Bps"]
        assert ratio.round(9).eq(round(EXPECTED[op][world], 9)).all(), (bench, world)
        assert (g["algbw_Bps"] * g["seconds"]).round().eq(g["size_bytes"].astype(float)).all()
        assert g["size_bytes"].nunique() >= 3


def test_small_messages_are_latency_bound(collective_rows):
    """busbw rises with size: a 4 KiB collective pays the same fixed latency as a 1 MiB one."""
    df, _ = collective_rows
    for (_bench, _world), g in df.groupby(["benchmark", "world"]):
        med = g.groupby("size_bytes")["busbw_Bps"].median().sort_index()
        assert med.iloc[-1] > 2 * med.iloc[0]


def test_all_reduce_busbw_is_at_least_the_bytes_each_rank_moves(collective_rows):
    """A 4-rank all-reduce moves 1.5× the message per rank: its algbw must sit below a 2-rank one's."""
    df, _ = collective_rows
    big = df[(df["benchmark"] == "collective.all_reduce") & (df["size_bytes"] == df["size_bytes"].max())]
    alg = big.groupby("world")["algbw_Bps"].median()
    assert alg[4] < alg[2] * 1.5
