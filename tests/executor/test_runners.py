"""Task runners: the registry answers every task, a rank builds only its tasks' runners, and each
runner family does its work on the tiny model in one process (a one-rank gloo group)."""

from __future__ import annotations

import types
from copy import deepcopy
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hetprof.executor.launch.handwritten_plan import handwritten_plan
from hetprof.executor.loop.leader import Leader
from hetprof.executor.loop.timing import StepTiming
from hetprof.executor.models.modeling import unwrap
from hetprof.executor.options import RunOptions
from hetprof.executor.parallel.process_groups import ProcessGroups
from hetprof.executor.parallel.topology import Topology
from hetprof.executor.records.iteration_report import IterationReport, RankInfo
from hetprof.executor.runners.base import RunnerBase, TaskRunner
from hetprof.executor.runners.context import RankContext
from hetprof.executor.runners.generator import GenerationStep
from hetprof.executor.runners.registry import RUNNERS, build_runners
from hetprof.executor.runners.scorers import score
from hetprof.runtime.distributed import file_init_method, leave_process_group
from hetprof.specs import ClusterSpec, Plan, WorkloadSpec
from hetprof.specs.vocabulary import Task

ROOT = Path(__file__).resolve().parents[2]
DEVICE = "localhost:0"


def test_every_task_has_a_runner_that_speaks_the_protocol():
    assert set(Task) <= set(RUNNERS.names())
    for task in Task:
        runner = RUNNERS.get(task)
        assert all(callable(getattr(runner, m, None)) for m in ("run", "spans", "priced", "close")), task


def test_a_rank_builds_only_its_tasks_runners_and_each_after_those_it_uses(monkeypatch):
    built = []

    class Fake(RunnerBase):
        def __init__(self, ctx, task, peers):
            built.append((task, sorted(peers)))

    class UsesTrainer(Fake):
        after = (Task.ACTOR_TRAIN,)

    for task in Task:
        monkeypatch.setitem(RUNNERS.entries, task, UsesTrainer if task == Task.ACTOR_LOGPROB else Fake)
    ctx = types.SimpleNamespace(tasks=[Task.ACTOR_LOGPROB, Task.ACTOR_TRAIN], rank=1)
    runners = build_runners(ctx)
    assert list(runners) == [Task.ACTOR_LOGPROB, Task.ACTOR_TRAIN]  # the plan's order
    assert built == [(Task.ACTOR_TRAIN, []), (Task.ACTOR_LOGPROB, [Task.ACTOR_TRAIN])]


def test_a_runner_whose_peer_is_on_another_rank_is_refused(monkeypatch):
    class UsesTrainer(RunnerBase):
        after = (Task.ACTOR_TRAIN,)

    monkeypatch.setitem(RUNNERS.entries, Task.ACTOR_LOGPROB, UsesTrainer)
    with pytest.raises(Exception, match="needs actor_train on the same rank"):
        build_runners(types.SimpleNamespace(tasks=[Task.ACTOR_LOGPROB], rank=0))


@pytest.fixture(scope="module")
def rank(tmp_path_factory):
    """Every task of a PPO plan with a reward model on one CPU rank."""
    tmp = tmp_path_factory.mktemp("runners")
    cluster = ClusterSpec.from_dict({"name": "cpu", "hosts": [{"name": "localhost", "gpus": {"type": "cpu",
                                                                                              "count": 1}}]})
    base = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    base.update({"algorithm": "ppo", "prompts_per_step": 2, "responses_per_prompt": 2, "ppo_epochs": 1,
                 "mini_batches": 1, "models": {"actor": "tiny", "critic": "tiny", "reward": "tiny"}})
    placement = {t: [DEVICE] for t in (Task.ACTOR_GEN, Task.REF_INFER, Task.REWARD_INFER, Task.CRITIC_INFER,
                                       Task.ACTOR_TRAIN, Task.CRITIC_TRAIN)}
    path = tmp / "plan.json"
    handwritten_plan(cluster, base, placement).save(path)
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=file_init_method(tmp), rank=0, world_size=1)
    topo = Topology(Plan.load(path), {DEVICE: 0})
    options = RunOptions(plan_path=str(path), iterations=2, quiet=True, timeout_s=60)
    ctx = RankContext.build(topo.plan.workload_spec(), options, topo, ProcessGroups.build(topo), 0,
                            torch.device("cpu"))
    yield ctx, build_runners(ctx)
    leave_process_group()


def _rollout(ctx, runners):
    out = runners[Task.ACTOR_GEN].run(GenerationStep(batch=0, version=3))
    batch = {**out}
    for task in [Task.ACTOR_LOGPROB, *(t for t in (Task.REF_INFER, Task.REWARD_INFER, Task.CRITIC_INFER))]:
        if task in runners:
            batch.update(runners[task].run({k: out[k] for k in ("input_ids", "attention_mask", "response_mask")}))
    return batch


def test_the_rank_holds_a_runner_for_each_of_its_tasks(rank):
    ctx, runners = rank
    assert list(runners) == ctx.tasks
    assert set(runners) == set(Task)  # the plan put every task here, the log-prob pass with the trainer
    assert all(isinstance(r, TaskRunner) for r in runners.values())
    assert all(runners[t].placement is ctx.topo.tasks[t] for t in runners)


def test_generate_infer_and_score_give_the_batch_the_advantages_read(rank):
    ctx, runners = rank
    batch = _rollout(ctx, runners)
    rows = ctx.workload.prompts_per_step * ctx.workload.responses_per_prompt
    assert batch["input_ids"].shape[0] == rows and batch["version"].tolist() == [3] * rows
    assert batch["prompt_index"].tolist() == [0, 0, 1, 1]
    width = batch["input_ids"].shape[1]
    assert batch["ref_logprobs"].shape == batch["values"].shape == (rows, width - 1)
    assert batch["rm_scores"].shape == (rows,)
    scored = score(ctx, batch, ctx.prompts(0))
    rule = score(ctx, {k: v for k, v in batch.items() if k != "rm_scores"}, ctx.prompts(0))
    torch.testing.assert_close(scored["rewards"] - rule["rewards"], batch["rm_scores"])
    fields = Leader(ctx, StepTiming()).advantages(scored)
    assert {"advantages", "returns", "values", "ref_logprobs"} <= set(fields)


def test_a_train_step_changes_the_weights_and_state_round_trips(rank):
    ctx, runners = rank
    fields = Leader(ctx, StepTiming()).advantages(score(ctx, _rollout(ctx, runners), ctx.prompts(0)))
    for task in (Task.ACTOR_TRAIN, Task.CRITIC_TRAIN):
        trainer = runners[task]
        before = deepcopy(trainer.state())
        saved = before["model"]
        stats = trainer.run(fields)
        assert stats and all(isinstance(v, float) for v in stats.values()), stats
        after = trainer.state()["model"]
        assert any(not torch.equal(saved[k], after[k]) for k in saved), task
        assert trainer.learner.steps > 0
        trainer.load_state(before)  # the learner's progress too: its counters, schedule, shuffler
        assert all(torch.equal(saved[k], v) for k, v in trainer.state()["model"].items())
        assert trainer.learner.steps == 0 and torch.equal(trainer.state()["learner"]["rng"], before["learner"]["rng"])
        with pytest.raises(ValueError, match="learner progress"):
            trainer.load_state({"model": saved, "optimizer": before["optimizer"]})
        assert trainer.units(lead_only=True) == [task]


def test_weight_sync_asks_the_trainer_and_lands_in_the_copy(rank):
    ctx, runners = rank
    for trainer, copy in ((Task.ACTOR_TRAIN, Task.ACTOR_GEN), (Task.CRITIC_TRAIN, Task.CRITIC_INFER)):
        source = dict(runners[trainer].sync_model().named_parameters())
        with torch.no_grad():
            for p in source.values():
                p.add_(0.01)
        assert runners[trainer].full_weights() is None  # one device: its weights are full already
        runners[copy].apply_weights()({n: t.detach().clone() for n, t in source.items()})
        landed = dict(runners[copy].sync_model().named_parameters())
        assert all(torch.equal(landed[n], source[n]) for n in source), copy
        assert unwrap(runners[copy].sync_target()) is runners[copy].sync_target()


def test_the_timing_wrapper_records_each_task_and_its_priced_work(rank):
    ctx, runners = rank
    timing = StepTiming()
    report = IterationReport(rank=0, device=DEVICE, pid=0, rank_info=RankInfo(None, 1, {}))
    timing.begin(report)
    out = timing.wrap(runners[Task.ACTOR_GEN]).run(GenerationStep(batch=1, version=0))
    ref = timing.wrap(runners[Task.REF_INFER])
    ref.run({k: out[k] for k in ("input_ids", "attention_mask", "response_mask")})
    assert {Task.ACTOR_GEN, Task.REF_INFER} <= set(report.task_seconds)
    assert report.task_seconds[Task.REF_INFER] > 0 and report.spans[Task.REF_INFER][1] >= report.spans[Task.REF_INFER][0]
    assert [t["kind"] for t in report.work_timings[Task.REF_INFER]] == ["prefill"]
    assert ref.placement is runners[Task.REF_INFER].placement  # the proxy is the runner otherwise


def test_a_trainer_times_the_log_prob_recompute_in_its_update_as_that_task(rank):
    _, runners = rank
    trainer = runners[Task.ACTOR_TRAIN]
    assert trainer.spans({"loss": 1.0}, 10.0, 13.0) == {Task.ACTOR_TRAIN: (10.0, 13.0)}
    assert trainer.spans({"logprob_seconds": 1.0}, 10.0, 13.0) == {Task.ACTOR_LOGPROB: (10.0, 11.0),
                                                                   Task.ACTOR_TRAIN: (11.0, 13.0)}
