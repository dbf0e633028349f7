"""`hetprof fit` on `moe.experts` rows of a simulated device: the grouped-GEMM model it learns, how the
roofline prices routed experts with it (and without it), invalid entries refused, and the planner's
coverage line naming missing MoE rows with the command that profiles them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from hetprof.cli import cli
from hetprof.costmodels import Phase, moe, moefit
from hetprof.costmodels.analytical import AnalyticalCostModel
from hetprof.planner.coverage import missing_rows
from hetprof.profiles import DeviceInfo, ProfileDB
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.specs.models import PRESETS
from hetprof.specs.vocabulary import MoeBenchmark

QWEN = PRESETS["qwen3-30b-a3b"]  # hidden 2048, 128 experts of width 768, top-8
TINY_MOE = PRESETS["tiny-moe"]
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def true_seconds(hidden: int, ffn: int, groups: int, rows: int, pass_: str) -> float:
    """A simulated device: the GEMMs' efficiency rises with rows per expert (half the 20 GFLOP/s peak at
    24 rows), expert weights stream at 10 GB/s, a per-group and a per-call cost."""
    work = moe.PASS_WORK[pass_]
    flops = moe.expert_flops(hidden, ffn, groups, rows)
    weights = 3.0 * hidden * ffn * groups * 4
    return work * (flops / (2e10 * rows / (rows + 24.0)) + weights / 1e10 + groups * 5e-6) + 4e-5


def _add_rows(db: ProfileDB, shapes=((64, 48), (128, 96), (256, 128)), dtype: str = "fp32", seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    dev = db.add_device(DeviceInfo(name="synthetic cpu", kind="cpu", catalog_type="cpu", host="synth"))
    samples = []
    for hidden, ffn in shapes:
        for pass_ in moe.PASS_WORK:
            for rows in ROWS:
                t = true_seconds(hidden, ffn, 4, rows, pass_)
                params = {"model": f"m{hidden}", "hidden": hidden, "expert_ffn": ffn, "experts": 8, "top_k": 2,
                          "groups": 4, "rows": rows, "pass": pass_, "dtype": dtype, "threads": 1}
                # one-sided noise: interference only adds time
                samples += [{"params": params, "metrics": {"seconds": t * (1 + abs(rng.normal(0, 0.03)))}}
                            for _ in range(4)]
    db.add_benchmark(MoeBenchmark.EXPERTS, dev, "synth", {"dtype": dtype}, samples)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A database of simulated rows, its grouped-GEMM model fitted once and stored: (path, fit)."""
    path = tmp_path_factory.mktemp("moefit") / "p.db"
    with ProfileDB(path) as db:
        _add_rows(db)
        (fit,) = moefit.fit_experts(db)
        moefit.store(db, [fit])
    return path, fit


def test_fit_learns_the_grouped_gemm_curve_with_heldout_error(fitted):
    _, fit = fitted
    assert (fit.device_type, fit.dtype, fit.threads) == ("cpu", "fp32", 1)
    assert fit.n_rows == 3 * 2 * len(ROWS) and fit.n_samples == 4 * fit.n_rows
    # folds hold out the most and fewest rows per expert and each expert shape
    assert {"largest batch", "smallest batch", "model 128x96"} <= set(fit.heldout.per_fold)
    assert fit.heldout.mape < 0.15
    gemm = moe.validate_expert_entry({"id": "x", "params": fit.entry(), "metrics": fit.metrics()})
    for rows in (3, 40, 200):  # between the profiled points, on a shape it was not fitted on
        want = true_seconds(96, 64, 4, rows, "forward")
        assert gemm.seconds(96, 64, 4, rows, "forward") == pytest.approx(want, rel=0.2)


def test_pricing_uses_the_fitted_rate_where_one_exists(fitted):
    decode = Phase("decode", TINY_MOE, TINY_MOE.layers, 16, 64, dtype="fp32")
    train = Phase("train", TINY_MOE, TINY_MOE.layers, 8, 64, dtype="fp32", ep=2)
    with ProfileDB(fitted[0], readonly=True) as db:
        fitted = AnalyticalCostModel(db)
    catalog = AnalyticalCostModel()
    assert fitted.inputs("cpu")["moe experts"] == "fitted" and "moe experts" not in catalog.inputs("cpu")
    gemm = fitted.expert_gemms[("cpu", "fp32")]
    rows = 16 * 2 / 8
    assert fitted._grouped_rate(decode, "cpu") == pytest.approx(gemm.rate(TINY_MOE, rows, 1, training=False))
    # training: forward and backward of the rank's 4 experts, over the 3 passes' FLOPs
    rows = 8 * 64 * 2 * 2 / 8  # a rank's tokens × ep × top_k / experts
    fwd, bwd = (gemm.seconds(64, 48, 4, rows, p) for p in ("forward", "backward"))
    assert fitted._grouped_rate(train, "cpu") == pytest.approx(3 * moe.expert_flops(64, 48, 4, rows) / (fwd + bwd))
    # the simulated device runs experts far below the catalog CPU's curve: every MoE phase takes longer
    for phase in (decode, train):
        assert fitted.phase_time(phase, "cpu").seconds > catalog.phase_time(phase, "cpu").seconds
    dense = Phase("decode", PRESETS["tiny"], 2, 16, 64, dtype="fp32")
    assert fitted.phase_time(dense, "cpu").seconds == catalog.phase_time(dense, "cpu").seconds
    other = Phase("decode", TINY_MOE, TINY_MOE.layers, 16, 64, dtype="bf16")  # no bf16 rows: the catalog curve
    assert fitted.phase_time(other, "cpu").seconds == catalog.phase_time(other, "cpu").seconds


def test_an_invalid_entry_is_refused(fitted, tmp_path):
    fit = fitted[1]
    with ProfileDB(tmp_path / "p.db") as db:
        entry = {**fit.entry(), "features": ["compute_s"]}
        db.add_cost_model(moe.EXPERT_MODEL, moe.EXPERT_MODEL, fit.family, entry, fit.metrics())
        with pytest.warns(UserWarning, match="ignored 1 invalid moe.experts"):
            assert moe.load_expert_gemms(db) == {}
    bad = {**fit.entry(), "model": {"coef": [-1.0, 0, 0, 0, 0]}}
    with pytest.raises(ValueError):
        moe.validate_expert_entry({"params": bad})


def test_hetprof_fit_prints_and_stores_the_experts_model(tmp_path):
    path = tmp_path / "p.db"
    with ProfileDB(path) as db:
        _add_rows(db)
    runner = CliRunner(env={"COLUMNS": "200"})
    res = runner.invoke(cli, ["--db", str(path), "fit", "--task", "moe.experts"])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if "moe.experts" in x)
    assert "cpu" in line and "%" in line
    with ProfileDB(path, readonly=True) as db:
        assert set(moe.load_expert_gemms(db)) == {("cpu", "fp32")}
    empty = tmp_path / "dense.db"
    with ProfileDB(empty) as db:
        db.add_device(DeviceInfo(name="synthetic cpu", kind="cpu", catalog_type="cpu", host="synth"))
    res = runner.invoke(cli, ["--db", str(empty), "fit", "--task", "moe.experts"])
    assert res.exit_code != 0 and "hetprof profile --suite moe" in res.output


def test_coverage_names_missing_moe_rows_and_the_moe_suite(tmp_path):
    workload = WorkloadSpec.load(EXAMPLES / "workloads" / "grpo-tiny.yaml", ("models.actor=tiny-moe",))
    cluster = ClusterSpec.load(EXAMPLES / "clusters" / "cpu-local.yaml")
    with ProfileDB(tmp_path / "p.db") as db:
        lacking = missing_rows(db, workload, cluster, "hf")
        assert ("moe.experts of tiny-moe on cpu", "moe") in lacking["actor_train"]
        _add_rows(db, shapes=((TINY_MOE.hidden, TINY_MOE.moe.expert_ffn),))
        covered = missing_rows(db, workload, cluster, "hf")
        dense = missing_rows(db, WorkloadSpec.load(EXAMPLES / "workloads" / "grpo-tiny.yaml"), cluster, "hf")
    assert all(suite != "moe" for task in covered.values() for _, suite in task)
    assert all(suite != "moe" for task in dense.values() for _, suite in task)
