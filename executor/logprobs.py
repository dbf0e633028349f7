"""Per-token log-probabilities of given sequences under a model (reference and training recompute).

PPO's ratio divides the trainer's probabilities by the generator's, so both must be computed the
same way: same positions under left padding (`position_ids`), same temperature, fp32 softmax.
The result is in "shifted" space: column t is log p(token t+1 | tokens ≤ t), shape [B, T-1].
"""

from __future__ import annotations

import torch
from torch import nn

from hetprof.executor.modeling import position_ids


def logits_to_logprobs(logits: torch.Tensor, targets: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T)[target], in fp32, without materialising the full log-softmax."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / T) per position, in fp32."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def forward_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Logits of a causal LM (plain, DDP- or FSDP-wrapped) with padding-aware positions."""
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids(attention_mask), use_cache=False)
    return out.logits


def token_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False,
                   micro_batch_size: int | None = None):
    """Log-probs [B, T-1] of each next token; with `with_entropy`, also the entropy [B, T-1].

    Gradients flow when called outside `torch.no_grad()` (the training recompute); reference and
    proximal log-probs are called under no_grad. `micro_batch_size` bounds the logits memory
    (B × T × vocab floats) for big vocabularies.
    """
    n = input_ids.shape[0]
    step = micro_batch_size or n
    lps, ents = [], []
    for lo in range(0, n, step):
        ids, mask = input_ids[lo:lo + step], attention_mask[lo:lo + step]
        logits = forward_logits(model, ids, mask)[:, :-1]
        lps.append(logits_to_logprobs(logits, ids[:, 1:], temperature))
        if with_entropy:
            ents.append(entropy_from_logits(logits, temperature))
    lp = torch.cat(lps) if len(lps) > 1 else lps[0]
    if with_entropy:
        return lp, (torch.cat(ents) if len(ents) > 1 else ents[0])
    return lp


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x where mask is set (0 where nothing is set), the token-mean RL losses use."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)
