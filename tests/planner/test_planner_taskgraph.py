"""The RL task graph: which passes a workload has, and what each costs in time, memory and the plan."""

from __future__ import annotations

import pytest

from hetprof.costmodels import get_cost_model
from hetprof.errors import SpecError
from hetprof.planner.candidate import Candidate, even_layout
from hetprof.planner.graph import build_graph
from hetprof.planner.memcheck import device_peaks
from hetprof.planner.session import build_plan
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, Plan, TaskLayout, WorkloadSpec, workload_tasks

MODEL, LAYERS = "qwen3-0.6b", 28
DEVICES = tuple(f"h:{i}" for i in range(4))


def workload(algorithm: str = "grpo", reward: bool = False, **training) -> WorkloadSpec:
    models = {"actor": MODEL, **({"critic": MODEL} if algorithm == "ppo" else {}),
              **({"reward": MODEL} if reward else {})}
    return WorkloadSpec.from_dict({"algorithm": algorithm, "models": models, "prompts_per_step": 8,
                                   "responses_per_prompt": 4, "prompt_len": {"mean": 128},
                                   "response_len": {"mean": 256}, "training": training})


def cluster() -> ClusterSpec:
    return ClusterSpec.from_dict({"name": "one", "hosts": [{"name": "h", "gpus": {"type": "A100-80GB", "count": 4}}]})


@pytest.mark.parametrize(("wl", "tasks"), [
    (workload(), ["actor_gen", "actor_logprob", "ref_infer", "actor_train"]),
    (workload(kl_coef=0.0), ["actor_gen", "actor_logprob", "actor_train"]),            # DAPO-style: no reference
    (workload(use_rollout_logprobs=True), ["actor_gen", "ref_infer", "actor_train"]),  # no recompute
    (workload(kl_coef=0.0, use_rollout_logprobs=True), ["actor_gen", "actor_train"]),
    (workload(reward=True), ["actor_gen", "actor_logprob", "ref_infer", "reward_infer", "actor_train"]),
    (workload("ppo"), ["actor_gen", "actor_logprob", "ref_infer", "critic_infer", "actor_train", "critic_train"]),
    (workload("ppo", kl_coef=0.0), ["actor_gen", "actor_logprob", "critic_infer", "actor_train", "critic_train"]),
])
def test_the_passes_a_workload_has(wl, tasks):
    assert workload_tasks(wl) == tasks
    graph = build_graph(wl)
    assert list(graph.tasks) == tasks
    names = {e.name for e in graph.edges}
    assert ("scores:actor_logprob->actor_train" in names) == ("actor_logprob" in tasks)
    assert ("scores:ref_infer->actor_train" in names) == ("ref_infer" in tasks)
    assert ("rewards:reward_infer->actor_train" in names) == ("reward_infer" in tasks)
    assert ("weights:critic_train->critic_infer" in names) == ("critic_train" in tasks)
    assert not any(e.backward and e.dst == "actor_logprob" for e in graph.edges)  # it reads the trainer's weights


def colocated(sim: Simulator) -> Candidate:
    lays = {t: even_layout(t, DEVICES, 1, 1, LAYERS) for t in sim.tasks}
    return Candidate([tuple(sim.tasks)], [DEVICES], lays)


def test_the_log_prob_pass_costs_time_beside_the_trainer_but_no_weights():
    cm = get_cost_model("analytical")
    on = Simulator(cluster(), workload(kl_coef=0.0), cm)
    off = Simulator(cluster(), workload(kl_coef=0.0, use_rollout_logprobs=True), cm)
    assert "actor_logprob" not in on.tasks  # never placed by a search: it follows actor_train
    s_on, s_off = on.evaluate(colocated(on)), off.evaluate(colocated(off))
    assert s_on.feasible and s_off.feasible
    logprob = s_on.task_seconds["actor_logprob"]
    assert logprob > 0 and s_on.iteration_s == pytest.approx(s_off.iteration_s + logprob)
    inference_alone = on.task_eval(even_layout("actor_logprob", DEVICES, 1, 1, LAYERS)).memory["h:0"]
    # its working set is smaller than the trainer's, and its weights are the trainer's: no extra bytes
    assert inference_alone.weights > 0
    assert s_on.memory_peak == pytest.approx(s_off.memory_peak)


def test_a_reference_model_is_held_only_when_kl_is_used():
    cm = get_cost_model("analytical")
    kl = Simulator(cluster(), workload(), cm)
    free = Simulator(cluster(), workload(kl_coef=0.0), cm)
    s_kl, s_free = kl.evaluate(colocated(kl)), free.evaluate(colocated(free))
    ref = kl.task_eval(even_layout("ref_infer", DEVICES, 1, 1, LAYERS)).memory["h:0"]
    assert s_kl.memory_peak["h:0"] - s_free.memory_peak["h:0"] == pytest.approx(ref.weights)
    assert "ref_infer" in s_kl.task_seconds and "ref_infer" not in s_free.task_seconds


def test_the_plan_records_the_pass_beside_its_trainer_and_refuses_it_elsewhere():
    sim = Simulator(cluster(), workload("ppo"), get_cost_model("analytical"))
    cand = colocated(sim)
    plan = build_plan(sim, cand)
    placed = {t.task: t for t in plan.tasks}
    assert set(placed) == set(workload_tasks(sim.workload))
    assert placed["actor_logprob"].group == placed["actor_train"].group
    assert placed["actor_logprob"].devices() == placed["actor_train"].devices()
    assert Candidate.of_plan(Plan.from_dict(plan.to_dict())) == cand  # followers are derived, not searched
    # the independent checker agrees the pass adds no weights beside its trainer
    assert device_peaks(plan)["h:0"] == pytest.approx(sim.evaluate(cand).memory_peak["h:0"], rel=0.05)
    data = plan.to_dict()
    moved = next(t for t in data["tasks"] if t["task"] == "actor_logprob")
    moved["tasklets"] = [{**k, "devices": ["h:3"]} for k in moved["tasklets"][:1]]
    moved["tasklets"][0]["batch_share"] = 1.0
    moved["layout"]["dp"] = 1
    with pytest.raises(SpecError, match="actor_logprob on actor_train's group, devices and layout"):
        Plan.from_dict(data).validate()


def test_sharding_is_recorded_in_the_plan_and_read_back():
    sim = Simulator(cluster(), workload(kl_coef=0.0), get_cost_model("analytical"))
    cand = colocated(sim)
    train = cand.layout("actor_train")
    sharded = cand.replace_layout(TaskLayout(train.task, 1, 1, train.replicas, train.shares, train.layer_splits,
                                             "fsdp"))
    plan = build_plan(sim, sharded)
    assert {t.task: t.layout.sharding for t in plan.tasks} == {
        "actor_gen": "none", "actor_logprob": "none", "actor_train": "fsdp"}
    assert Candidate.of_plan(Plan.from_dict(plan.to_dict())) == sharded
    data = plan.to_dict()
    next(t for t in data["tasks"] if t["task"] == "actor_gen")["layout"]["sharding"] = "fsdp"
    with pytest.raises(SpecError, match="only training tasks shard"):
        Plan.from_dict(data).validate()
    data["tasks"][0]["layout"]["sharding"] = "zero9"
    with pytest.raises(SpecError, match="sharding"):
        Plan.from_dict(data)
