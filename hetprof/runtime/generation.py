"""The decode loop of an RL generator: shared by the executor's `hf` backend and the profiler.

A generation call costs more than its prefill and its decode steps timed one by one: the prompts are
padded into tensors, the first decode steps after a prefill run slower than steady ones (the
prefill has evicted what the steps use), and every step grows the attention mask — time no per-phase
row sees (docs/DESIGN.md §10 says why and which bench measures it). The profiler's
`task.generate` row times whole calls of this very function, and `hetprof fit` turns what they take
beyond the per-phase rows into a per-call term (see costmodels/calloverhead.py). Neither the executor
nor the profiler may import the other, so the loop lives here, next to its sampling step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from hetprof.runtime.sampling import next_tokens

Lap = Callable[[str, int, int], None]  # (phase kind, batch, tokens): called as each phase ends


def pad_left(sequences: Sequence[Sequence[int]], pad_id: int, device: Any = "cpu") -> tuple[Any, Any]:
    """Left-pad id lists into (input_ids, attention_mask) so every row's next token is at the end.

    Generation appends at the right edge for all rows at once; left padding is what lets a batch of
    prompts of different lengths share one decode step.
    """
    import torch

    if not sequences:
        raise ValueError("pad_left needs at least one sequence")
    width = max(len(s) for s in sequences)
    for row, seq in enumerate(sequences):
        if len(seq) == 0:
            raise ValueError(f"sequence {row} is empty (a prompt needs at least one token)")
    # built as Python lists and converted once: one tensor copy instead of a slice assignment per row
    ids = torch.tensor([[pad_id] * (width - len(seq)) + list(seq) for seq in sequences], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(seq)) + [1] * len(seq) for seq in sequences], dtype=torch.long)
    return ids.to(device), mask.to(device)


def position_ids(attention_mask: Any) -> Any:
    """Positions that ignore left padding, so a padded row sees the same RoPE phases as unpadded.

    Generation and log-prob recompute must agree on this, or the trainer's log-probs drift from
    the generator's for every left-padded prompt.
    """
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp_(min=0)


@dataclasses.dataclass
class Continuations:
    """What one call sampled: [B, n] tokens, behaviour log-probs and alive flags, and the padded prompts."""

    prompt_ids: Any
    prompt_mask: Any
    tokens: Any
    logprobs: Any
    alive: Any
    finished: Any


def cache_argument(model: Any) -> str:
    """The keyword a model's forward takes its KV cache by: `cache` from transformers 5.2x on, where
    `past_key_values` warns on every call that it goes away (in 5.40), else `past_key_values`."""
    import inspect

    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward without a signature (a C extension): the old name
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def sample_continuations(model: Any, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int, *,
                         temperature: float, top_p: float, generator: Any, pad_id: int, eos_id: int,
                         device: Any = "cpu", lap: Lap | None = None) -> Continuations:
    """Pad the prompts, prefill them into a KV cache and sample up to `max_new_tokens` per row.

    Only the last position's logits are computed in the prefill (`logits_to_keep=1`): all of them
    would be batch × prompt × vocab floats, gigabytes for a 152k vocabulary. `lap` sees the phases
    as the profiler's rows describe them: the prefill, then each decode step with its sampling.
    The caller puts the model in eval mode and under no_grad.
    """
    import torch
    from transformers import DynamicCache

    ids, mask = pad_left(prompt_ids, pad_id, device)
    batch, width = ids.shape
    cache = {cache_argument(model): DynamicCache(config=model.config)}
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), **cache,
                use_cache=True, logits_to_keep=1)
    if lap is not None:
        lap("prefill", batch, width)
    next_pos = mask.sum(-1, keepdim=True)
    grown = mask
    finished = torch.zeros(batch, dtype=torch.bool, device=ids.device)
    tokens, lps, alive = [], [], []
    for step in range(max_new_tokens):
        tok, lp, valid, finished = next_tokens(out.logits[:, -1], finished, temperature, top_p, generator,
                                               pad_id, eos_id)
        tokens.append(tok)
        lps.append(lp)
        alive.append(valid)
        last = bool(finished.all()) or step == max_new_tokens - 1
        if step and lap is not None:  # a decode lap: the previous step's forward and this sampling
            lap("decode", batch, width + step)
        if last:
            break
        grown = torch.cat([grown, valid.long()[:, None]], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=grown, position_ids=next_pos, **cache, use_cache=True)
        next_pos = next_pos + 1
    return Continuations(ids, mask, torch.stack(tokens, dim=1), torch.stack(lps, dim=1),
                         torch.stack(alive, dim=1), finished)
