"""`hetprof plan` plans within what `hetprof run` carries out, by the executor's own rules."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from hetprof.cli import cli
from hetprof.costmodels import Placement, get_cost_model
from hetprof.errors import InfeasibleError
from hetprof.executor.launch.checks import check_supported
from hetprof.planner.candidate import Candidate, even_layout
from hetprof.planner.search import SearchContext, get_search, layouts
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, Plan, WorkloadSpec, executable
from hetprof.specs.models import PRESETS

WORKLOAD = {"name": "ppo-4b", "algorithm": "ppo", "mode": "sync",
            "models": {"actor": "qwen3-4b", "critic": "qwen3-4b"}, "prompts_per_step": 16,
            "responses_per_prompt": 4, "prompt_len": {"mean": 256, "max": 512},
            "response_len": {"mean": 256, "max": 512}, "training": {"recompute": True}}


def _cluster() -> ClusterSpec:
    # two GPU types over two hosts: balanced pipelines give their replicas different layer splits
    return ClusterSpec.from_dict({"name": "mixed", "hosts": [
        {"name": "a", "gpus": {"type": "A100-80GB", "count": 4}, "region": "r"},
        {"name": "b", "gpus": {"type": "L40S", "count": 4}, "region": "r"}]})


def _sim(runnable: bool) -> Simulator:
    return Simulator(_cluster(), WorkloadSpec.from_dict(WORKLOAD), get_cost_model("analytical"),
                     executable=runnable)


def test_degrees_follow_the_executors_rules():
    free, runnable = _sim(False), _sim(True)
    assert layouts.degree_limits(free.planning, "actor_gen", 8, 4)[1] == 4
    assert layouts.degree_limits(runnable.planning, "actor_gen", 8, 4)[1] == 1
    assert layouts.degree_limits(runnable.planning, "critic_infer", 8, 4)[1] == 1
    assert layouts.degree_limits(runnable.planning, "actor_train", 8, 4)[1] == 4
    m = PRESETS["qwen3-4b"]  # 32 heads, 8 KV heads: TP16 would split no KV head
    assert all(executable.tp_divides(m, tp) for tp in layouts.degree_limits(runnable.planning, "actor_train", 16, 1)[0])
    assert 16 not in layouts.degree_limits(runnable.planning, "actor_train", 16, 1)[0]


def test_a_layout_the_executor_refuses_is_infeasible_with_its_reason():
    sim = _sim(True)
    devs = [d for d in sim.devices]
    lay = {t: even_layout(t, devs, 1, 1, 36) for t in sim.tasks}
    lay["actor_gen"] = even_layout("actor_gen", devs, 1, 2, 36)
    problems = sim.structure_problems(Candidate([tuple(sim.tasks)], [devs], lay))
    assert any("runs no pipeline stages for actor_gen" in p and "--any-layout" in p for p in problems)
    assert not _sim(False).structure_problems(Candidate([tuple(sim.tasks)], [devs], lay))


def test_training_replicas_share_one_layer_split():
    sim = _sim(True)
    order = layouts.canonical_order(sim.planning, list(sim.devices))
    mixed = [order[0], order[4], order[5], order[1]]  # replicas A100→L40S and L40S→A100
    free = layouts.build_layout(_sim(False).planning, "actor_train", mixed, 1, 2)
    held = layouts.build_layout(sim.planning, "actor_train", mixed, 1, 2)
    assert len(set(free.layer_splits)) == 2  # each replica balanced to its own stages
    assert len(set(held.layer_splits)) == 1 and held.dp == 2


def test_a_generator_that_fits_only_in_stages_is_refused_naming_the_rule():
    small = ClusterSpec.from_dict({"name": "t4s", "hosts": [{"name": "h", "gpus": {"type": "T4", "count": 4}}]})
    wl = WorkloadSpec.from_dict({**WORKLOAD, "models": {"actor": "qwen3-14b", "critic": "qwen3-14b"}})
    with pytest.raises(InfeasibleError, match="^actor_train"):  # generation fits in 4 stages; training nowhere
        Simulator(small, wl, get_cost_model("analytical")).check_fits(max_tp=1, max_pp=4)
    with pytest.raises(InfeasibleError, match="^actor_gen .*no pipeline stages .*runs none for actor_gen"):
        Simulator(small, wl, get_cost_model("analytical"), executable=True).check_fits(max_tp=1, max_pp=4)


def test_searched_plans_are_ones_the_executor_accepts():
    sim = _sim(True)
    for name in ("hetrl", "verl"):
        res = get_search(name)(SearchContext(planning=sim.planning, seed=0, max_pp=4, max_evals=200, time_budget_s=60)).run()
        assert res.candidate is not None
        for task, lay in res.candidate.layouts:
            assert not executable.layout_problems(task, sim.graph.kind_of(task), sim.graph.model_of(task),
                                                  lay.tp, lay.pp, lay.layer_splits), (name, task, lay)


def test_plan_command_writes_plans_the_executor_accepts(tmp_path):
    cluster, workload = tmp_path / "c.json", tmp_path / "w.json"
    cluster.write_text(json.dumps({"name": "mixed", "hosts": [
        {"name": "a", "gpus": {"type": "A100-80GB", "count": 4}, "region": "r"},
        {"name": "b", "gpus": {"type": "L40S", "count": 4}, "region": "r"}]}))
    workload.write_text(json.dumps(WORKLOAD))
    out = tmp_path / "plan.json"
    done = CliRunner().invoke(cli, ["--db", str(tmp_path / "none.db"), "plan", "-c", str(cluster), "-w",
                                     str(workload), "--max-evals", "150", "--budget-s", "60", "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert check_supported(Plan.from_dict(json.loads(out.read_text())), cuda_available=True) == "nccl"


def test_expected_longest_is_what_a_batch_pads_to():
    from hetprof.specs.workload import LengthDist

    fixed = LengthDist(mean=100.0, max=120)
    assert fixed.expected_longest(64) == 100.0
    tail = LengthDist(mean=256.0, max=1024, dist="lognormal", std=128.0)
    rng = np.random.default_rng(123)
    brute = tail.sample(64 * 20_000, rng).reshape(20_000, 64).max(axis=1).mean()
    assert tail.expected_longest(64) == pytest.approx(brute, rel=0.01)
    grows = [tail.expected_longest(k) for k in (1, 4, 64, 4096)]
    assert grows == sorted(grows) and grows[0] == pytest.approx(256, rel=0.02) and grows[-1] <= 1024
    assert tail.expected_longest(64) == tail.expected_longest(64)  # seeded: planner and profiler agree


def test_runnable_plans_price_the_widths_the_run_pads_to():
    wl = WorkloadSpec.from_dict({**WORKLOAD, "prompt_len": {"mean": 256, "max": 1024, "dist": "lognormal", "std": 128},
                                 "response_len": {"mean": 256, "max": 1024, "dist": "lognormal", "std": 200}})
    cm = get_cost_model("analytical")
    padded = Simulator(_cluster(), wl, cm, executable=True)
    packed = Simulator(_cluster(), wl, cm)
    longest_prompt = wl.prompt_len.expected_longest(wl.prompts_per_step)
    longest_response = wl.response_len.expected_longest(wl.sequences_per_step)
    assert padded.costs.basis.sequence_prompt == longest_prompt and padded.costs.basis.sequence_response == longest_response
    assert packed.costs.basis.sequence_prompt == 256 and packed.costs.basis.sequence_response == 256
    dev = next(iter(padded.devices))
    batch = 16
    for sim, prompt, response in ((padded, longest_prompt, longest_response), (packed, 256.0, 256.0)):
        step = cm.task_time(sim.costs.basis.work("actor_train", batch // wl.mini_batches, None, response, prompt),
                            Placement(sim.devices[dev].type, 1)).seconds
        assert sim.replica_seconds("actor_train", [dev], 1, 1, batch) == pytest.approx(
            step * wl.mini_batches * wl.ppo_epochs)
    # a generator replica pads its own prompts: fewer prompts, narrower than the whole step
    assert 256 < padded.costs.basis.generation_prompt(16) < longest_prompt
    # memory keeps the declared means, so the independent checker recomputes the same bytes
    assert padded.costs.memory("actor_train", "A100-80GB", 1, 36, 8) == packed.costs.memory(
        "actor_train", "A100-80GB", 1, 36, 8)


def test_the_profilers_workload_grid_times_the_padded_widths():
    from hetprof.profiler.workloadgrid import workload_points

    wl = WorkloadSpec.from_dict({**WORKLOAD, "prompt_len": {"mean": 256, "max": 1024, "dist": "lognormal", "std": 128}})
    pts = workload_points(wl, 2)
    whole = round(wl.prompt_len.expected_longest(wl.prompts_per_step)
                  + wl.response_len.expected_longest(wl.sequences_per_step))
    assert (32, whole) in pts["train"] and (64, whole) in pts["prefill"]
    gen = round(wl.prompt_len.expected_longest(32 // wl.responses_per_prompt))
    assert (32, gen) in pts["generate"] and (32, gen) in pts["prefill"] and (32, gen + 1) in pts["decode"]
