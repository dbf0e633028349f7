"""`hetprof export` and `hetprof plan --target`: plans made for a framework export, others are refused
in one line (exit 2), and every exported number traces back to the plan."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from hetprof.cli import cli
from hetprof.exporter import get_target
from hetprof.exporter.areal import allocation_mode
from hetprof.exporter.verl import settings
from hetprof.planner import session
from hetprof.specs import ClusterSpec, Plan, WorkloadSpec

CLUSTER = "examples/clusters/hetrl-multi-region.yaml"
SYNC, ASYNC = "examples/workloads/qwen3-8b-grpo-sync.yaml", "examples/workloads/qwen3-8b-grpo-async.yaml"
EVALS = 60


def make_plan(workload: str, search: str, target: str | None) -> Plan:
    return make_plan_on(CLUSTER, workload, search, target)


def make_plan_on(cluster: str, workload: str, search: str, target: str | None) -> Plan:
    """The best plan `search` finds in EVALS evaluations (with `target`: only what that framework expresses)."""
    options = session.PlanOptions(max_evals=EVALS, budget_s=600, backend="vllm", target=target)
    outcomes, sim = session.run_searches(ClusterSpec.load(cluster), WorkloadSpec.load(workload), search, options)
    best = session.best(outcomes, sim, options)
    return session.build_plan(sim, best.candidate, best.score, search=best.search)


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    return {"verl-sync": make_plan(SYNC, "verl", None), "verl-target-async": make_plan(ASYNC, "hetrl", "verl"),
            "areal-target-async": make_plan(ASYNC, "hetrl", "areal"), "free-async": make_plan(ASYNC, "hetrl", None)}


def write(plan: Plan, tmp_path, name: str = "plan.json") -> str:
    path = tmp_path / name
    plan.save(path)
    return str(path)


def test_verl_export_writes_overrides_trace_and_launch(plans, tmp_path):
    path = write(plans["verl-sync"], tmp_path)
    res = CliRunner().invoke(cli, ["export", path, "--to", "verl", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    overrides = (tmp_path / "out" / "overrides.txt").read_text().split()
    trace = (tmp_path / "out" / "trace.tsv").read_text().splitlines()[1:]
    assert [row.split("\t")[0] for row in trace] == [o.split("=")[0] for o in overrides]  # every number traced
    assert all(row.split("\t")[2] for row in trace)
    launch = (tmp_path / "out" / "launch.sh").read_text()
    hosts = {d.split(":")[0] for g in plans["verl-sync"].groups for d in g.devices}
    assert all(f"  {h}) ray start" in launch for h in hosts) and "verl.trainer.main_ppo" in launch


def test_a_plan_verl_cannot_express_is_refused_in_one_line(plans, tmp_path):
    path = write(plans["free-async"], tmp_path)
    res = CliRunner().invoke(cli, ["export", path, "--to", "verl", "--out", str(tmp_path / "out")])
    assert res.exit_code == 2
    line = res.output.strip()
    assert "\n" not in line and "verl:" in line and line.endswith("re-plan with --target verl")
    assert not (tmp_path / "out").exists()


def test_areal_refuses_verls_hybrid_engine(plans, tmp_path):
    with pytest.raises(Exception, match="areal: rollouts sharing their GPUs with other tasks are not expressible"):
        get_target("areal").check(plans["verl-sync"])


def test_targeted_plans_export(plans, tmp_path):
    for target in ("verl", "areal"):
        plan = plans[f"{target}-target-async"]
        get_target(target).check(plan)  # expressible as planned
        written = get_target(target).export(plan, "plan.json", tmp_path / target)
        assert {p.name for p in written} >= {"launch.sh", "trace.tsv"}


def test_verl_target_plans_at_least_as_fast_as_verl(plans):
    verl = make_plan(ASYNC, "verl", None)
    assert plans["verl-target-async"].predicted.iteration_s <= verl.predicted.iteration_s + 1e-9


def test_plan_target_prices_the_unrestricted_plan(tmp_path):
    out = tmp_path / "p.json"
    res = CliRunner().invoke(cli, ["plan", "-c", CLUSTER, "-w", ASYNC, "--target", "verl", "--max-evals", str(EVALS),
                                   "--out", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "unrestricted hetrl plan:" in res.output
    assert json.loads(out.read_text())["backend"] == "vllm"


def test_verl_settings_read_back_the_plan(plans):
    plan = plans["verl-target-async"]
    sets = {s.key: s.value for s in settings(plan)[0]}
    actor, gen = plan.task("actor_train"), plan.task("actor_gen")
    group = {g.name: g for g in plan.groups}
    assert sets["trainer.nnodes"] * sets["trainer.n_gpus_per_node"] == len(group[actor.group].devices)
    assert sets["actor_rollout_ref.rollout.tensor_model_parallel_size"] == gen.layout.tp


def test_areal_allocation_mode_names_each_pool(plans):
    plan = plans["areal-target-async"]
    mode = allocation_mode(plan)
    gen = plan.task("actor_gen").layout
    assert mode.startswith(f"vllm[rollout]:d{gen.dp}p{gen.pp}t{gen.tp}+")


def test_a_plan_file_whose_search_began_infeasible_loads(tmp_path):
    """The verl search's first trace point has no feasible plan (inf): JSON has no Infinity, so the
    plan file leaves it out rather than writing a file `hetprof export` cannot read."""
    out = tmp_path / "p.json"
    res = CliRunner().invoke(cli, ["plan", "-c", CLUSTER, "-w", ASYNC, "--search", "verl", "--max-evals", "50",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "Infinity" not in out.read_text()
    assert Plan.load(out).search_trace


@pytest.mark.parametrize("target", ["verl", "areal"])
def test_a_plan_with_a_host_held_optimizer_is_refused_in_one_line(plans, tmp_path, target):
    plan = plans["verl-sync" if target == "verl" else "areal-target-async"]
    workload = {**plan.workload, "training": {**plan.workload.get("training", {}), "optimizer_offload": 0.5}}
    path = write(dataclasses.replace(plan, workload=workload), tmp_path)
    res = CliRunner().invoke(cli, ["export", path, "--to", target, "--out", str(tmp_path / "out")])
    assert res.exit_code == 2
    line = res.output.strip()
    assert "\n" not in line and f"{target}: workload.training.optimizer_offload 0.5" in line
    assert not (tmp_path / "out").exists()
