"""Generation with a plain transformers model: runs on any CPU or GPU, no extra engine needed.

The decode loop is ours rather than `model.generate` because RL needs three things generate does
not give together: sampling from a caller's `torch.Generator` (reproducible rollouts per rank),
the behaviour log-prob of each sampled token computed exactly as the trainer recomputes it
(padding-aware positions, fp32 softmax at the sampling temperature), and a rollout laid out for
training. The KV cache is transformers' own `DynamicCache`.

Each step's sampling is `hetprof.sampling.next_tokens`, the function the profiler's decode row times:
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
from hetprof.executor.modeling import position_ids, unwrap
from hetprof.executor.tokenizer import Tokenizer, pad_left
from hetprof.sampling import next_tokens


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
        from transformers import DynamicCache

        check_sampling(max_new_tokens, temperature, top_p)
        pad, eos = self.tokenizer.pad_id, self.tokenizer.eos_id
        ids, mask = pad_left(prompt_ids, pad, self.device)
        batch, width = ids.shape
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit is not None and width + max_new_tokens > limit:
            raise ExecutionError(f"prompt ({width} tokens) + max_new_tokens ({max_new_tokens}) exceed the "
                                 f"model's max_position_embeddings ({limit})")
        was_training = self.model.training
        self.model.eval()  # no dropout while sampling, even when the trainer shares this module
        clock = PhaseClock(self.device)
        try:
            cache = DynamicCache(config=self.model.config)
            # Only the last position's logits are sampled from: asking for all of them would
            # materialise batch × prompt × vocab floats (gigabytes for a 152k vocabulary).
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask),
                             past_key_values=cache, use_cache=True, logits_to_keep=1)
            clock.lap("prefill", batch, width)
            next_pos = mask.sum(-1, keepdim=True)
            finished = torch.zeros(batch, dtype=torch.bool, device=self.device)
            tokens, lps, alive = [], [], []
            for step in range(max_new_tokens):
                tok, lp, valid, finished = next_tokens(out.logits[:, -1], finished, temperature, top_p,
                                                       generator, pad, eos)
                tokens.append(tok)
                lps.append(lp)
                alive.append(valid)
                if bool(finished.all()) or step == max_new_tokens - 1:
                    if step:  # the last step's forward ran in the previous iteration
                        clock.lap("decode", batch, width + step)
                    break
                if step:
                    clock.lap("decode", batch, width + step)
                mask = torch.cat([mask, valid.long()[:, None]], dim=1)
                out = self.model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos,
                                 past_key_values=cache, use_cache=True)
                next_pos = next_pos + 1
        finally:
            self.model.train(was_training)
        self.last_phases = clock.phases
        resp = torch.stack(tokens, dim=1)
        resp_mask = torch.stack(alive, dim=1).long()
        resp_lp = torch.stack(lps, dim=1)
        prompt_mask = (torch.arange(width, device=self.device)[None, :]
                       >= (width - torch.tensor([len(p) for p in prompt_ids], device=self.device))[:, None])
        return Rollout(
            input_ids=torch.cat([ids, resp], dim=1),
            attention_mask=torch.cat([prompt_mask.long(), resp_mask], dim=1),
            response_mask=torch.cat([torch.zeros_like(ids), resp_mask], dim=1),
            logprobs=torch.cat([torch.zeros(batch, width, device=self.device), resp_lp], dim=1),
            lengths=resp_mask.sum(-1),
            prompt_width=width,
            finished=finished,
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
