"""One worker of a run: walks the plan's RL iteration for the tasks placed on its device.

Every rank walks the same static loop (staleness.schedule) and, within a loop step, the same order —
generate, each inference task, reward + advantages, each training task, weight sync — so the
collectives of different groups line up without a coordinator; each rank then hands its report of
the iteration to the leader without waiting (recorder.py). Data moves between the leader and the
tasks' replicas as tensor dicts (dispatch.py): a rank only ever waits for data that an earlier step
produces, so the order cannot deadlock, and generators on their own devices run the next batch
while the trainers work on the previous one (async mode, k ≥ 1).

The leader (actor_train's replica 0) assembles each batch, scores rewards, computes advantages,
splits the batch over the training replicas by the plan's shares, and records the iteration.
"""

from __future__ import annotations

import datetime
import os
import time

import torch

from hetprof.executor.batch_split import share_slices
from hetprof.executor.dispatch import Exchange
from hetprof.executor.iteration_report import (
    BatchStats,
    IterationReport,
    Laps,
    RankInfo,
    prefill_timing,
    train_timing,
)
from hetprof.executor.messages import INPUT_KIND, RESULT_KIND, MessageKind
from hetprof.executor.options import RunOptions
from hetprof.executor.packing import priced_pass
from hetprof.executor.process_groups import ProcessGroups
from hetprof.executor.rank_models import RankModels
from hetprof.executor.recorder import Recorder
from hetprof.executor.records import dtype_name, plan_hash, work_description
from hetprof.executor.resume import agree_on_start, load_units, save_units
from hetprof.executor.run_record import RecordContext
from hetprof.executor.staleness import VersionCounter, schedule
from hetprof.executor.sync_edges import SyncEdges
from hetprof.executor.topology import Topology
from hetprof.specs.vocabulary import Task, TaskKind

INFER_KEYS = ("input_ids", "attention_mask", "response_mask")


class Worker:
    """The tasks of one rank and the loop that runs them."""

    def __init__(self, options: RunOptions, topo: Topology, groups: ProcessGroups, rank: int,
                 device: torch.device):
        self.opts = options
        self.topo = topo
        self.plan = topo.plan
        self.workload = self.plan.workload_spec()
        self.rank = rank
        self.device = device
        self.k = self.workload.staleness if self.workload.mode == "async" else 0
        self.tasks = topo.tasks_on(rank)
        self.is_leader = rank == topo.leader
        # packed passes are recorded at the shapes the plan priced them (executor/packing.priced_pass)
        self.token_budget = self.workload.training.max_tokens_per_microbatch
        self.models = RankModels(self.workload, self.tasks, device, options, topo, groups, rank)
        self.exchange = Exchange(topo, rank, device, groups.messages, options.timeout_s,
                                 by_tokens=self.token_budget is not None)
        self.recorder = Recorder(options, topo, rank, groups.reports, self.models.console)
        self.weights = SyncEdges(options, topo, groups, rank, device, self.models)
        self.hash = plan_hash(self.plan)
        self.run_name = f"run-{self.hash[:8]}-{datetime.datetime.now(datetime.timezone.utc):%Y%m%dT%H%M%S}"
        device_types = {d.id: d.type for d in self.plan.cluster_spec().devices()}
        self.rank_info = RankInfo(
            device_type=device_types.get(topo.device_of[rank]), threads=torch.get_num_threads(),
            dtypes={task: dtype_name(self.models.train_dtype if topo.tasks[task].kind == TaskKind.TRAINING
                                     else self.models.infer_dtype) for task in self.tasks})
        self._own_rollout: dict[str, torch.Tensor] | None = None
        self._lengths_checked = False

    # ---- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        start, self.run_name = agree_on_start(self.opts, self.hash, self.run_name, self.is_leader, self.topo.leader)
        if start and self.opts.resume:
            load_units(self.models, self.opts.checkpoint_dir, start, self.device)
        if start >= self.opts.iterations:
            if self.is_leader and not self.opts.quiet:
                self.models.console.print(f"nothing to do: the checkpoint is at iteration {start} "
                                          f"(--iterations {self.opts.iterations})")
            return
        self.recorder.start(RecordContext.from_plan(self.plan, self.topo, self.run_name, self.hash,
                                                    work_description(self.plan), self.opts.verify_sync))
        self.weights.version = start
        counter = VersionCounter(start, self.k)
        self.weights.sync(start, None)  # generators start from the trainer's weights, fresh or resumed
        last = time.perf_counter()
        for step in schedule(start, self.opts.iterations, self.k):
            report = IterationReport(rank=self.rank, device=self.topo.device_of[self.rank], pid=os.getpid(),
                                     rank_info=self.rank_info)
            self._step(step.generate, step.consume, counter, report)
            now = time.perf_counter()
            if step.consume is not None:
                self.recorder.submit(step.consume, now - last, report)
            last = now
        self.exchange.flush()
        self.recorder.close()

    def _step(self, generate: int | None, consume: int | None, counter: VersionCounter,
              report: IterationReport) -> None:
        """One loop step: generate batch `generate`, then train on batch `consume` (either may be None)."""
        lap = Laps(report.laps)
        if generate is not None and Task.ACTOR_GEN in self.tasks:
            self._generate(generate, report)
            lap("generate")
        if consume is None:
            return
        b = consume
        batch = self._assemble(b, report) if self.is_leader else None
        lap("collect_rollouts")
        for task in self.topo.inference_tasks():
            batch = self._infer(task.task, b, batch, report)
            lap(task.task)
        if self.is_leader:
            batch = self._score(b, batch, counter, report)
            lap("reward_advantage")
        self._train(b, batch, report)
        lap("train")
        if self.is_leader:
            counter.advance()
        self.weights.sync(b + 1, report)
        lap("sync")
        if self.opts.checkpoint_due(b + 1):
            report.checkpoint_saved = save_units(self.models, self.opts.checkpoint_dir, b + 1, self.hash,
                                                 self.run_name)
            lap("checkpoint")

    # ---- the tasks ---------------------------------------------------------------------------
    def _generate(self, b: int, report: IterationReport) -> None:
        """Generate this replica's prompts; the TP ranks of a replica all run it (same seed, same
        tokens) and its first rank sends the rollout to the leader."""
        gen = self.topo.tasks[Task.ACTOR_GEN]
        replica = gen.replica_of(self.rank)
        prompts = self.models.prompts(b)
        mine = share_slices(len(prompts), gen.shares)[replica]
        t0 = time.perf_counter()
        out = self.models.generate(prompts[mine], b, replica, self.weights.version)
        out["prompt_index"] = torch.arange(mine.start, mine.stop).repeat_interleave(
            self.workload.responses_per_prompt)
        report.task_seconds[Task.ACTOR_GEN] = time.perf_counter() - t0
        if self.rank != gen.ranks[replica]:
            return
        report.gen_tokens = int(out["response_mask"].sum())
        report.work_timings[Task.ACTOR_GEN] = list(getattr(self.models.backend, "last_phases", []))
        if self.is_leader:
            self._own_rollout = out
        else:
            self.exchange.to_leader(out, MessageKind.ROLLOUT, b)

    def _assemble(self, b: int, report: IterationReport) -> dict[str, torch.Tensor]:
        t0 = time.perf_counter()
        batch = self.exchange.collect(self._own_rollout, self.topo.tasks[Task.ACTOR_GEN].ranks, MessageKind.ROLLOUT, b,
                                      "rollouts", self.models.pad_id)
        report.task_seconds["wait_rollouts"] = time.perf_counter() - t0
        return batch

    def _infer(self, task: str, b: int, batch: dict | None, report: IterationReport) -> dict | None:
        """Scatter the batch over the task's replicas by share, compute, gather the replicas' results."""
        tr = self.topo.tasks[task]
        part = self.exchange.scatter(batch, tr, INPUT_KIND[task], b, INFER_KEYS)
        result = None
        if part is not None:
            t0 = time.perf_counter()
            result = self.models.infer(task, part)
            report.task_seconds[task] = time.perf_counter() - t0
            if self.rank == tr.ranks[tr.replica_of(self.rank)]:  # a replica reports once, by its first rank
                rows, width, passes = priced_pass(part["attention_mask"], self.token_budget)
                report.work_timings[task] = [prefill_timing(rows, width, report.task_seconds[task] / passes)]
                self.exchange.to_leader(result, RESULT_KIND[task], b)
        if not self.is_leader:
            return batch
        merged = self.exchange.collect(result, tr.ranks, RESULT_KIND[task], b, f"{task} results", 0)
        return {**batch, **merged}

    def _score(self, b: int, batch: dict, counter: VersionCounter, report: IterationReport) -> dict:
        t0 = time.perf_counter()
        ages = counter.staleness(batch["version"].tolist())
        response = batch["response_mask"].sum(1).float()
        stats = BatchStats(tokens=int(batch["response_mask"].sum()),
                           prompt_tokens_mean=float((batch["attention_mask"].sum(1).float() - response).mean()),
                           response_tokens_mean=float(response.mean()),
                           staleness_max=max(ages), staleness_mean=sum(ages) / len(ages))
        self._check_lengths(stats)
        batch = self.models.score(batch, self.models.prompts(b))
        stats.reward_mean = float(batch["rewards"].mean())
        report.batch = stats
        report.task_seconds["reward"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        batch = self.models.advantages(batch)
        report.task_seconds["advantage"] = time.perf_counter() - t0
        return batch

    def _check_lengths(self, stats: BatchStats) -> None:
        """Say once when the data's lengths are far from the workload's: the plan was predicted for those."""
        if self._lengths_checked:
            return
        self._lengths_checked = True
        for what, declared, seen in (("prompts", self.workload.prompt_len, stats.prompt_tokens_mean),
                                     ("responses", self.workload.response_len, stats.response_tokens_mean)):
            if not 0.67 <= seen / declared.mean <= 1.5:
                self.models.console.print(
                    f"[yellow]note: {what} average {seen:.0f} tokens but the workload says {declared.mean:g} "
                    f"({what[:-1]}_len.mean); the plan's predictions assume the workload's lengths[/yellow]")

    def _train(self, b: int, batch: dict | None, report: IterationReport) -> None:
        """Split the scored batch over each training task's replicas by the plan's shares; DDP
        (with the learner's global token mean) makes uneven shares give the whole batch's gradient."""
        for tr in self.topo.training_tasks():
            part = self.exchange.scatter(batch, tr, INPUT_KIND[tr.task], b)
            if part is None:
                continue
            t0 = time.perf_counter()
            stats = self.models.train(tr.task, part)
            # the log-prob pass runs inside the actor's update (its first forward): timed apart
            logprob = stats.pop("logprob_seconds", 0.0)
            seconds = report.task_seconds[tr.task] = time.perf_counter() - t0 - logprob
            rows = part["input_ids"].shape[0]
            micro = stats.pop("micro_batches", 1.0)
            if logprob:
                report.task_seconds[Task.ACTOR_LOGPROB] = logprob
            if self.rank != tr.ranks[tr.replica_of(self.rank)]:
                continue  # a replica's statistics are reported once, by its first rank
            if logprob:
                n, width, passes = priced_pass(part["attention_mask"], self.token_budget)
                report.work_timings[Task.ACTOR_LOGPROB] = [prefill_timing(n, width, logprob / passes)]
            mini = self.workload.mini_batches
            n, width, passes = priced_pass(part["attention_mask"], self.token_budget, mini, micro)
            report.work_timings[tr.task] = [train_timing(n * mini, width, seconds / passes,
                                                         self.workload.ppo_epochs, mini)]
            report.train_stats[tr.task] = {"n": rows, **stats}
