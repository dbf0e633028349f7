"""The forward passes over a collected batch that its advantages read: the actor's log-prob pass
(π_prox, on the actor trainer's ranks), the reference's log-probs and the critic's values.

Each pass runs one of three ways, chosen by how the plan placed it: a pipelined task runs its
stages' schedule (the last stage's output reaches every stage), a token budget packs the rows into
passes of at most that many tokens (models/packing.py), otherwise one padded forward. A family
says what each way returns; the choice is the base class's. An expert-parallel pass runs in its EP
group's lockstep (parallel/experts.py): its replicas' rows need not take as many forwards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from hetprof.errors import ExecutionError
from hetprof.executor.algorithms import RLBatch
from hetprof.executor.models.logprobs import token_logprobs
from hetprof.executor.models.modeling import build_causal_lm, build_value_model, unwrap
from hetprof.executor.models.packing import packed_values, priced_pass
from hetprof.executor.parallel.experts import expert_lockstep
from hetprof.executor.parallel.sharded import ShardedModel
from hetprof.executor.parallel.tensorpar import is_sharded, load_full
from hetprof.executor.records.iteration_report import prefill_timing
from hetprof.executor.runners.base import RunnerBase, Tensors, WorkTiming, place
from hetprof.executor.runners.context import RankContext
from hetprof.runtime.packedpass import logits_to_logprobs, packed_token_logprobs
from hetprof.specs.vocabulary import Role, Task


class InferencePass(RunnerBase):
    """A forward pass over this replica's rows; a family implements the ways it runs."""

    sharded: ShardedModel | None = None

    @torch.no_grad()
    def run(self, work: Tensors) -> Tensors:
        with expert_lockstep(self.module):
            return self._run(work)

    def _run(self, work: Tensors) -> Tensors:
        ids, mask = work["input_ids"], work["attention_mask"]
        pipe = self.sharded.pipeline if self.sharded is not None else None
        if pipe is not None:  # every stage runs the schedule; the last stage's output reaches all
            return self.from_pipeline(pipe.forward(ids, mask), ids, mask)
        budget = self.pack_tokens
        if budget is not None:  # packed passes of at most `budget` tokens
            return self.packed(ids, mask, budget, work.get("response_mask"))
        return self.padded(ids, mask)

    def from_pipeline(self, out: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> Tensors:
        raise ExecutionError(f"task {self.task}: no pipelined inference for it")

    def packed(self, ids: torch.Tensor, mask: torch.Tensor, budget: int,
               response_mask: torch.Tensor | None) -> Tensors:
        raise NotImplementedError

    def padded(self, ids: torch.Tensor, mask: torch.Tensor) -> Tensors:
        raise NotImplementedError

    def priced(self, work: Tensors, result: Tensors, seconds: dict[str, float]) -> dict[str, list[WorkTiming]]:
        """A packed pass is recorded as its average pack, the unit the plan prices (models/packing.py)."""
        workload = self.ctx.workload
        rows, width, passes = priced_pass(work["attention_mask"], self.pack_tokens,
                                          priced_length=workload.prompt_len.mean + workload.response_len.mean)
        return {self.task: [prefill_timing(rows, width, seconds[self.task] / passes)]}


class ReferenceLogprobs(InferencePass):
    """ref_infer: the reference model's log-probs of the rollouts (the KL terms)."""

    def __init__(self, ctx: RankContext, task: str, peers: Mapping[str, RunnerBase]) -> None:
        super().__init__(ctx, task, peers)
        model = build_causal_lm(ctx.model_ref(Role.REFERENCE), seed=ctx.options.seed, dtype=ctx.infer_dtype,
                                device=ctx.device, attn_implementation=self.attention).eval()
        self.module, self.sharded = place(ctx, task, model, head="lm", flatten=False)
        self.temperature = ctx.workload.training.temperature

    def from_pipeline(self, out: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> Tensors:
        return {"ref_logprobs": logits_to_logprobs(out[:, :-1], ids[:, 1:], self.temperature)}

    def packed(self, ids: torch.Tensor, mask: torch.Tensor, budget: int,
               response_mask: torch.Tensor | None) -> Tensors:
        # only response columns are read (KL terms), so the LM head skips the prompts
        needed = response_mask[:, 1:] if response_mask is not None else None
        lp = packed_token_logprobs(self.module, ids, mask, self.temperature, max_tokens=budget, needed=needed,
                                   sequence_parallel=self.sequence_parallel)
        return {"ref_logprobs": lp.float()}

    def padded(self, ids: torch.Tensor, mask: torch.Tensor) -> Tensors:
        return {"ref_logprobs": token_logprobs(self.module, ids, mask, temperature=self.temperature).float()}


class CriticValues(InferencePass):
    """critic_infer: the critic's values in the trainer's shifted space (column t: the state before
    token t+1); its copy is what the critic sync edge overwrites."""

    def __init__(self, ctx: RankContext, task: str, peers: Mapping[str, RunnerBase]) -> None:
        super().__init__(ctx, task, peers)
        model = build_value_model(ctx.model_ref(Role.CRITIC), seed=ctx.options.seed + 1, dtype=ctx.infer_dtype,
                                  device=ctx.device, attn_implementation=self.attention).eval()
        self.module, self.sharded = place(ctx, task, model, head="value")

    def packed(self, ids: torch.Tensor, mask: torch.Tensor, budget: int,
               response_mask: torch.Tensor | None) -> Tensors:
        return {"values": packed_values(self.module, ids, mask, budget, self.sequence_parallel)[:, :-1].float()}

    def padded(self, ids: torch.Tensor, mask: torch.Tensor) -> Tensors:
        return {"values": self.module(ids, mask)[:, :-1].float()}

    def sync_model(self) -> torch.nn.Module:
        return self.sharded.reference if self.sharded is not None else unwrap(self.module)

    def sync_target(self) -> torch.nn.Module:
        return unwrap(self.module)

    def apply_weights(self) -> Callable[[Tensors], Any]:
        target = self.sync_target()
        if is_sharded(target):
            return load_full(target)  # each TP rank keeps its shard of the full tensors
        params = dict(target.named_parameters())

        def apply(state: Tensors) -> None:
            with torch.no_grad():
                for name, tensor in state.items():
                    params[name].copy_(tensor)

        return apply


class ActorLogprobs(InferencePass):
    """actor_logprob: π_prox over a replica's rows, the actor trainer's own module before this
    iteration's update (every rank of the replica takes part: its TP shards and pipeline stages
    compute together). It runs on the trainer's ranks and holds no model of its own."""

    after = (Task.ACTOR_TRAIN,)

    def __init__(self, ctx: RankContext, task: str, peers: Mapping[str, RunnerBase]) -> None:
        super().__init__(ctx, task, peers)
        self.learner = peers[Task.ACTOR_TRAIN].learner

    @torch.no_grad()
    def run(self, work: Tensors) -> Tensors:
        ids = work["input_ids"]
        mask = work["response_mask"][:, 1:]
        rows = RLBatch(input_ids=ids, attention_mask=work["attention_mask"], mask=mask,
                       rewards=mask.new_zeros(len(ids), dtype=torch.float32),
                       behaviour_logprobs=mask.new_zeros(mask.shape, dtype=torch.float32))
        return {"proximal_logprobs": self.learner.proximal_logprobs(rows).float()}
