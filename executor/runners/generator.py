"""actor_gen: the generation replica's rollouts of its share of each batch's prompts.

The generator holds the actor in the inference precision inside a generation backend (HF or vLLM),
sharded over its replica's TP ranks or laid out flat so weight syncs land in place; it never builds
an optimizer. Every TP rank of a replica runs the same generation (same seed, same tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hetprof.executor.backends import get_backend
from hetprof.executor.models.modeling import build_causal_lm, unwrap
from hetprof.executor.parallel.batch_split import share_slices
from hetprof.executor.parallel.tensorpar import is_sharded, load_full
from hetprof.executor.prompts.data import encode_prompt
from hetprof.executor.runners.base import RunnerBase, Tensors, WorkTiming, place
from hetprof.executor.runners.context import RankContext
from hetprof.specs.vocabulary import Role


@dataclass(frozen=True)
class GenerationStep:
    """Generate batch `batch` with the weights of version `version`."""

    batch: int
    version: int


class Generator(RunnerBase):
    """The actor's generation copy and the backend that samples from it."""

    def __init__(self, ctx: RankContext, task: str, peers: Mapping[str, RunnerBase]) -> None:
        super().__init__(ctx, task, peers)
        model = build_causal_lm(ctx.model_ref(Role.ACTOR), seed=ctx.options.seed, dtype=ctx.infer_dtype,
                                device=ctx.device)
        self.module, self.sharded = place(ctx, task, model, head="lm")
        self.backend = get_backend(ctx.options.backend)(self.module, ctx.tokenizer, ctx.device)

    def run(self, work: GenerationStep) -> Tensors:
        """This replica's share of the batch's prompts, `responses_per_prompt` samples each."""
        ctx, workload = self.ctx, self.ctx.workload
        prompts = ctx.prompts(work.batch)
        mine = share_slices(len(prompts), self.placement.shares)[self.replica]
        n = workload.responses_per_prompt
        ids = [encode_prompt(ctx.tokenizer, p, workload.data.chat_template) for p in prompts[mine] for _ in range(n)]
        gen = torch.Generator(device=ctx.device)
        gen.manual_seed(hash_seed(ctx.options.seed, work.batch, self.replica))
        out = self.backend.generate(ids, workload.response_len.cap, temperature=workload.training.temperature,
                                    top_p=workload.training.top_p, generator=gen)
        return {"input_ids": out.input_ids, "attention_mask": out.attention_mask,
                "response_mask": out.response_mask, "logprobs": out.logprobs.float(),
                "version": torch.full((len(ids),), work.version, dtype=torch.long),
                "prompt_index": torch.arange(mine.start, mine.stop).repeat_interleave(n)}

    def priced(self, work: GenerationStep, result: Tensors, seconds: dict[str, float]) -> dict[str, list[WorkTiming]]:
        return {self.task: list(getattr(self.backend, "last_phases", []))}

    def sync_model(self) -> torch.nn.Module:
        return self.sharded.reference if self.sharded is not None else unwrap(self.module)

    def sync_target(self) -> torch.nn.Module:
        return unwrap(self.module)

    def apply_weights(self) -> Callable[[Tensors], Any]:
        if is_sharded(self.sync_target()):
            return load_full(self.sync_target())  # each TP rank keeps its shard of the full tensors
        return self.backend.load_weights

    def weights_arrived(self) -> dict[str, float]:
        """An engine with its own copy (vLLM) loads the new weights and checks them."""
        return self.backend.weights_arrived()

    def close(self) -> None:
        """Release what the generation engine holds (vLLM's engine processes)."""
        self.backend.close()


def hash_seed(*parts: int) -> int:
    """A 63-bit seed from integers: the same (seed, batch, replica) samples the same on any run."""
    value = 0x9E3779B97F4A7C15
    for p in parts:
        value = (value * 6364136223846793005 + int(p) + 1442695040888963407) % (1 << 63)
    return value
