"""Generation replicas of different TP (AReaL-Hex's per-GPU-type rollout TP), from the plan file to the search.

A generation task's replicas may differ in TP (the plan's `layout.replica_tp`, each tasklet holding
its replica's degree of devices); every other task keeps one degree. The simulator, the memory check,
the executor's topology and the run rows read each replica's own degree; the arealhex baseline's
phase-1 MILP picks a degree per GPU type.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_planner_search_baselines import run, sim_of

from hetprof.costmodels.runrows import phase_row
from hetprof.errors import ExecutionError, SpecError
from hetprof.executor.launch.checks import check_supported
from hetprof.executor.launch.handwritten_plan import handwritten_plan
from hetprof.executor.parallel.topology import Topology
from hetprof.executor.records.run_log import work_description
from hetprof.planner.candidate import Candidate
from hetprof.planner.memcheck import check_plan
from hetprof.planner.search import layouts
from hetprof.planner.search.arealhex import rollout_layout, rollout_milp, rollout_options
from hetprof.planner.session import build_plan
from hetprof.specs import Plan, TaskLayout, WorkloadSpec

ROOT = Path(__file__).resolve().parents[2]
# Rollout pool: the 16 GB T4 cannot hold Qwen3-8B's weights at TP1 (it needs TP2), while the A100-80GB
# replicas serve a 1024-sequence step fastest at TP1; H100s train.
MIXED = [("t", "H100-SXM", 4, "us"), ("a", "A100-80GB", 2, "us"), ("b", "T4", 2, "us")]


def mixed_plan(degrees: tuple[list[str], ...] = (["h:0"], ["h:1", "h:2"])) -> Plan:
    wl = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    cluster = {"name": "c", "hosts": [{"name": "h", "gpus": {"type": "cpu", "count": 3}}]}
    return handwritten_plan(cluster, wl, {"actor_gen": list(degrees), "ref_infer": ["h:0"], "actor_train": ["h:0"]},
                            shares={"actor_gen": [0.5] * len(degrees)})


def test_plan_file_names_each_generation_replicas_tp_and_old_plans_load_unchanged(tmp_path):
    plan = mixed_plan()
    plan.save(tmp_path / "p.json")
    loaded = Plan.load(tmp_path / "p.json")
    gen = loaded.task("actor_gen").layout
    assert (gen.tp, gen.tp_varies, [gen.tp_of(r) for r in range(gen.dp)]) == (2, True, [1, 2])
    assert loaded.to_dict()["tasks"][0]["layout"]["replica_tp"] == [1, 2]  # the file names each replica's
    assert str(gen) == "DP2(1×TP1+1×TP2)×PP1" and gen.world == 3
    assert "replica_tp" not in loaded.to_dict()["tasks"][1]["layout"]  # uniform tasks write what they always did
    assert check_plan(loaded) == [] and check_supported(loaded) == "gloo"


@pytest.mark.parametrize("edit, field, expected", [
    (lambda d: d["tasks"][0]["layout"].update(replica_tp=[2, 2]), "tasks[0].tasklets[0].devices",
     "replica_tp[0] = 2 devices"),
    (lambda d: d["tasks"][0]["layout"].update(tp=4), "tasks[0].layout.tp", "the largest of replica_tp (2)"),
    (lambda d: d["tasks"][0]["layout"].update(replica_tp=[1]), "tasks[0].layout.replica_tp",
     "one TP degree per replica (dp = 2)"),
    (lambda d: d["tasks"][-1]["layout"].update(replica_tp=[1]), "tasks[3].layout.replica_tp",
     "absent (only a generation task's replicas may differ"),
])
def test_a_bad_replica_tp_is_one_error_naming_the_field_and_the_file(tmp_path, edit, field, expected):
    data = mixed_plan().to_dict()
    edit(data)
    with pytest.raises(SpecError) as err:
        Plan.from_dict(data, file="plan.json")
    assert err.value.field == field and expected in err.value.expected and "plan.json" in str(err.value)


def test_handwritten_plans_let_only_generation_replicas_differ():
    wl = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    cluster = {"name": "c", "hosts": [{"name": "h", "gpus": {"type": "cpu", "count": 3}}]}
    with pytest.raises(SpecError, match="only generation replicas may differ"):
        handwritten_plan(cluster, wl, {"actor_gen": ["h:0"], "ref_infer": ["h:0"],
                                       "actor_train": [["h:0"], ["h:1", "h:2"]]})


def test_executor_topology_gives_each_generation_replica_its_own_tp_ranks():
    plan = mixed_plan()
    gen = Topology(plan, {"h:0": 0, "h:1": 1, "h:2": 2}).tasks["actor_gen"]
    assert (gen.tp, gen.tp_of(0), gen.tp_of(1)) == (2, 1, 2)
    assert gen.position(0) == (0, 0, 0) and gen.position(2) == (1, 0, 1)
    assert [gen.rank_at(1, 0, j) for j in range(gen.tp_of(1))] == [1, 2]


def test_run_refuses_a_replica_whose_own_tp_does_not_divide_the_heads():
    wl = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    cluster = {"name": "c", "hosts": [{"name": "h", "gpus": {"type": "cpu", "count": 5}}]}
    plan = handwritten_plan(cluster, wl, {"actor_gen": [["h:0"], ["h:1", "h:2", "h:3", "h:4"]], "ref_infer": ["h:0"],
                                          "actor_train": ["h:0"]})
    with pytest.raises(ExecutionError, match=r"actor_gen has layout DP2\(1×TP1\+1×TP4\)×PP1: TP4 must divide"):
        check_supported(plan)


def test_run_rows_take_each_devices_own_tp():
    work = work_description(mixed_plan())["actor_gen"]
    assert work["device_tp"] == {"h:0": 1, "h:1": 2, "h:2": 2}
    rows = [phase_row({"run": "r", "iteration": 0, "task": "actor_gen"}, work,
                      {"kind": "decode", "seconds": 0.1, "batch": 2, "tokens": 8, "device_type": "cpu", "device": d}, 0)
            for d in ("h:0", "h:2")]
    assert [r["tp"] for r in rows] == [1, 2]


@pytest.fixture(scope="module")
def mixed_sim():
    return sim_of(MIXED, ("1ms", "10Gbps"), mode="async", model="qwen3-8b", prompts=256)


@pytest.fixture(scope="module")
def arealhex_result(mixed_sim):
    return run(mixed_sim, "arealhex")


def test_simulator_prices_and_checks_each_generation_replica_at_its_own_tp(mixed_sim, arealhex_result):
    sim = mixed_sim
    lay = TaskLayout("actor_gen", 2, 1, (("a:0",), ("a:1",), ("b:0", "b:1")), (0.4, 0.4, 0.2), ((36,),) * 3)
    judged = sim.task_eval(lay)
    assert judged.violations == () and lay.describe() == "DP3(2×TP1+1×TP2)×PP1"
    for index, devices, gpu, tp in ((0, ("a:0",), "A100-80GB", 1), (2, ("b:0", "b:1"), "T4", 2)):
        batch = max(1, round(lay.shares[index] * sim.costs.basis.sequences))
        assert judged.memory[devices[0]] == sim.costs.memory("actor_gen", gpu, tp, 36, batch)
        assert judged.replica_seconds[index] == sim.replica_seconds("actor_gen", devices, tp, 1, batch, (36,))
    uneven = TaskLayout("ref_infer", 2, 1, (("t:0",), ("t:1", "t:2")), (0.5, 0.5), ((36,),) * 2)
    score = sim.evaluate(arealhex_result.candidate.replace_layout(uneven))
    assert "ref_infer: replica 0 has 1 devices, tp*pp = 2 expected" in score.violations  # only generation may differ


def test_arealhex_phase1_picks_tp1_on_the_large_type_and_tp2_where_memory_needs_it(mixed_sim):
    sim = mixed_sim
    pool = [d for d in sim.devices if not d.startswith("t:")]
    options = {(o.gpu_type, o.tp) for o in rollout_options(sim.planning, pool, 8)}
    assert ("T4", 1) not in options and {("T4", 2), ("A100-80GB", 1), ("A100-80GB", 2)} <= options
    chosen = rollout_milp(sim.planning, pool, 8)
    assert {t: (o.tp, n) for t, (o, n) in chosen.items()} == {"A100-80GB": (1, 2), "T4": (2, 1)}
    mixed = rollout_layout(sim.planning, chosen)
    assert mixed.tp_degrees() == (1, 1, 2) and all(s > 0 for s in mixed.shares)
    # better than either single degree over the same pool (TP1 leaves the T4s out, TP2 halves the A100s' replicas)
    order = layouts.canonical_order(sim.planning, pool)
    for tp in (1, 2):
        uniform = layouts.build_layout(sim.planning, "actor_gen", order, tp, 1)
        assert sim.task_eval(mixed).seconds < sim.task_eval(uniform).seconds


def test_arealhex_plan_with_per_type_tp_round_trips_through_the_plan_file(mixed_sim, arealhex_result, tmp_path):
    sim, res = mixed_sim, arealhex_result
    gen = res.candidate.layout("actor_gen")
    assert sorted(gen.tp_degrees()) == [1, 1, 2]
    plan = build_plan(sim, res.candidate, res.score, search="arealhex")
    plan.save(tmp_path / "plan.json")
    loaded = Plan.load(tmp_path / "plan.json")
    assert loaded.task("actor_gen").layout.tp_varies and check_plan(loaded) == []
    assert Candidate.of_plan(loaded) == res.candidate
    assert sim.evaluate(Candidate.of_plan(loaded)).iteration_s == res.score.iteration_s
