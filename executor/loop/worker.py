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

from hetprof.executor.checkpoints.checkpoint import CheckpointRefused
from hetprof.executor.checkpoints.hf_export import export_models
from hetprof.executor.checkpoints.resume import agree_on_start, load_rank, load_units, save_rank, save_units
from hetprof.executor.loop.dispatch import Exchange
from hetprof.executor.loop.evaluation import validator_for
from hetprof.executor.loop.leader import Leader
from hetprof.executor.loop.messages import INPUT_KIND, RESULT_KIND, MessageKind
from hetprof.executor.loop.recorder import Recorder, record_context
from hetprof.executor.loop.staleness import VersionCounter, schedule
from hetprof.executor.loop.sync_edges import SyncEdges
from hetprof.executor.loop.timing import StepTiming, phase
from hetprof.executor.options import RunOptions
from hetprof.executor.parallel.process_groups import ProcessGroups
from hetprof.executor.parallel.topology import Topology
from hetprof.executor.records.iteration_report import IterationReport, RankInfo
from hetprof.executor.records.run_log import dtype_name, plan_hash, work_description
from hetprof.executor.records.trace import IterationTrace
from hetprof.executor.runners.context import RankContext
from hetprof.executor.runners.generator import GenerationStep
from hetprof.executor.runners.registry import build_runners
from hetprof.specs.vocabulary import Task, TaskKind

INFER_KEYS = ("input_ids", "attention_mask", "response_mask")


class Worker:
    """The runners of one rank and the loop that feeds them."""

    def __init__(self, options: RunOptions, topo: Topology, groups: ProcessGroups, rank: int,
                 device: torch.device):
        self.opts = options
        self.topo = topo
        self.plan = topo.plan
        self.workload = self.plan.workload_spec()
        self.rank = rank
        self.device = device
        self.k = self.workload.staleness if self.workload.mode == "async" else 0
        self.is_leader = rank == topo.leader
        self.ctx = RankContext.build(self.workload, options, topo, groups, rank, device)
        self.runners = build_runners(self.ctx)  # only the tasks the plan put on this rank
        self.timing = StepTiming()
        self.timed = {task: self.timing.wrap(runner) for task, runner in self.runners.items()}
        self.leader = Leader(self.ctx, self.timing) if self.is_leader else None
        self.exchange = Exchange(topo, rank, device, groups.messages, options.timeout_s,
                                 by_tokens=self.workload.training.max_tokens_per_microbatch is not None)
        self.recorder = Recorder(options, topo, rank, groups.reports, self.ctx.console)
        self.weights = SyncEdges(options, topo, groups, rank, device, self.runners, self.ctx.wire_dtype)
        self.hash = plan_hash(self.plan)
        self.run_name = f"run-{self.hash[:8]}-{datetime.datetime.now(datetime.timezone.utc):%Y%m%dT%H%M%S}"
        device_types = {d.id: d.type for d in self.plan.cluster_spec().devices()}
        self.rank_info = RankInfo(
            device_type=device_types.get(topo.device_of[rank]), threads=torch.get_num_threads(),
            dtypes={task: dtype_name(self.ctx.train_dtype if Task(task).kind == TaskKind.TRAINING
                                     else self.ctx.infer_dtype) for task in self.runners})
        # the rollouts this rank generated (as its replica's first rank) that no update has trained on
        # yet, by batch: the leader's own until it collects them, and what a checkpoint saves in flight
        self._rollouts: dict[int, dict[str, torch.Tensor]] = {}
        self._replay: range = range(0)  # after a resume: the batches in flight, taken from the checkpoint
        self.validator = validator_for(self.ctx, self.is_leader)

    def close(self) -> None:
        """Release what the runners hold (a vLLM engine's processes)."""
        for runner in self.runners.values():
            runner.close()

    # ---- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        console = self.ctx.console
        start, self.run_name = agree_on_start(self.opts, self.hash, self.run_name, self.is_leader, self.topo.leader)
        if start >= self.opts.iterations:
            if self.is_leader and not self.opts.quiet:
                console.print(f"nothing to do: the checkpoint is at iteration {start} "
                              f"(--iterations {self.opts.iterations})")
            return
        if start:
            self._resume(start)
        if self.is_leader and not self.opts.quiet:  # the name `hetprof validate` and `hetprof db show` take
            console.print(f"run {self.run_name}" + (f", resumed at iteration {start}" if start else ""))
        self.recorder.start(record_context(self.plan, self.topo, self.run_name, self.hash,
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

    def _resume(self, start: int) -> None:
        """Everything this rank continues from, as the checkpoint at `start` holds it: the trained
        units, the random generators, the data position, and (async) the k batches generated before
        the checkpoint that no update had trained on — replayed, not regenerated."""
        load_units(self.runners, self.opts.checkpoint_dir, start, self.device)
        own = load_rank(self.opts.checkpoint_dir, self.rank, start, self.device, self.runners)
        self.ctx.source.load_state_dict(own.data)
        if self.ctx.source.cursor != start:
            raise CheckpointRefused(f"--resume: rank {self.rank}'s checkpoint at iteration {start} holds the data "
                                    f"position of batch {self.ctx.source.cursor}")
        self._rollouts = own.rollouts
        self._replay = range(start, min(start + self.k, self.opts.iterations))

    def _submit(self, consume: int | None, last: float, report: IterationReport) -> float:
        """Hand a finished iteration's report to the recorder; the loop step's end time."""
        now = time.perf_counter()
        if consume is not None:
            self.recorder.submit(consume, now - last, report)
        return now

    def _step(self, generate: int | None, consume: int | None, counter: VersionCounter,
              report: IterationReport) -> None:
        """One loop step: generate batch `generate`, then train on batch `consume` (either may be None)."""
        self.timing.begin(report)
        if generate is not None and Task.ACTOR_GEN in self.runners:
            self._generate(generate)
        if consume is None:
            return
        b = consume
        batch = self._collect(b)
        for task in self._forward_passes():
            batch = self._infer(task, b, batch)
        if self.is_leader:
            batch = self._score(b, batch, counter)
        self._train(b, batch)
        if self.is_leader:
            counter.advance()
        self._sync(b + 1)
        if self.validator is not None and self.validator.due(b + 1):
            self._validate(b)
        if self.opts.checkpoint_due(b + 1):
            self._checkpoint(b + 1)
        self._rollouts = {i: r for i, r in self._rollouts.items() if i > b}  # trained on: no longer in flight

    # ---- the dataflow ------------------------------------------------------------------------
    def _forward_passes(self) -> list[str]:
        """The passes over a collected batch that its advantages read: the actor's log-prob pass
        (the trainer's weights before this update, on the trainer's ranks), then each inference task."""
        logprob = [Task.ACTOR_LOGPROB] if Task.ACTOR_LOGPROB in self.topo.tasks else []
        return logprob + [t.task for t in self.topo.inference_tasks()]

    @phase("generate")
    def _generate(self, b: int) -> None:
        """Generate this replica's prompts; the TP ranks of a replica all run it (same seed, same
        tokens) and its first rank sends the rollout to the leader."""
        generator = self.timed[Task.ACTOR_GEN]
        if b in self._replay:  # every rank of the replica skips it alike (TP ranks generate together)
            if not generator.reports:
                return
            if b not in self._rollouts:
                raise CheckpointRefused(f"--resume: rank {self.rank}'s checkpoint lacks its rollouts of batch {b}, "
                                        f"generated before the checkpoint and not yet trained on")
            out = self._rollouts[b]
        else:
            out = generator.run(GenerationStep(batch=b, version=self.weights.version))
            if not generator.reports:
                return
            self._rollouts[b] = out
        self.exchange.to_leader(out, MessageKind.ROLLOUT, b)  # the leader keeps its own

    @phase("collect_rollouts")
    def _collect(self, b: int) -> dict[str, torch.Tensor] | None:
        """The leader gathers every generation replica's rollout into one batch."""
        if not self.is_leader:
            return None
        with self.timing.span("wait_rollouts"):
            return self.exchange.collect(self._rollouts.get(b), self.topo.tasks[Task.ACTOR_GEN].ranks,
                                         MessageKind.ROLLOUT, b, "rollouts", self.ctx.tokenizer.pad_id)

    @phase(lambda task, *_: task)
    def _infer(self, task: str, b: int, batch: dict | None) -> dict | None:
        """Scatter the batch over the task's replicas (Ulysses groups) by share, compute, gather their results."""
        tr = self.topo.tasks[task]
        part = self.exchange.scatter(batch, tr, INPUT_KIND[task], b, INFER_KEYS)
        result = None
        if part is not None:
            runner = self.timed[task]
            result = runner.run(part)
            if runner.reports:  # a replica (a Ulysses group) sends once, by its first rank
                self.exchange.to_leader(result, RESULT_KIND[task], b)
        if not self.is_leader:
            return batch
        merged = self.exchange.collect(result, tr.batch_leads, RESULT_KIND[task], b, f"{task} results", 0)
        return {**batch, **merged}

    @phase("reward_advantage")
    def _score(self, b: int, batch: dict, counter: VersionCounter) -> dict:
        return self.leader.score(b, batch, counter)

    @phase("train")
    def _train(self, b: int, batch: dict | None) -> None:
        """Split the scored batch over each training task's replicas by the plan's shares; DDP
        (with the learner's global token mean) makes uneven shares give the whole batch's gradient."""
        for tr in self.topo.training_tasks():
            part = self.exchange.scatter(batch, tr, INPUT_KIND[tr.task], b)
            if part is None:
                continue
            trainer = self.timed[tr.task]
            stats = trainer.run(part)
            if trainer.reports:  # a replica's statistics are reported once, by its first rank
                self.timing.report.train_stats[tr.task] = {"n": part["input_ids"].shape[0], **stats}

    @phase("sync")
    def _sync(self, version: int) -> None:
        self.weights.sync(version, self.timing.report)

    @phase("validation")
    def _validate(self, b: int) -> None:
        """Generation replica 0 answers the validation prompts greedily with the weights just synced
        (its TP ranks together), its first rank sends the scores to the leader, which records them."""
        gen = self.topo.tasks[Task.ACTOR_GEN]
        scores = None
        if self.rank in gen.replica_ranks[0]:
            scores = self.validator.evaluate(self.runners[Task.ACTOR_GEN].backend)
            if self.rank == gen.ranks[0] and not self.is_leader:
                self.exchange.send({"scores": scores}, self.topo.leader, MessageKind.VALIDATION, b)
        if self.is_leader:
            if self.rank != gen.ranks[0]:
                scores = self.exchange.receive(gen.ranks[0], MessageKind.VALIDATION, b, "validation scores")["scores"]
            self.timing.report.validation = self.validator.named(scores)

    @phase("checkpoint")
    def _checkpoint(self, iteration: int) -> None:
        with self.timing.span("checkpoint", seconds=False):
            save_units(self.runners, self.opts.checkpoint_dir, iteration, self.hash, self.run_name)
            save_rank(self.opts.checkpoint_dir, self.rank, iteration, self.hash, self.run_name,
                      self.ctx.source.position(iteration), self._rollouts, self.runners)
            self.timing.report.checkpoint_saved = True
            export_models(self.runners, self.ctx, self.opts.checkpoint_dir, iteration)
