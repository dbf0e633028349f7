"""`hetprof plan` end to end: reports, plan files, Gantt charts, what-ifs and clear errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers.cli import CLUSTER, WORKLOAD, write

from hetprof.cli import cli
from hetprof.costmodels import get_cost_model
from hetprof.planner.candidate import Candidate, even_layout
from hetprof.planner.memcheck import check_plan
from hetprof.planner.session import build_plan
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, Plan, WorkloadSpec


def run(*args: str):
    # the width a pipe gets (planner/cli.py), whatever COLUMNS the test process was started with
    return CliRunner().invoke(cli, ["plan", *args], env={"COLUMNS": "120"}, catch_exceptions=False)


@pytest.fixture
def specs(tmp_path):
    return write(tmp_path, "cluster.yaml", CLUSTER), write(tmp_path, "workload.yaml", WORKLOAD)


@pytest.fixture
def plan_file(tmp_path, specs):
    """A hand-made plan: generation on the L4s, reference and training on the A100s."""
    cluster, workload = ClusterSpec.load(specs[0]), WorkloadSpec.load(specs[1])
    sim = Simulator(cluster, workload, get_cost_model("analytical"))
    a, b = ("a:0", "a:1"), ("b:0", "b:1")
    cand = Candidate([("actor_gen",), ("ref_infer", "actor_train")], [b, a],
                     {"actor_gen": even_layout("actor_gen", b, 1, 1, 28),
                      "ref_infer": even_layout("ref_infer", a, 1, 1, 28),
                      "actor_train": even_layout("actor_train", a, 1, 1, 28)})
    path = tmp_path / "hand.json"
    build_plan(sim, cand, search="by hand").save(path)
    return str(path)


def test_evaluate_a_plan_file_writes_report_plan_and_gantt(tmp_path, specs, plan_file):
    out, png = tmp_path / "out" / "plan.json", tmp_path / "plan.png"
    res = run("-c", specs[0], "-w", specs[1], "--evaluate", plan_file, "--out", str(out), "--gantt", str(png))
    assert res.exit_code == 0, res.output
    for phrase in ("by hand plan", "groups", "actor_gen", "critical path", "bottleneck", "memory headroom",
                   "A100-40GB", "L4", "$", "independent memory check: every GPU holds"):
        assert phrase in res.output
    plan = Plan.load(out)
    plan.validate()
    assert check_plan(plan) == []
    assert plan.predicted.iteration_s > 0 and plan.predicted.bottleneck
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_what_if_replans_the_changed_cluster(specs, plan_file):
    res = run("-c", specs[0], "-w", specs[1], "--evaluate", plan_file,
              "--what-if", "link east:west 1ms 100Gbps", "--what-if", "remove 2xL4")
    assert res.exit_code == 0, res.output
    assert "what if link east:west 1ms 100Gbps?" in res.output
    assert "after: remove 2xL4" in res.output and "device 'b:0'" in res.output


def test_a_region_without_a_link_is_a_clear_error(tmp_path, specs):
    cluster = write(tmp_path, "islands.yaml", {**CLUSTER, "network": {}})
    res = run("-c", cluster, "-w", specs[1], "--search", "verl")
    assert res.exit_code == 3
    assert "no network link between regions east <-> west" in res.output


def test_a_model_that_fits_nowhere_is_a_clear_error(tmp_path, specs):
    workload = write(tmp_path, "big.yaml", {**WORKLOAD, "models": {"actor": "qwen3-14b"}})
    res = run("-c", specs[0], "-w", workload, "--max-tp", "1", "--max-pp", "1")
    assert res.exit_code == 3
    assert "fits on no GPU" in res.output and "qwen3-14b" in res.output


@pytest.mark.parametrize("args, phrase", [
    (["--objective", "throughput-under-budget"], "--budget"),
    (["--budget-s", "0"], "--budget-s"),
    (["--what-if", "teleport 8xH100"], "--what-if"),
    (["--search", "nonesuch"], "nonesuch"),
])
def test_bad_options_are_refused_by_name(specs, plan_file, args, phrase):
    res = run("-c", specs[0], "-w", specs[1], *args)
    assert res.exit_code == 2, res.output
    assert phrase in res.output


def test_bad_spec_names_the_file_and_field(tmp_path, specs):
    broken = write(tmp_path, "broken.yaml", {**CLUSTER, "hosts": [{"name": "a", "gpus": {"type": "Z80"}}]})
    res = run("-c", broken, "-w", specs[1])
    assert res.exit_code == 2 and "broken.yaml" in res.output and "hosts[0].gpus.type" in res.output


def test_search_writes_a_plan_the_checker_accepts(tmp_path, specs):
    out = tmp_path / "plan.json"
    res = run("-c", specs[0], "-w", specs[1], "--search", "verl", "--budget-s", "20", "--seed", "1",
              "--out", str(out))
    assert res.exit_code == 0, res.output
    plan = Plan.load(out)
    assert plan.search == "verl" and plan.seed == 1
    assert check_plan(plan) == []
    assert json.loads(out.read_text())["predicted"]["iteration_s"] == pytest.approx(plan.predicted.iteration_s)


def test_all_searches_side_by_side(specs):
    res = run("-c", specs[0], "-w", specs[1], "--search", "all", "--budget-s", "3", "--max-evals", "60")
    assert res.exit_code == 0, res.output
    assert "ratios against verl" in res.output
    for name in ("hetrl", "verl", "streamrl", "ilp"):
        assert name in res.output


def test_same_seed_same_plan(tmp_path, specs):
    plans = []
    for name in ("one.json", "two.json"):
        out = tmp_path / name
        res = run("-c", specs[0], "-w", specs[1], "--search", "hetrl", "--seed", "5", "--max-evals", "40",
                  "--budget-s", "60", "--out", str(out))
        assert res.exit_code == 0, res.output
        data = json.loads(out.read_text())
        plans.append({k: data[k] for k in ("groups", "tasks", "predicted", "seed", "search")})
    assert plans[0] == plans[1]


def test_a_plan_over_budget_is_refused_with_its_price(specs, plan_file):
    res = run("-c", specs[0], "-w", specs[1], "--evaluate", plan_file,
              "--objective", "throughput-under-budget", "--budget", "0.5")
    assert res.exit_code == 3
    assert "over the $0.50/h budget" in res.output
    ok = run("-c", specs[0], "-w", specs[1], "--evaluate", plan_file, "--objective", "cost")
    assert ok.exit_code == 0 and "per iteration" in ok.output
