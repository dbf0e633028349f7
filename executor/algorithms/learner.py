"""One RL update of one model: PPO epochs × mini-batches × micro-batches around an algorithm's loss.

The runtime hands in a DDP-wrapped model when a training task has several replicas. Two things
follow from that, and both are handled for every caller (algorithms/replicas.py):
- every replica must run the same number of forward/backward passes per step, or DDP's
  all-reduce waits forever; so mini- and micro-batches are *counts*, never sizes, and a replica
  with a smaller batch share just runs smaller pieces;
- replicas hold uneven batch shares (the plan balances them to device speed), so the loss is
  divided by the *global* token count (all-reduced), which makes DDP's gradient average equal to the
  token mean over the whole batch instead of a mean of per-replica means.

A tensor- or pipeline-parallel task hands in a `parallel.ShardedModel` instead of a DDP wrapper (an
expert-parallel one a `parallel.ExpertParallel`, which answers the same calls): the
same loss and denominators, with its gradients averaged over its data-parallel group explicitly, its
norm clipped over the whole (sharded) model, and — when pipelined — each mini-batch run through
torch's pipeline schedule, whose last stage computes the loss per micro-batch from the rows it is
given. One update then equals the single-device update up to float rounding. A Ulysses group
(`sequence_parallel`) hands every rank of it the same rows; each runs a slice of every packed row and
computes the group's whole loss, and the denominators count the group's tokens once.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hetprof.executor.algorithms.base import Algorithm, RLBatch
from hetprof.executor.algorithms.objectives import OBJECTIVES
from hetprof.executor.algorithms.replicas import ReplicaCoordination
from hetprof.executor.models.logprobs import first_response_column, token_logprobs
from hetprof.runtime.packedpass import logits_to_logprobs, packed_token_logprobs
from hetprof.runtime.ulysses import SequenceParallel
from hetprof.specs.vocabulary import Role


class Learner:
    """Trains the actor (role "actor") or the critic (role "critic") on scored batches."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, algorithm: Algorithm,
                 ppo_epochs: int = 1, mini_batches: int = 1, micro_batches: int = 1,
                 max_grad_norm: float | None = 1.0, role: str = Role.ACTOR, temperature: float = 1.0,
                 recompute_proximal: bool = True, seed: int = 0,
                 lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
                 process_group: dist.ProcessGroup | None = None, parallel: Any = None,
                 max_tokens_per_microbatch: int | None = None, sequence_parallel: SequenceParallel | None = None):
        if role not in OBJECTIVES:
            raise ValueError(f"role must be 'actor' or 'critic', got {role!r}")
        if role == Role.CRITIC and not algorithm.needs_critic:
            raise ValueError(f"algorithm {algorithm.name!r} trains no critic")
        if min(ppo_epochs, mini_batches, micro_batches) < 1:
            raise ValueError("ppo_epochs, mini_batches and micro_batches must be >= 1")
        self.model = model
        self.optimizer = optimizer
        self.algorithm = algorithm
        self.ppo_epochs = ppo_epochs
        self.mini_batches = mini_batches
        self.micro_batches = micro_batches
        self.max_grad_norm = max_grad_norm
        self.role = role
        self.temperature = temperature
        self.recompute_proximal = recompute_proximal
        self.lr_scheduler = lr_scheduler
        self.process_group = process_group
        self.parallel = parallel  # a parallel.ShardedModel for TP/PP tasks, an ExpertParallel for EP
        self.pipeline = parallel.pipeline if parallel is not None else None
        # packed micro-batches of at most this many tokens (executor/models/packing.py); a pipeline's
        # schedule splits fixed-shape padded micro-batches, so pipelined tasks stay padded
        self.max_tokens = max_tokens_per_microbatch if self.pipeline is None else None
        # Ulysses: this rank runs a slice of each packed row its group shares (hetprof/runtime/ulysses.py)
        if sequence_parallel is not None and (self.max_tokens is None or parallel is not None):
            raise ValueError("Ulysses sequence parallelism runs packed passes of whole-model replicas: it needs "
                             "max_tokens_per_microbatch and no tensor or pipeline parallelism")
        self.sequence_parallel = sequence_parallel
        self.steps = 0  # optimizer steps taken
        self.updates = 0  # update() calls (weight versions produced)
        self._rng = torch.Generator().manual_seed(seed)
        self.objective = OBJECTIVES[role](algorithm, temperature, self.max_tokens, sequence_parallel)
        self.replicas = ReplicaCoordination(model, parallel, process_group, micro_batches, self.max_tokens,
                                            copies=sequence_parallel.size if sequence_parallel is not None else 1)

    @torch.no_grad()
    def proximal_logprobs(self, batch: RLBatch) -> torch.Tensor:
        """The current policy's log-probs before this update (the decoupled objective's π_prox); an
        expert-parallel model's replicas run it in lockstep (parallel/experts.py)."""
        was = self.model.training
        self.model.eval()
        try:
            if self.pipeline is not None:
                logits = self.pipeline.forward(batch.input_ids, batch.attention_mask)
                return logits_to_logprobs(logits[:, :-1], batch.input_ids[:, 1:], self.temperature)
            model = forward_module(self.model)
            # an expert-parallel replica runs its forwards in step with its EP group's (parallel/experts.py)
            with self.parallel.lockstep() if self.parallel is not None else contextlib.nullcontext():
                if self.max_tokens is not None:
                    return packed_token_logprobs(model, batch.input_ids, batch.attention_mask, self.temperature,
                                                 max_tokens=self.max_tokens, needed=batch.mask,
                                                 sequence_parallel=self.sequence_parallel)
                return token_logprobs(model, batch.input_ids, batch.attention_mask, self.temperature,
                                      from_column=first_response_column(batch.mask))
        finally:
            self.model.train(was)

    def state_dict(self) -> dict:
        """Optimizer state and the learner's own progress (`progress_state`)."""
        return {"optimizer": self.optimizer.state_dict(), **self.progress_state()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.load_progress_state(state)

    def progress_state(self) -> dict:
        """What a resumed update continues besides the weights and optimizer moments: the step
        counters, the learning-rate schedule and the mini-batch shuffler (tensors and numbers only)."""
        return {"steps": self.steps, "updates": self.updates, "rng": self._rng.get_state(),
                "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None}

    def load_progress_state(self, state: dict) -> None:
        """The counters, schedule and shuffler of `progress_state`; a ValueError says what is malformed
        (the optimizer is loaded first: the schedule's state names the rates it set)."""
        steps, updates, rng, schedule = (state.get(k) for k in ("steps", "updates", "rng", "lr_scheduler"))
        if type(steps) is not int or type(updates) is not int or min(steps, updates) < 0:
            raise ValueError(f"learner step counters must be integers >= 0, got {steps!r:.40}, {updates!r:.40}")
        self._check_shuffler(rng)
        own = self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None
        if (schedule is None) != (own is None) or (own is not None and (
                not isinstance(schedule, dict) or set(schedule) != set(own))):  # torch sets its attributes from it
            raise ValueError("the learning-rate schedule state does not match this run's schedule "
                             f"({'none' if own is None else 'one'} configured)")
        self.steps, self.updates = steps, updates
        self._rng.set_state(rng)
        if self.lr_scheduler is not None:
            self.lr_scheduler.load_state_dict(schedule)

    def shuffler_state(self) -> torch.Tensor:
        """The mini-batch shuffler alone: a replica's own (its row count decides how far it advanced),
        which a data-parallel task's checkpoint unit, written by its lead, does not hold."""
        return self._rng.get_state()

    def load_shuffler_state(self, rng: Any) -> None:
        self._check_shuffler(rng)
        self._rng.set_state(rng)

    def _check_shuffler(self, rng: Any) -> None:
        expected = self._rng.get_state()
        if not isinstance(rng, torch.Tensor) or rng.dtype != expected.dtype or rng.shape != expected.shape:
            raise ValueError(f"the learner's shuffler state must be a {tuple(expected.shape)} "
                             f"{expected.dtype} tensor")

    # ---- the update ------------------------------------------------------------------------------
    def update(self, batch: RLBatch) -> dict[str, float]:
        """One RL update over `batch`; returns the mean of each statistic over all micro-steps."""
        start = time.perf_counter()
        if len(batch) == 0:
            raise ValueError("an update needs at least one sequence (a replica with no share must not train)")
        logprob_seconds = 0.0
        if self.objective.recomputes_proximal and self.recompute_proximal and batch.proximal_logprobs is None:
            batch.proximal_logprobs = self.proximal_logprobs(batch)
            logprob_seconds = time.perf_counter() - start
        if batch.advantages is None:
            self.algorithm.advantages(batch)
        self.model.train()
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        device = batch.input_ids.device
        filler = batch.select(torch.arange(1, device=device))
        # every epoch's order drawn up front (same draws as one per epoch) so one collective
        # gives all mini-batches' denominators
        orders = [torch.randperm(len(batch), generator=self._rng).to(device) for _ in range(self.ppo_epochs)]
        minis = [idx for order in orders for idx in torch.tensor_split(order, self.mini_batches)]
        pieces = self.replicas.micro_counts(batch.attention_mask, minis)
        stepping = 0.0  # seconds in optimizer steps: a run records them apart from the passes
        for mini_idx, denom, count in zip(minis, self.replicas.denominators(batch.mask, minis), pieces, strict=True):
            mini = batch.select(mini_idx)
            self.optimizer.zero_grad(set_to_none=True)
            if self.pipeline is not None:
                for stats in self._pipeline_step(mini, denom):
                    for k, v in stats.items():
                        sums[k] += v
                        counts[k] += 1
            else:
                micro_parts = self.replicas.micro_parts(mini, count)
                for i, micro_idx in enumerate(micro_parts):
                    last = i == len(micro_parts) - 1
                    if len(micro_idx) == 0:
                        # A replica whose share is smaller than the piece count still runs a forward and
                        # backward (of zero weight), so DDP's collectives stay matched across replicas.
                        self._micro_step(filler, denom, sync=last, weight=0.0)
                        continue
                    for k, v in self._micro_step(mini.select(micro_idx), denom, sync=last).items():
                        sums[k] += v
                        counts[k] += 1
            t_step = time.perf_counter()
            sums["grad_norm"] += self._step()
            stepping += time.perf_counter() - t_step
            counts["grad_norm"] += 1
        self.updates += 1
        out = {k: v / counts[k] for k, v in sums.items()}
        out.update({"optimizer_steps": float(self.steps), "update_seconds": time.perf_counter() - start,
                    "micro_batches": sum(pieces) / max(1, len(pieces)),  # per optimizer step
                    "logprob_seconds": logprob_seconds, "optimizer_seconds": stepping,
                    "lr": float(self.optimizer.param_groups[0]["lr"])})
        out.update(self.objective.batch_stats(batch))
        return out

    def _micro_step(self, micro: RLBatch, denom: torch.Tensor, sync: bool, weight: float = 1.0) -> dict[str, float]:
        with self.replicas.gradient_sync(sync):
            loss, stats = self.objective.loss(self.model, micro, denom)
            (loss * weight if weight != 1.0 else loss).backward()
        return stats

    def _pipeline_step(self, mini: RLBatch, denom: torch.Tensor) -> list[dict[str, float]]:
        """Forward and backward of a mini-batch through the pipeline; the last stage computes each
        micro-batch's loss from its rows of `mini`, and its statistics reach every stage."""
        stats: list[dict[str, float]] = []

        def loss_of(output: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            loss, st = self.objective.loss_from_output(mini.select(rows), output, denom)
            stats.append(st)
            return loss

        self.pipeline.train_step(mini.input_ids, mini.attention_mask, loss_of)
        return self.pipeline.broadcast_object(stats)

    def _step(self) -> float:
        norm = 0.0
        if self.parallel is not None:
            self.parallel.finish_gradients()
            if self.max_grad_norm is not None:
                norm = self.parallel.clip_grad_norm_(self.max_grad_norm)
            self.optimizer.step()
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
            self.steps += 1
            return norm
        if self.max_grad_norm is not None:
            total = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            full = getattr(total, "full_tensor", None)  # FSDP2: a DTensor norm
            norm = float(full() if callable(full) else total)
        self.optimizer.step()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.steps += 1
        return norm


def forward_module(model: nn.Module) -> nn.Module:
    """The module a forward without gradients calls: a DDP replica's own module, since DDP's
    per-forward bookkeeping only prepares a backward, a cost no profiled row times (docs/DESIGN.md §10
    says why and which bench measures it); anything else as it is."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
