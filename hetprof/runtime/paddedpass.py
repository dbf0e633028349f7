"""One padded forward pass of a causal LM and its per-token log-probs: the code a run's padded
reference and log-prob passes (and the training recompute) execute, and the code the profiler's
padded inference rows time.

Why here and not in the executor: the profiler may not import the executor, and a row that times a
bare forward instead of this pass leaves out its fp32 log-softmax over the vocabulary at every
position, a bias no fit recovers (the packed pass is hetprof/runtime/packedpass.py, for the same reason).

PPO's ratio divides the trainer's probabilities by the generator's, so both must be computed the
same way: same positions under left padding (`position_ids`), same temperature, fp32 softmax.
The result is in "shifted" space: column t is log p(token t+1 | tokens ≤ t), shape [B, T-1].
"""

from __future__ import annotations

import torch
from torch import nn

from hetprof.runtime.generation import position_ids
from hetprof.runtime.packedpass import entropy_from_logits, logits_to_logprobs


def forward_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   keep_last: int | None = None) -> torch.Tensor:
    """Logits of a causal LM (plain, DDP- or FSDP-wrapped) with padding-aware positions.

    `keep_last` asks the model for the last positions' logits only (transformers' `logits_to_keep`),
    which skips the LM head over the prompt: most of the memory for a big vocabulary.
    """
    kwargs = {"logits_to_keep": keep_last} if keep_last else {}
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids(attention_mask), use_cache=False, **kwargs)
    return out.logits


def token_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False,
                   micro_batch_size: int | None = None, from_column: int = 0,
                   entropy_grad: bool = True):
    """Log-probs [B, T-1] of each next token; with `with_entropy`, also the entropy [B, T-1].

    Gradients flow when called outside `torch.no_grad()` (the training recompute); reference and
    proximal log-probs are called under no_grad. `micro_batch_size` bounds the logits memory
    (B × T × vocab floats) for big vocabularies. `from_column` computes only columns ≥ it (the
    response block; earlier columns are returned as 0). `entropy_grad=False` keeps the entropy out of
    the autograd graph when it is only logged.
    """
    n, width = input_ids.shape
    from_column = max(0, min(from_column, width - 1))
    keep = width - from_column if from_column > 0 else None
    step = micro_batch_size or n
    lps, ents = [], []
    for lo in range(0, n, step):
        ids, mask = input_ids[lo:lo + step], attention_mask[lo:lo + step]
        logits = forward_logits(model, ids, mask, keep)[:, :-1]
        lps.append(logits_to_logprobs(logits, ids[:, from_column + 1:], temperature))
        if with_entropy:
            ents.append(entropy_from_logits(logits if entropy_grad else logits.detach(), temperature))
    lp = _left_zero_pad(torch.cat(lps) if len(lps) > 1 else lps[0], from_column)
    if with_entropy:
        return lp, _left_zero_pad(torch.cat(ents) if len(ents) > 1 else ents[0], from_column)
    return lp


def _left_zero_pad(x: torch.Tensor, columns: int) -> torch.Tensor:
    if columns == 0:
        return x
    return torch.cat([x.new_zeros(x.shape[0], columns), x], dim=1)
