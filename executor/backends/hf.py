"""Generation with a plain transformers model: runs on any CPU or GPU, no extra engine needed.

The decode loop is ours rather than `model.generate` because RL needs three things generate does
not give together: sampling from a caller's `torch.Generator` (reproducible rollouts per rank),
the behaviour log-prob of each sampled token computed exactly as the trainer recomputes it
(padding-aware positions, fp32 softmax at the sampling temperature), and a rollout laid out for
training. The KV cache is transformers' own `DynamicCache`.

The loop is `hetprof.runtime.generation.sample_continuations`, which the profiler's `task.generate` row times
whole; each step's sampling is `hetprof.runtime.sampling.next_tokens`, which its decode row times:
behaviour log-probs are those of softmax(logits / temperature) — before top-p truncation — so they
are reproducible by `token_logprobs(..., temperature=...)` on the same weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from hetprof.errors import ExecutionError
from hetprof.executor.backends import register_backend
from hetprof.executor.backends.base import GenerationBackend, PhaseClock, Rollout, check_sampling
from hetprof.executor.models.modeling import unwrap
from hetprof.executor.models.tokenizer import Tokenizer
from hetprof.runtime.generation import sample_continuations


@register_backend("hf")
class HFBackend(GenerationBackend):
    """Batched sampling with a KV cache from a transformers causal LM held in this process."""

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, device: torch.device | str = "cpu"):
        self.model = unwrap(model)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self._targets = self.model.state_dict(keep_vars=True)
        # What the last generate() spent per phase, in the profiler's task-row terms, so a run's
        # records can teach `hetprof fit` the shapes it really ran (sampling included in decode).
        self.last_phases: list[dict] = []

    @torch.no_grad()
    def generate(self, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, generator: torch.Generator | None = None) -> Rollout:
        check_sampling(max_new_tokens, temperature, top_p)
        width = max((len(p) for p in prompt_ids), default=0)
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit is not None and width + max_new_tokens > limit:
            raise ExecutionError(f"prompt ({width} tokens) + max_new_tokens ({max_new_tokens}) exceed the "
                                 f"model's max_position_embeddings ({limit})")
        was_training = self.model.training
        self.model.eval()  # no dropout while sampling, even when the trainer shares this module
        clock = PhaseClock(self.device)
        try:
            got = sample_continuations(self.model, prompt_ids, max_new_tokens, temperature=temperature, top_p=top_p,
                                       generator=generator, pad_id=self.tokenizer.pad_id,
                                       eos_id=self.tokenizer.eos_id, device=self.device, lap=clock.lap)
        finally:
            self.model.train(was_training)
        self.last_phases = clock.phases
        resp_mask = got.alive.long()
        return Rollout(
            input_ids=torch.cat([got.prompt_ids, got.tokens], dim=1),
            attention_mask=torch.cat([got.prompt_mask, resp_mask], dim=1),
            response_mask=torch.cat([torch.zeros_like(got.prompt_ids), resp_mask], dim=1),
            logprobs=torch.cat([torch.zeros(got.tokens.shape[0], got.prompt_ids.shape[1], device=self.device),
                                got.logprobs], dim=1),
            lengths=resp_mask.sum(-1),
            prompt_width=got.prompt_ids.shape[1],
            finished=got.finished,
        )

    @torch.no_grad()
    def load_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy tensors into the model in place (names may carry a DDP `module.` prefix)."""
        for raw_name, tensor in named_tensors.items():
            name = raw_name[len("module."):] if raw_name.startswith("module.") else raw_name
            target = self._targets.get(name)
            if target is None:
                raise ExecutionError(f"weight sync: the generator's model has no parameter {raw_name!r}")
            if target.shape != tensor.shape:
                raise ExecutionError(f"weight sync: {name} has shape {tuple(tensor.shape)} from the trainer "
                                     f"but {tuple(target.shape)} on the generator")
            target.copy_(tensor)
