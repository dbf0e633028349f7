"""A scored batch of very different sequence lengths, for the packed-vs-padded equivalence tests."""

from __future__ import annotations

import torch

from hetprof.executor.algorithms import RLBatch
from hetprof.executor.models.logprobs import token_logprobs
from hetprof.executor.models.modeling import build_causal_lm

PROMPTS = [3, 9, 2, 6, 4, 12, 5, 7]
RESPONSES = [40, 2, 17, 5, 60, 1, 9, 3]


def ragged_batch(seed: int = 0, prompts=PROMPTS, responses=RESPONSES, vocab: int = 64) -> RLBatch:
    """Left-padded prompts and right-padded responses of very different lengths, scored like a rollout."""
    gen = torch.Generator().manual_seed(seed)
    p_max, r_max = max(prompts), max(responses)
    n, width = len(prompts), max(prompts) + max(responses)
    ids = torch.randint(0, vocab, (n, width), generator=gen)
    attn = torch.zeros(n, width, dtype=torch.long)
    resp = torch.zeros(n, width, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        attn[i, p_max - p:p_max + r] = 1
        resp[i, p_max:p_max + r] = 1
    assert width == p_max + r_max
    model = build_causal_lm("tiny", seed=1)
    with torch.no_grad():
        behaviour = token_logprobs(model, ids, attn) + 0.05 * torch.randn(n, width - 1, generator=gen)
        ref = token_logprobs(build_causal_lm("tiny", seed=2), ids, attn)
    mask = resp[:, 1:]
    return RLBatch(input_ids=ids, attention_mask=attn, mask=mask, rewards=torch.rand(n, generator=gen),
                   behaviour_logprobs=behaviour * mask, group_size=2, ref_logprobs=ref * mask,
                   values=torch.randn(n, width - 1, generator=gen) * mask)
