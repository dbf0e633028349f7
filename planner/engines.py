"""Generation engines: how a generator replica turns the cost model's call times into its own time.

The plan names its engine (`hetprof plan --backend`); each prices one replica's batch the way that
engine runs it:
- `vllm`: continuous batching over a paged KV cache. Requests are admitted first come, first
  served while a seat (`max_num_seqs`) and KV blocks for the whole sequence are free (no
  preemption: a block reserved is a block the sequence will use); every decode step advances each
  live sequence by one token at the live batch and its mean context; a finished sequence frees its
  seat and blocks at once, so the batch shrinks as short responses finish and refills from the queue.
- `hf`: the padded loop `hetprof run` runs with its `hf` backend: waves of as many sequences as
  the KV cache holds, prompts left-padded to the wave's longest, the whole wave decoding every step
  until its longest response ends; a wave's sequences all finish when it does.

Both read one function `call(batch, prompt, steps)` — the cost model's seconds for a call that
prefills `batch` prompts of `prompt` tokens and decodes `steps` steps with the whole batch — so
engine and cost model stay separate. The vllm engine asks it on a small grid (batches 1, 2, 4, …;
a few response lengths) and interpolates: a replica's events number in the hundreds, and the
fitted cost model is too slow to be asked at each.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
from collections.abc import Callable

import numpy as np

from hetprof.catalog import lookup
from hetprof.registry import Registry
from hetprof.specs import ClusterSpec

Call = Callable[[int, float, float], float]  # (batch, prompt tokens, decode steps) -> seconds
RESPONSE_POINTS = 4  # segments of the response range the per-step cost is sampled on


@dataclasses.dataclass(frozen=True)
class EngineRun:
    """One replica's generation: seconds, and each sequence's finish time (sorted)."""

    seconds: float
    finish: tuple[float, ...]
    note: str = ""


@dataclasses.dataclass(frozen=True)
class EngineLimits:
    """What bounds a replica's concurrency: KV-cache tokens it has room for, and the engine's knobs."""

    kv_tokens: int
    max_num_seqs: int = 256
    block_tokens: int = 16


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    """One replica's share of a step: response lengths in arrival order, the mean prompt, and the
    widths a padded batch of k sequences has (its longest prompt, its longest response)."""

    lengths: tuple[float, ...]
    prompt: float
    padded_prompt: Callable[[int], float]
    padded_response: Callable[[int], float]
    limits: EngineLimits


class StepTable:
    """Per-step decode seconds and prefill seconds of one replica, interpolated from a grid of calls.

    One decode step of b sequences at context c costs call(b, c, 1) − call(b, c, 0) (the prefill
    cancels). The grid spans batches 1, 2, 4, … and contexts from the prompt to the longest
    sequence; batches in between interpolate linearly (the roofline is piecewise linear in the
    batch), contexts too. A grid point whose KV (b·c tokens) exceeds the room is priced at the
    batch that fits, scaled up — admission never lets a live batch get there.
    """

    def __init__(self, call: Call, prompt: float, most: int, longest: int, kv_tokens: int) -> None:
        self.call, self.prompt, self.kv_tokens = call, prompt, kv_tokens
        self.batches = sorted({min(most, 1 << i) for i in range(max(1, most).bit_length() + 1)})
        top = prompt + max(1, longest)
        self.contexts = [prompt + (top - prompt) * i / RESPONSE_POINTS for i in range(RESPONSE_POINTS + 1)]
        self.step = {(b, c): self._step(b, c) for b in self.batches for c in self.contexts}
        self.fill = {b: call(b, prompt, 0) for b in self.batches}

    def _step(self, b: int, context: float) -> float:
        fits = max(1, min(b, int(self.kv_tokens // max(1.0, context + 1))))
        return (self.call(fits, context, 1) - self.call(fits, context, 0)) * b / fits

    def _between(self, b: float, at: Callable[[int], float]) -> float:
        i = min(bisect.bisect_left(self.batches, b), len(self.batches) - 1)
        b1 = self.batches[i]
        if b1 == b or i == 0:
            return at(b1) * (b / b1 if b < b1 else 1.0)
        b0 = self.batches[i - 1]
        return at(b0) + (at(b1) - at(b0)) * (b - b0) / (b1 - b0)

    def prefill(self, batch: int) -> float:
        """Seconds to prefill `batch` prompts (the call with no decode step)."""
        return self._between(batch, self.fill.__getitem__)

    def decode(self, batch: float, context: float) -> float:
        """Seconds of one decode step of `batch` live sequences whose mean context is `context` tokens."""
        cs = self.contexts
        j = min(max(1, bisect.bisect_left(cs, context)), len(cs) - 1)
        c0, c1 = cs[j - 1], cs[j]
        w = min(1.0, max(0.0, (context - c0) / (c1 - c0))) if c1 > c0 else 0.0
        return self._between(batch, lambda b: (1 - w) * self.step[(b, c0)] + w * self.step[(b, c1)])


def _blocks(tokens: float, block: int) -> int:
    return math.ceil(tokens / block)


def vllm_generation(request: GenerationRequest, call: Call) -> EngineRun:
    """Continuous batching of the request's sequences, in arrival order, behind mean-length prompts."""
    prompt, limits = request.prompt, request.limits
    lens = [max(1, int(x)) for x in request.lengths]
    if not lens:
        return EngineRun(0.0, ())
    blocks = limits.kv_tokens // limits.block_tokens
    need = [_blocks(prompt + n, limits.block_tokens) for n in lens]
    if max(need) > blocks:
        return EngineRun(math.inf, (), f"a {prompt + max(lens):.0f}-token sequence needs {max(need)} KV blocks "
                                        f"of {limits.block_tokens} tokens; the replica has room for {blocks}")
    table = StepTable(call, prompt, max(1, min(limits.max_num_seqs, len(lens))), max(lens), limits.kv_tokens)
    clock, step, used, queue, start_sum = 0.0, 0, 0, 0, 0
    live: list[tuple[int, int]] = []   # (decode step at which it finishes, index)
    starts: dict[int, int] = {}
    finish: list[float] = []
    while queue < len(lens) or live:
        admitted = 0
        while queue < len(lens) and len(live) < limits.max_num_seqs and used + need[queue] <= blocks:
            heapq.heappush(live, (step + lens[queue], queue))
            starts[queue] = step
            start_sum += step
            used += need[queue]
            queue += 1
            admitted += 1
        if admitted:
            clock += table.prefill(admitted)
        end = live[0][0]
        span = end - step
        batch = len(live)
        decoded = step + span / 2 - start_sum / batch  # mean tokens decoded, mid-span
        clock += span * table.decode(batch, prompt + decoded)
        step = end
        while live and live[0][0] == step:
            _, i = heapq.heappop(live)
            used -= need[i]
            start_sum -= starts.pop(i)
            finish.append(clock)
    return EngineRun(clock, tuple(sorted(finish)))


def hf_generation(request: GenerationRequest, call: Call) -> EngineRun:
    """The padded loop over the request's sequences: waves as large as the KV cache holds, each
    prefilled at its padded prompt width and decoding its longest response with the whole wave."""
    prompt_width, response_width, limits = request.padded_prompt, request.padded_response, request.limits
    n = len(request.lengths)
    if n == 0:
        return EngineRun(0.0, ())
    width = prompt_width(n) + response_width(n)
    wave = min(n, int(limits.kv_tokens // max(1.0, width)))
    if wave < 1:
        return EngineRun(math.inf, (), f"not even one {width:.0f}-token sequence's KV cache fits "
                                       f"({limits.kv_tokens} tokens of room)")
    clock, finish = 0.0, []
    for start in range(0, n, wave):
        size = min(wave, n - start)
        clock += call(size, prompt_width(size), response_width(size))
        finish.extend([clock] * size)
    return EngineRun(clock, tuple(finish))


Engine = Callable[[GenerationRequest, Call], EngineRun]
ENGINES: Registry[Engine] = Registry("generation engine", "hetprof.generation_engines", check=callable,
                                     expected="a function (GenerationRequest, call) -> EngineRun")
ENGINES.register("vllm", vllm_generation)
ENGINES.register("hf", hf_generation)


def default_backend(cluster: ClusterSpec) -> str:
    """vllm on a cluster with GPUs — the engine public RL frameworks generate with, and the one
    `hetprof run` offers there — and hf on a CPU-only cluster, the only engine that runs on it."""
    return "hf" if all(lookup(d.type).vendor == "generic" for d in cluster.devices()) else "vllm"


def arrival_order(lengths: np.ndarray) -> np.ndarray:
    """Sorted lengths in a fixed shuffled order: the order requests of one step reach an engine."""
    return np.asarray(lengths)[np.random.default_rng(0).permutation(len(lengths))]
