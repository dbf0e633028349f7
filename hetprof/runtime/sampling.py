"""One sampling step of an RL generator: shared by the executor's `hf` backend and the profiler.

Every decode step of a rollout turns the last position's logits into a token and that token's
behaviour log-prob, and keeps finished rows padded. The profiler's decode row times a model step
followed by this very function, so the per-step work the cost model is told is the per-step work a
run does (a lighter stand-in sampler made a run's decode steps slower than the rows that priced
them). Neither stage may import the other, so the function lives here.

Behaviour log-probs are those of softmax(logits / temperature) — before top-p truncation — so the
trainer reproduces them from the same weights; temperature 0 is greedy, with log-probs at T = 1.
"""

from __future__ import annotations

from typing import Any


def sample_tokens(logprobs: Any, top_p: float, generator: Any) -> Any:
    """Draw one token per row from exp(logprobs), keeping the smallest nucleus of mass ≥ top_p."""
    import torch

    probs = logprobs.exp()
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass of strictly more likely tokens
        sorted_p = sorted_p.masked_fill(before >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def next_tokens(logits: Any, finished: Any, temperature: float, top_p: float, generator: Any,
                pad_id: int, eos_id: int) -> tuple[Any, Any, Any, Any]:
    """(tokens, behaviour log-probs, alive, finished after this step) from the last logits [B, V].

    Rows already finished get `pad_id` and log-prob 0 and are not alive; a row finishes when it
    draws `eos_id`.
    """
    import torch

    logits = logits.float()
    if temperature > 0:
        lp_all = torch.log_softmax(logits / temperature if temperature != 1.0 else logits, dim=-1)
        tok = sample_tokens(lp_all, top_p, generator)
    else:
        lp_all = torch.log_softmax(logits, dim=-1)
        tok = lp_all.argmax(-1)
    alive = ~finished
    tok = tok.masked_fill(finished, pad_id)
    lp = lp_all.gather(-1, tok[:, None]).squeeze(-1).masked_fill(finished, 0.0)
    return tok, lp, alive, finished | (tok == eos_id)
