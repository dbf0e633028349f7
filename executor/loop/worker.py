"""One worker of a run: walks the plan's RL iteration for the tasks placed on its device.

Every rank walks the same static loop (staleness.schedule) and, within a loop step, the same order —
generate, the forward passes (the actor's log-prob pass, then each inference task), reward +
advantages, each training task, weight sync — so the
collectives of different groups line up without a coordinator; each rank then hands its report of
the iteration to the leader without waiting (recorder.py). Data moves between the leader and the
tasks' replicas as tensor dicts (dispatch.py): a rank only ever waits for data that an earlier step
produces, so the order cannot deadlock, and generators on their own devices run the next batch
while the trainers work on the previous one (async mode, k ≥ 1).

The leader (actor_train's replica 0) assembles each batch, gathers the forward passes' results,
scores rewards, computes advantages, splits the batch over the training replicas by the plan's
shares, and records the iteration. Every forward pass runs before the advantages (as verl orders
them): PPO's KL reward penalty needs π_prox, the trainer's log-probs before this update, which in
async mode differ from the stale generator's.
"""

from __future__ import annotations

import datetime
import os
import time

import torch

from hetprof.executor.checkpoints.hf_export import export_models
from hetprof.executor.checkpoints.resume import agree_on_start, load_units, save_units
from hetprof.executor.loop.batch_split import share_slices
from hetprof.executor.loop.dispatch import Exchange
from hetprof.executor.loop.messages import INPUT_KIND, RESULT_KIND, MessageKind
from hetprof.executor.loop.staleness import VersionCounter, schedule
from hetprof.executor.models.packing import priced_pass
from hetprof.executor.options import RunOptions
from hetprof.executor.parallel.process_groups import ProcessGroups
from hetprof.executor.parallel.sync_edges import SyncEdges
from hetprof.executor.parallel.topology import Topology
from hetprof.executor.records.iteration_report import (
    BatchStats,
    IterationReport,
    Laps,
    RankInfo,
    prefill_timing,
    sample_texts,
    train_timing,
)
from hetprof.executor.records.recorder import Recorder
from hetprof.executor.records.run_log import dtype_name, plan_hash, work_description
from hetprof.executor.records.run_record import RecordContext
from hetprof.executor.records.trace import IterationTrace
from hetprof.executor.runners.rank_models import RankModels
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
        # a packed pass is recorded as its average pack, the unit the plan prices (executor/packing.priced_pass)
        self.token_budget = self.workload.training.max_tokens_per_microbatch
        self.priced_length = self.workload.prompt_len.mean + self.workload.response_len.mean
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
        # generation replica 0 evaluates the validation split, the leader records it (evaluation.py)
        self.validator = None
        gen = topo.tasks[Task.ACTOR_GEN]
        if (self.workload.data.eval_every and self.models.validation_prompts
                and (self.is_leader or rank in gen.replica_ranks[0])):
            from hetprof.executor.loop.evaluation import Validator

            self.validator = Validator(self.models.validation_prompts, self.models.reward_fn, self.models.tokenizer,
                                       self.workload, options.iterations)
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
        if self.is_leader and not self.opts.quiet:  # the name `hetprof validate` and `hetprof db show` take
            self.models.console.print(f"run {self.run_name}" + (f", resumed at iteration {start}" if start else ""))
        self.recorder.start(RecordContext.from_plan(self.plan, self.topo, self.run_name, self.hash,
                                                    work_description(self.plan), self.opts.verify_sync), start)
        self.weights.version = start
        counter = VersionCounter(start, self.k)
        self.weights.sync(start, None)  # generators start from the trainer's weights, fresh or resumed
        last = time.perf_counter()
        steps = list(schedule(start, self.opts.iterations, self.k))
        trace = IterationTrace(self.opts.trace_dir, self.rank, len(steps), self.opts.trace_iterations)
        with trace:
            for step in steps:
                report = IterationReport(rank=self.rank, device=self.topo.device_of[self.rank], pid=os.getpid(),
                                         rank_info=self.rank_info)
                with trace.step(f"iteration {step.consume}" if step.consume is not None
                                else f"generate {step.generate}"):
                    self._step(step.generate, step.consume, counter, report)
                last = self._submit(step.consume, last, report)
        self.exchange.flush()
        self.recorder.close()

    def _submit(self, consume: int | None, last: float, report: IterationReport) -> float:
        """Hand a finished iteration's report to the recorder; the loop step's end time."""
        now = time.perf_counter()
        if consume is not None:
            self.recorder.submit(consume, now - last, report)
        return now

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
        for task in self._forward_passes():
            batch = self._infer(task, b, batch, report)
            lap(task)
        if self.is_leader:
            batch = self._score(b, batch, counter, report)
            lap("reward_advantage")
        self._train(b, batch, report)
        lap("train")
        if self.is_leader:
            counter.advance()
        self.weights.sync(b + 1, report)
        lap("sync")
        if self.validator is not None and self.validator.due(b + 1):
            self._validate(b, report)
            lap("validation")
        if self.opts.checkpoint_due(b + 1):
            t0 = time.perf_counter()
            report.checkpoint_saved = save_units(self.models, self.opts.checkpoint_dir, b + 1, self.hash,
                                                 self.run_name)
            export_models(self.models, self.opts.checkpoint_dir, b + 1)
            report.spans["checkpoint"] = [report.wall(t0), report.wall(time.perf_counter())]
            lap("checkpoint")

    # ---- the tasks ---------------------------------------------------------------------------
    def _forward_passes(self) -> list[str]:
        """The passes over a collected batch that its advantages read: the actor's log-prob pass
        (the trainer's weights before this update, on the trainer's ranks), then each inference task."""
        logprob = [Task.ACTOR_LOGPROB] if Task.ACTOR_LOGPROB in self.topo.tasks else []
        return logprob + [t.task for t in self.topo.inference_tasks()]

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
        report.timed(Task.ACTOR_GEN, t0)
        if self.rank != gen.ranks[replica]:
            return
        report.gen_tokens = int(out["response_mask"].sum())
        report.work_timings[Task.ACTOR_GEN] = list(getattr(self.models.backend, "last_phases", []))
        if self.is_leader:
            self._own_rollout = out
        else:
            self.exchange.to_leader(out, MessageKind.ROLLOUT, b)

    def _validate(self, b: int, report: IterationReport) -> None:
        """Generation replica 0 answers the validation prompts greedily with the weights just synced
        (its TP ranks together), its first rank sends the scores to the leader, which records them."""
        gen = self.topo.tasks[Task.ACTOR_GEN]
        scores = None
        if self.rank in gen.replica_ranks[0]:
            scores = self.validator.evaluate(self.models.backend)
            if self.rank == gen.ranks[0] and not self.is_leader:
                self.exchange.send({"scores": scores}, self.topo.leader, MessageKind.VALIDATION, b)
        if self.is_leader:
            if self.rank != gen.ranks[0]:
                scores = self.exchange.receive(gen.ranks[0], MessageKind.VALIDATION, b, "validation scores")["scores"]
            report.validation = self.validator.named(scores)

    def _assemble(self, b: int, report: IterationReport) -> dict[str, torch.Tensor]:
        t0 = time.perf_counter()
        batch = self.exchange.collect(self._own_rollout, self.topo.tasks[Task.ACTOR_GEN].ranks, MessageKind.ROLLOUT, b,
                                      "rollouts", self.models.pad_id)
        report.timed("wait_rollouts", t0)
        return batch

    def _infer(self, task: str, b: int, batch: dict | None, report: IterationReport) -> dict | None:
        """Scatter the batch over the task's replicas by share, compute, gather the replicas' results."""
        tr = self.topo.tasks[task]
        part = self.exchange.scatter(batch, tr, INPUT_KIND[task], b, INFER_KEYS)
        result = None
        if part is not None:
            t0 = time.perf_counter()
            result = self.models.infer(task, part)
            report.timed(task, t0)
            if self.rank == tr.ranks[tr.replica_of(self.rank)]:  # a replica reports once, by its first rank
                rows, width, passes = priced_pass(part["attention_mask"], self.token_budget,
                                                  priced_length=self.priced_length)
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
        stats.reward_std = float(batch["rewards"].std(correction=0))
        stats.samples = sample_texts(batch, self.models.prompts(b), self.models.tokenizer)
        report.batch = stats
        report.timed("reward", t0)
        t0 = time.perf_counter()
        batch = self.models.advantages(batch)
        report.timed("advantage", t0)
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
            # the update recomputes π_prox only for a batch that lacks it (its first forward): timed apart
            logprob = stats.pop("logprob_seconds", 0.0)
            seconds = report.timed(tr.task, t0 + logprob)
            rows = part["input_ids"].shape[0]
            micro = stats.pop("micro_batches", 1.0)
            stepping = stats.pop("optimizer_seconds", 0.0)
            if logprob:
                report.timed(Task.ACTOR_LOGPROB, t0, t0 + logprob)
            if self.rank != tr.ranks[tr.replica_of(self.rank)]:
                continue  # a replica's statistics are reported once, by its first rank
            if logprob:
                n, width, passes = priced_pass(part["attention_mask"], self.token_budget,
                                               priced_length=self.priced_length)
                report.work_timings[Task.ACTOR_LOGPROB] = [prefill_timing(n, width, logprob / passes)]
            mini = self.workload.mini_batches
            n, width, packs = priced_pass(part["attention_mask"], self.token_budget, mini, micro, self.priced_length)
            report.work_timings[tr.task] = [train_timing(n * mini, width, seconds, self.workload.ppo_epochs, mini,
                                                         packs, stepping)]
            report.train_stats[tr.task] = {"n": rows, **stats}
