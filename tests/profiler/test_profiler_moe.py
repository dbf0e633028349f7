"""The `moe` suite on the CPU at tiny-moe's shapes: router and grouped-expert rows land in the database,
`hetprof fit` learns the grouped GEMM from them and the roofline prices routed experts with it; the
dispatch all-to-all among 2 gloo processes (slow)."""

from __future__ import annotations

import pytest

from hetprof.costmodels import Phase, moe, moefit
from hetprof.costmodels.analytical import AnalyticalCostModel
from hetprof.profiler import registry
from hetprof.profiler.collective_worker import bus_factor
from hetprof.profiler.context import ProfileContext
from hetprof.profiler.suites.moe import ROWS, MoeSuite, moe_models, rows_for, workload_rows
from hetprof.profiles import ProfileDB
from hetprof.specs.models import PRESETS
from hetprof.specs.vocabulary import MoeBenchmark

TINY_MOE = PRESETS["tiny-moe"]  # hidden 64, 8 experts of width 48, top-2


def _ctx(db, models, **options) -> ProfileContext:
    return ProfileContext(db=db, host="t", device="cpu", device_id=None, quick=True, threads=1, devices=["cpu"],
                          models=models, options=options, suite="moe")


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """tiny-moe's router and grouped experts timed on this CPU (quick: 5 rows per expert, both passes)."""
    path = tmp_path_factory.mktemp("moe") / "p.db"
    with ProfileDB(path) as db:
        ctx = _ctx(db, [TINY_MOE, PRESETS["tiny"]])
        MoeSuite().layers(ctx)
    return path, ctx.summary


def test_rows_per_expert_follow_the_workload_tokens():
    # decode batch 4 → 4 × 2 / 8 = 1 row; prefill 3 × 40 = 120 tokens → 30; train 2 × 100 → 50
    points = {"decode": [(4, 33)], "prefill": [(3, 40)], "train": [(2, 100, 60)]}
    assert workload_rows(points, TINY_MOE) == [1, 30, 50]
    with ProfileDB(":memory:") as db:
        ctx = _ctx(db, [TINY_MOE], workload_points={**points, "train": [(2, 100), (64, 512)]})
        rows = rows_for(ctx, "cpu", TINY_MOE)
    assert set(ROWS[("cpu", True)]) <= set(rows) and {30, 50} <= set(rows)
    assert max(rows) == max(ROWS[("cpu", True)])  # 64 × 512 × 2 / 8 lies beyond the sweep: the fit extrapolates
    assert moe_models([PRESETS["tiny"], TINY_MOE, TINY_MOE]) == [TINY_MOE]


def test_router_and_expert_rows_land_in_the_database(profiled):
    path, summary = profiled
    with ProfileDB(path, readonly=True) as db:
        router, experts = db.samples(MoeBenchmark.ROUTER), db.samples(MoeBenchmark.EXPERTS)
    grid = set(ROWS[("cpu", True)])
    assert set(experts["rows"]) == grid and set(experts["pass"]) == {"forward", "backward"}
    assert set(experts["groups"]) == {4} and set(experts["expert_ffn"]) == {48} and set(experts["hidden"]) == {64}
    assert set(experts["model"]) == {"tiny-moe"} and set(experts["dtype"]) == {"fp32"}
    assert set(router["tokens"]) == {r * 8 // 2 for r in grid} and set(router["experts"]) == {8}
    assert [s.benchmark for s in summary] == ["moe.router", "moe.experts"]  # the dense tiny adds nothing
    # a backward computes data and weight gradients: at the most rows it takes longer than the forward
    top = experts[experts["rows"] == max(grid)].groupby("pass")["seconds"].min()
    assert top["backward"] > top["forward"]


def test_fit_learns_the_rows_and_pricing_uses_them(profiled):
    path, _ = profiled
    phase = Phase("decode", TINY_MOE, TINY_MOE.layers, 16, 64, dtype="fp32")
    with ProfileDB(path) as db:
        before = AnalyticalCostModel(db).phase_time(phase, "cpu").seconds
        (fit,) = moefit.fit_experts(db)
        moefit.store(db, [fit])
        gemm = moe.load_expert_gemms(db)[("cpu", "fp32")]
        after = AnalyticalCostModel(db).phase_time(phase, "cpu").seconds
    assert fit.n_rows == 2 * len(ROWS[("cpu", True)]) and fit.heldout.n_folds >= 1
    assert 0 <= fit.heldout.mape < 1.0  # a measured CPU curve; the catalog's is far off (reported, not asserted)
    assert gemm.rate(TINY_MOE, 4.0, 1, training=False) > 0
    assert after != pytest.approx(before, rel=1e-3)  # the routed experts now run at the measured rate


def test_the_suite_is_default_and_a_dense_job_gets_no_rows():
    assert "moe" in [c.name for c in registry.suites_to_run(None)]
    with ProfileDB(":memory:") as db:
        ctx = _ctx(db, [PRESETS["tiny"]])
        assert MoeSuite().steps(ctx) == 0
        MoeSuite().run(ctx)  # no MoE model: no rows, no processes, no notes
        assert not len(db.samples("moe.")) and ctx.summary == []


def test_all_to_all_bus_factor_is_nccl_tests():
    assert bus_factor("all_to_all", 2) == pytest.approx(0.5) and bus_factor("all_to_all", 4) == pytest.approx(0.75)


@pytest.mark.slow
def test_dispatch_all_to_all_among_two_gloo_ranks(tmp_path):
    with ProfileDB(tmp_path / "p.db") as db:
        ctx = _ctx(db, [TINY_MOE], worlds=[2], collective_max_bytes=1024**2)
        MoeSuite().all_to_alls(ctx)
        df = db.samples(MoeBenchmark.ALL_TO_ALL)
    per_token = 64 * 4 * 2  # fp32 hidden state to each of top-2 experts
    assert set(df["world"]) == {2} and set(df["backend"]) == {"gloo"}
    assert (df["size_bytes"] == df["tokens"] * per_token).all() and df["tokens"].nunique() >= 2
    assert (df["algbw_Bps"] * df["seconds"]).round().eq(df["size_bytes"].astype(float)).all()


def test_a_point_out_of_memory_is_skipped_with_a_note(tmp_path, monkeypatch):
    import torch

    from hetprof.profiler.suites import moe as suite

    real = suite.expert_call

    def tight(groups, rows, *args, **kwargs):
        if rows == 256:
            raise torch.OutOfMemoryError("simulated")
        return real(groups, rows, *args, **kwargs)

    monkeypatch.setattr(suite, "expert_call", tight)
    notes = []
    with ProfileDB(tmp_path / "p.db") as db:
        ctx = _ctx(db, [TINY_MOE])
        ctx.note = notes.append
        monkeypatch.setitem(suite.ROWS, ("cpu", True), (1, 256))
        MoeSuite().layers(ctx)
        experts = db.samples(MoeBenchmark.EXPERTS)
    assert set(experts["rows"]) == {1}
    assert notes == ["moe.experts tiny-moe forward rows=256: out of memory, skipped",
                     "moe.experts tiny-moe backward rows=256: out of memory, skipped"]
