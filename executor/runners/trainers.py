"""The trainers: actor_train and critic_train, each a model in fp32 masters, its optimizer and the
learner that runs the algorithm's update, over the plan's data-parallel replicas.

A trainer is placed one of three ways: TP/PP through torch's tensor-parallel API and pipeline stages
with data parallelism by an explicit gradient average over the replicas (parallel/sharded.py says
why not DDP/FSDP there); expert parallelism (the layout's `ep`), whole-model replicas whose EP groups
split every MoE layer's experts, averaged explicitly as well (parallel/experts.py); or the plan's
sharding (DDP or FSDP2, hetprof/runtime/dataparallel.py).
It answers weight sync (the sender's module, a sharded trainer's gathered weights) and checkpoints
(its units, their state) for the model it owns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hetprof.executor.algorithms import RLBatch
from hetprof.executor.algorithms.learner import Learner
from hetprof.executor.algorithms.optimizer import build_optimizer, build_scheduler, optimizer_steps
from hetprof.executor.models.modeling import build_causal_lm, build_value_model, unwrap
from hetprof.executor.models.packing import priced_pass
from hetprof.executor.parallel.experts import ExpertParallel
from hetprof.executor.parallel.sharded import ShardedModel
from hetprof.executor.parallel.weightsync import flatten_params
from hetprof.executor.records.iteration_report import prefill_timing, train_timing
from hetprof.executor.records.mfu import FLOPS_KEY, update_flops
from hetprof.executor.runners.base import RunnerBase, Tensors, WorkTiming
from hetprof.executor.runners.context import RankContext
from hetprof.runtime.dataparallel import wrap_replica
from hetprof.specs.vocabulary import Role, Task


class Trainer(RunnerBase):
    """One training task on this rank: its (wrapped) model, optimizer and learner."""

    head = "lm"  # the model's output: "lm" (causal LM) or "value" (scalar head)
    experts: ExpertParallel | None = None  # an expert-parallel replica's experts and collectives

    def __init__(self, ctx: RankContext, task: str, peers: Mapping[str, RunnerBase]) -> None:
        super().__init__(ctx, task, peers)
        self.role = Task(task).role
        self.shape = ctx.workload.roles()[self.role]  # what its model FLOPs are counted from
        model, self.sharded = self._place(self.build_model())
        workload, training = ctx.workload, ctx.workload.training
        settings = workload.optimizer
        optimizer = build_optimizer(model.parameters(), self.learning_rate(), settings)
        scheduler = build_scheduler(optimizer, settings, optimizer_steps(workload, ctx.options.iterations))
        replicated = self.sharded is None and len(self.placement.ranks) > 1
        parallel = self.sharded if self.sharded is not None else self.experts
        # The plan's log-prob pass (actor_logprob, on these ranks) runs as its own forward pass before
        # the advantages (proximal_logprobs) and hands the learner π_prox on the batch; the learner
        # recomputes it only for a batch that lacks it, and without the pass π_behav serves.
        self.learner = Learner(self.module, optimizer, ctx.algorithm, ppo_epochs=workload.ppo_epochs,
                               mini_batches=workload.mini_batches, role=self.role,
                               temperature=training.temperature,
                               recompute_proximal=Task.ACTOR_LOGPROB in ctx.tasks,
                               seed=ctx.options.seed, parallel=parallel, lr_scheduler=scheduler,
                               max_grad_norm=settings.max_grad_norm,
                               process_group=ctx.groups.replicas(task) if replicated else None,
                               max_tokens_per_microbatch=self.pack_tokens, sequence_parallel=self.sequence_parallel)

    def build_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def learning_rate(self) -> float:
        raise NotImplementedError

    def _place(self, model: torch.nn.Module) -> tuple[torch.nn.Module, ShardedModel | None]:
        """Wrap the model as the plan places it; sets `module` (what the learner steps) and
        returns the unwrapped parameters' owner for the optimizer."""
        ctx, tr = self.ctx, self.placement
        if tr.tp > 1 or tr.pp > 1:
            sharded = ShardedModel(model, ctx.topo, ctx.groups, self.task, ctx.rank, ctx.device, head=self.head)
            self.module = sharded.module
            return sharded.module, sharded
        if tr.ep > 1:  # whole-model replicas; hetprof.specs.executable refuses EP with TP, PP or sharding
            self.experts = ExpertParallel(model, ctx.groups.experts(self.task, tr.expert_group_of(ctx.rank)),
                                          ctx.groups.replicas(self.task),
                                          ctx.groups.expert_peers(self.task, tr.expert_place_of(ctx.rank)),
                                          replicas=len(tr.ranks))
            self.module = model
            return model, None
        # the plan's sharding (DDP or FSDP2); a sharded model's weights are DTensors
        replicas = len(tr.ranks)
        sharding = tr.sharding if replicas > 1 else "none"
        if sharding == "none" and (ctx.device.type == "cpu" or replicas == 1):
            flatten_params(model, ctx.options.bucket_mb)  # syncs broadcast straight from the weights
        self.module = wrap_replica(model, ctx.groups.replicas(self.task), ctx.device, sharding) if replicas > 1 \
            else model
        return model, None

    # ---- the update ----------------------------------------------------------------------------------
    def run(self, work: Tensors) -> dict[str, float]:
        """One update on this replica's part of the batch; its statistics (timing keys included) and
        the model FLOPs it did (records/mfu.py)."""
        workload = self.ctx.workload
        stats = self.learner.update(RLBatch(**work, group_size=workload.responses_per_prompt))
        stats[FLOPS_KEY] = update_flops(self.shape, work["attention_mask"].sum(1).tolist(), workload.ppo_epochs,
                                        lm_head=self.head == "lm")
        return stats

    def spans(self, result: dict[str, float], start: float, end: float) -> dict[str, tuple[float, float]]:
        """The update recomputes π_prox only for a batch that lacks it (its first forward): timed apart."""
        logprob = result.pop("logprob_seconds", 0.0)
        if not logprob:
            return {self.task: (start, end)}
        return {Task.ACTOR_LOGPROB: (start, start + logprob), self.task: (start + logprob, end)}

    def priced(self, work: Tensors, result: dict[str, float], seconds: dict[str, float]
               ) -> dict[str, list[WorkTiming]]:
        workload = self.ctx.workload
        budget = self.pack_tokens
        priced_length = workload.prompt_len.mean + workload.response_len.mean
        micro = result.pop("micro_batches", 1.0)
        stepping = result.pop("optimizer_seconds", 0.0)
        mask = work["attention_mask"]
        out = {}
        if Task.ACTOR_LOGPROB in seconds:
            n, width, passes = priced_pass(mask, budget, priced_length=priced_length)
            out[Task.ACTOR_LOGPROB] = [prefill_timing(n, width, seconds[Task.ACTOR_LOGPROB] / passes)]
        mini = workload.mini_batches
        n, width, packs = priced_pass(mask, budget, mini, micro, priced_length)
        out[self.task] = [train_timing(n * mini, width, seconds[self.task], workload.ppo_epochs, mini, packs,
                                       stepping)]
        return out

    # ---- weight sync ---------------------------------------------------------------------------------
    def full_weights(self) -> Tensors | None:
        """Every replica of a sharded (FSDP) trainer must take part in gathering the full weights
        before its lead can broadcast them; DDP replicas hold full copies and skip this."""
        if self.sharded is not None:  # TP/PP: replica 0's ranks gather, its first rank gets the result
            return self.sharded.full_state()
        if self.experts is not None:  # each EP group gathers its expert shards
            return self.experts.full_state()
        if not _is_sharded(self.module):
            return None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True))
        # the parameters the sync manifest names: a tied LM head appears in the state dict twice
        names = {n for n, _ in unwrap(self.module).named_parameters()}
        return {n: t for n, t in state.items() if n in names}

    def sync_model(self) -> torch.nn.Module:
        if self.sharded is not None:
            return self.sharded.reference
        return self.experts.reference if self.experts is not None else unwrap(self.module)

    # ---- checkpoints ---------------------------------------------------------------------------------
    def units(self, lead_only: bool) -> list[str]:
        """A training task, or for a TP/PP task one unit per (stage, TP position) such as
        "actor_train/stage1-tp0" (its own directory). Replica 0 writes each unit (`lead_only`);
        every replica loads the unit of its position."""
        if self.sharded is not None:
            pos = self.sharded.pos
            return [f"{self.task}/{pos.unit}"] if not lead_only or pos.replica == 0 else []
        return [self.task] if not lead_only or self.placement.lead == self.ctx.rank else []

    def gathers_state(self) -> bool:
        """Whether taking the state is a collective of the replicas (an FSDP-sharded or EP trainer)."""
        return self.experts is not None or (self.sharded is None and _is_sharded(self.module))

    def state(self) -> dict[str, Any]:
        """Model and optimizer state and the learner's progress (step counters, learning-rate schedule,
        shuffler); an FSDP-sharded or EP trainer gathers the full state, so every replica must call
        this (a collective), though only the lead writes it."""
        optimizer = self.learner.optimizer
        progress = {"learner": self.learner.progress_state()}
        if self.sharded is not None:
            return {**self.sharded.local_state(optimizer), **progress}
        if self.experts is not None:
            return {**self.experts.full_training_state(optimizer), **progress}
        if _is_sharded(self.module):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

            weights, moments = get_state_dict(self.module, optimizer, options=StateDictOptions(full_state_dict=True))
            return {"model": weights, "optimizer": moments, **progress}
        return {"model": unwrap(self.module).state_dict(), "optimizer": optimizer.state_dict(), **progress}

    def load_state(self, state: dict[str, Any]) -> None:
        """The state `state()` took; the learner's progress after the optimizer it schedules."""
        if not isinstance(state.get("learner"), dict):
            raise ValueError("no learner progress (step counters, learning-rate schedule, shuffler) in it")
        optimizer = self.learner.optimizer
        if self.sharded is not None:
            self.sharded.load_local_state(optimizer, state)
        elif self.experts is not None:  # every replica reads the whole model and keeps its experts
            self.experts.load_full_training_state(optimizer, state)
        elif _is_sharded(self.module):  # every replica reads the full state and keeps its shard
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

            set_state_dict(self.module, optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optimizer"], options=StateDictOptions(full_state_dict=True))
        else:
            unwrap(self.module).load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        self.learner.load_progress_state(state["learner"])

    def own_state(self) -> dict[str, Any]:
        """This replica's mini-batch shuffler: replicas with different shares of the rows advance
        theirs differently, and the unit holds its lead's only."""
        return {"shuffler": self.learner.shuffler_state()}

    def load_own_state(self, state: dict[str, Any]) -> None:
        if "shuffler" not in state:
            raise ValueError(f"no {self.task} mini-batch shuffler in it")
        self.learner.load_shuffler_state(state["shuffler"])


class ActorTrainer(Trainer):
    head = "lm"

    def build_model(self) -> torch.nn.Module:
        return build_causal_lm(self.ctx.model_ref(Role.ACTOR), seed=self.ctx.options.seed,
                               dtype=self.ctx.train_dtype, device=self.ctx.device, attn_implementation=self.attention)

    def learning_rate(self) -> float:
        return self.ctx.workload.training.lr


class CriticTrainer(Trainer):
    head = "value"

    def build_model(self) -> torch.nn.Module:
        return build_value_model(self.ctx.model_ref(Role.CRITIC), seed=self.ctx.options.seed + 1,
                                 dtype=self.ctx.train_dtype, device=self.ctx.device, attn_implementation=self.attention)

    def learning_rate(self) -> float:
        return self.ctx.workload.training.critic_lr


def _is_sharded(model: torch.nn.Module) -> bool:
    return any(hasattr(p, "full_tensor") for p in model.parameters())
