"""The interface every generation engine implements, and the rollout it hands to the rest of RL.

A rollout is laid out the way the trainer consumes it, whatever engine made it: the left-padded
prompt block of width P, then the response block (right-padded after <eos>), so one
`attention_mask` serves generation, reference, critic and training forwards alike.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Mapping, Sequence

import torch

from hetprof.errors import ExecutionError


@dataclasses.dataclass
class Rollout:
    input_ids: torch.Tensor       # [B, T] long: prompt (left-padded) + response (right-padded)
    attention_mask: torch.Tensor  # [B, T] long: 1 on real prompt and response tokens (eos included)
    response_mask: torch.Tensor   # [B, T] long: 1 on generated tokens (eos included)
    logprobs: torch.Tensor        # [B, T] float: behaviour log-prob of the token at t (0 off-response)
    lengths: torch.Tensor         # [B] long: response tokens per row (eos included)
    prompt_width: int             # P: where the response block starts
    finished: torch.Tensor | None = None  # [B] bool: ended with eos (else cut at max_new_tokens)

    @property
    def shifted_logprobs(self) -> torch.Tensor:
        """Behaviour log-probs aligned with `token_logprobs` output ([B, T-1], column t = token t+1)."""
        return self.logprobs[:, 1:]

    @property
    def shifted_mask(self) -> torch.Tensor:
        """Response mask aligned with `token_logprobs` output ([B, T-1])."""
        return self.response_mask[:, 1:]

    def response_ids(self) -> list[list[int]]:
        """Each row's generated ids (eos included), for decoding and reward functions."""
        block = self.input_ids[:, self.prompt_width:].tolist()
        return [row[:n] for row, n in zip(block, self.lengths.tolist(), strict=True)]

    def to(self, device: torch.device | str) -> Rollout:
        moved = {f.name: (v.to(device) if isinstance(v := getattr(self, f.name), torch.Tensor) else v)
                 for f in dataclasses.fields(self)}
        return Rollout(**moved)

    @property
    def num_tokens(self) -> int:
        """Generated tokens in this rollout (what tokens/s counts)."""
        return int(self.lengths.sum())


class PhaseClock:
    """Times consecutive phases of one generate() call as the profiler's task rows describe them.

    Each lap is {kind, batch, tokens, seconds}: `prefill` is `batch` prompts of `tokens` (padded)
    tokens, `decode` one step whose attention spans `tokens` cached tokens. On a GPU each lap waits
    for the device, so a lap is the phase's own time, not its launch time.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.phases: list[dict] = []
        self._mark = self._now()

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def lap(self, kind: str, batch: int, tokens: int) -> None:
        now = self._now()
        self.phases.append({"kind": kind, "batch": int(batch), "tokens": int(tokens), "seconds": now - self._mark})
        self._mark = now


class GenerationBackend(abc.ABC):
    """Produces rollouts with behaviour log-probs, and takes the trainer's weights after each update."""

    name = "base"
    # Phase timings of the last generate() ({kind, batch, tokens, seconds} dicts, see PhaseClock);
    # an engine that cannot see its phases (vLLM schedules them itself) leaves this empty.
    last_phases: list[dict] = []

    @abc.abstractmethod
    def generate(self, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, generator: torch.Generator | None = None) -> Rollout:
        """Sample one response per prompt (repeat a prompt for a group)."""

    @abc.abstractmethod
    def load_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Apply (part of) the trainer's state: the receive side of weight sync."""

    def weights_arrived(self) -> dict[str, float]:
        """Called once a whole weight sync has landed. An engine that computes from its own copy of
        the weights takes them here; returns the checks it made, to record with the iteration."""
        return {}

    def close(self) -> None:  # noqa: B027 (optional hook: most engines hold nothing to release)
        """Release the engine's resources (processes, GPU memory)."""


def check_sampling(max_new_tokens: int, temperature: float, top_p: float) -> None:
    """Refuse sampling settings no engine can honour, naming the setting."""
    if max_new_tokens < 1:
        raise ExecutionError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ExecutionError(f"temperature must be >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ExecutionError(f"top_p must be in (0, 1], got {top_p}")
