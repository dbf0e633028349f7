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
- `static`: static batching with the device's own kernels (TensorRT-LLM as NeMo-Aligner runs it):
  requests are taken in arrival order in fixed micro-batches of `max_num_seqs` (fewer when their
  KV cache would not fit); each micro-batch prefills its real prompts and decodes, whole, until
  its own longest response ends; finished sequences keep their seats, none is refilled.

Both read one function `call(batch, prompt, steps)` — the cost model's seconds for a call that
prefills `batch` prompts of `prompt` tokens and decodes `steps` steps with the whole batch — so
engine and cost model stay separate. The vllm engine asks it on a small grid (batches 1, 2, 4, …;
a few response lengths) and interpolates: a replica's events number in the hundreds, and the
fitted cost model is too slow to be asked at each.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
from collections.abc import Callable

import numpy as np

from hetprof.registry import Registry
from hetprof.specs import ClusterSpec

Call = Callable[[int, float, float], float]  # (batch, prompt tokens, decode steps) -> seconds
CONTEXT_SEGMENTS = 2  # the context range's pieces the step cost is sampled on (it is near-linear in it)


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
    table: StepTable | None = None  # the replica kind's step costs, if the caller keeps one per kind


class StepTable:
    """Per-step decode seconds and prefill seconds of one replica, interpolated from a grid of calls.

    One decode step of b sequences at context c costs call(b, c, 1) − call(b, c, 0) (the prefill
    cancels). The grid spans batches 1, 4, 16, … and three contexts from the prompt to the longest
    sequence; every whole batch up to the most is interpolated once, linearly (the roofline is
    piecewise linear in the batch and near-linear in the context), so an engine's thousands of steps
    cost two list lookups each. Past the batch whose KV (b·c tokens) fits, a step is priced as the
    cost model prices it, in waves of what fits — admission never lets a live batch get there.
    """

    def __init__(self, call: Call, prompt: float, most: int, longest: int, kv_tokens: int) -> None:
        self.call, self.most = call, max(1, most)
        top = prompt + max(1, longest)
        self.contexts = [prompt + (top - prompt) * i / CONTEXT_SEGMENTS for i in range(CONTEXT_SEGMENTS + 1)]
        self.steps = [self._row(c, lambda b, c=c: call(b, c, 1) - call(b, c, 0), kv_tokens // max(1, round(c + 1)))
                      for c in self.contexts]
        self.fills = self._row(prompt, lambda b: call(b, prompt, 0), kv_tokens // max(1, round(prompt)))

    def _row(self, context: float, cost: Callable[[int], float], room: int) -> list[float]:
        """`cost` at every whole batch up to the most: sampled at 1, 4, 16, … up to the batch whose KV
        fits at `context`, linear in between; past it the cost model's own rule, waves of what fits."""
        fits = max(1, min(self.most, room))
        grid = sorted({min(fits, 4 ** i) for i in range(fits.bit_length())} | {fits})
        values = [cost(b) for b in grid]
        row = np.interp(np.arange(fits + 1), grid, values).tolist()
        return row + [values[-1] * b / fits for b in range(fits + 1, self.most + 1)]

    def prefill(self, batch: np.ndarray | int) -> np.ndarray | float:
        """Seconds to prefill `batch` prompts (the call with no decode step); arrays element-wise."""
        b = np.asarray(batch)
        out = np.asarray(self.fills)[np.minimum(b, self.most)] * np.maximum(1.0, b / self.most)
        return out if out.ndim else float(out)

    def decode(self, batch: np.ndarray | int, context: np.ndarray | float) -> np.ndarray | float:
        """Seconds of one decode step of `batch` live sequences whose mean context is `context` tokens
        (arrays element-wise)."""
        b, c = np.asarray(batch), np.asarray(context, dtype=float)
        cs = np.asarray(self.contexts)
        j = np.clip(np.searchsorted(cs, c, side="left"), 1, len(cs) - 1)
        c0, c1 = cs[j - 1], cs[j]
        w = np.clip((c - c0) / np.where(c1 > c0, c1 - c0, 1.0), 0.0, 1.0)
        rows, bb = np.asarray(self.steps), np.minimum(b, self.most)
        out = ((1 - w) * rows[j - 1, bb] + w * rows[j, bb]) * np.maximum(1.0, b / self.most)
        return out if out.ndim else float(out)


def _blocks(tokens: float, block: int) -> int:
    return math.ceil(tokens / block)


@functools.lru_cache(maxsize=1024)
def continuous_schedule(lens: tuple[int, ...], need: tuple[int, ...], seats: int, blocks: int
                        ) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) decode step of each sequence under first-come-first-served admission while a seat
    and its KV blocks are free. It depends on lengths and limits only, not on any cost, so one
    schedule serves every replica kind with the same batch."""
    starts, ends = [0] * len(lens), [0] * len(lens)
    live: list[tuple[int, int]] = []
    step = used = queue = 0
    while queue < len(lens) or live:
        while queue < len(lens) and len(live) < seats and used + need[queue] <= blocks:
            heapq.heappush(live, (step + lens[queue], queue))
            starts[queue], used, queue = step, used + need[queue], queue + 1
        step = live[0][0]
        while live and live[0][0] == step:
            _, i = heapq.heappop(live)
            used -= need[i]
            ends[i] = step
    return np.asarray(starts), np.asarray(ends)


def vllm_generation(request: GenerationRequest, call: Call) -> EngineRun:
    """Continuous batching of the request's sequences, in arrival order, behind mean-length prompts.

    Between two events (a sequence finishing, requests admitted) the live batch is constant; each
    such span costs its steps at that batch and its mean context mid-span, and every admission a
    prefill of the requests it lets in, before the span that follows.
    """
    prompt, limits = request.prompt, request.limits
    lens = tuple(max(1, int(x)) for x in request.lengths)
    if not lens:
        return EngineRun(0.0, ())
    blocks = limits.kv_tokens // limits.block_tokens
    need = tuple(_blocks(prompt + n, limits.block_tokens) for n in lens)
    if max(need) > blocks:
        return EngineRun(math.inf, (), f"a {prompt + max(lens):.0f}-token sequence needs {max(need)} KV blocks "
                                        f"of {limits.block_tokens} tokens; the replica has room for {blocks}")
    table = request.table or StepTable(call, prompt, min(limits.max_num_seqs, len(lens)), max(lens), limits.kv_tokens)
    seats = limits.max_num_seqs
    binds = sum(sorted(need)[-seats:]) > blocks  # can the KV cache, not the seats, hold admissions back?
    starts, ends = continuous_schedule(lens, need, seats, blocks if binds else sum(need))
    events = np.unique(np.concatenate([starts, ends]))
    t0, span = events[:-1], np.diff(events)
    by_start, by_end = np.sort(starts), np.argsort(ends, kind="stable")
    started = np.searchsorted(by_start, t0, side="right")
    ended = np.searchsorted(ends[by_end], t0, side="right")
    live = started - ended
    start_sum = np.concatenate([[0], np.cumsum(by_start)])[started] - np.concatenate(
        [[0], np.cumsum(starts[by_end])])[ended]
    decoded = t0 + span / 2 - start_sum / np.maximum(live, 1)
    segment = np.where(live > 0, span * table.decode(np.maximum(live, 1), prompt + decoded), 0.0)
    admitted = np.bincount(np.searchsorted(events, starts), minlength=len(events))[:-1]
    fill = np.where(admitted > 0, table.prefill(np.maximum(admitted, 1)), 0.0)
    after = np.cumsum(fill + segment)               # clock when the span starting at events[k] ends
    finish = after[np.searchsorted(events, ends) - 1]
    return EngineRun(float(after[-1]), tuple(np.sort(finish).tolist()))


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


def static_generation(request: GenerationRequest, call: Call) -> EngineRun:
    """Fixed micro-batches in arrival order, each decoding to its own longest response.

    A static batch pays every decode step at its full size until its last sequence ends — the
    padding that continuous batching reclaims — but no padded prompt: the engine's kernels skip
    padding in the prefill, so it is priced at the mean prompt. A micro-batch holds at most
    `max_num_seqs` sequences, and only as many as whose whole KV cache (prompt + the micro-batch's
    longest response, reserved up front) fits.
    """
    lens, limits, prompt = [max(1, int(x)) for x in request.lengths], request.limits, request.prompt
    if not lens:
        return EngineRun(0.0, ())
    clock, finish, start = 0.0, [], 0
    while start < len(lens):
        size = min(limits.max_num_seqs, len(lens) - start)
        while size > 0 and size * (prompt + max(lens[start:start + size])) > limits.kv_tokens:
            size -= 1
        if size < 1:
            return EngineRun(math.inf, (), f"not even one {prompt + lens[start]:.0f}-token sequence's KV cache "
                                           f"fits ({limits.kv_tokens} tokens of room)")
        clock += call(size, prompt, max(lens[start:start + size]))
        finish.extend([clock] * size)
        start += size
    return EngineRun(clock, tuple(finish))


Engine = Callable[[GenerationRequest, Call], EngineRun]
ENGINES: Registry[Engine] = Registry("generation engine", "hetprof.generation_engines", check=callable,
                                     expected="a function (GenerationRequest, call) -> EngineRun")
ENGINES.register("vllm", vllm_generation)
ENGINES.register("hf", hf_generation)
ENGINES.register("static", static_generation)


def default_backend(cluster: ClusterSpec) -> str:
    """vllm on a cluster with GPUs — the engine public RL frameworks generate with, and the one
    `hetprof run` offers there — and hf on a CPU-only cluster, the only engine that runs on it."""
    return "hf" if all(cluster.catalog.lookup(d.type).vendor == "generic" for d in cluster.devices()) else "vllm"


def arrival_order(lengths: np.ndarray) -> np.ndarray:
    """Sorted lengths in a fixed shuffled order: the order requests of one step reach an engine."""
    return np.asarray(lengths)[np.random.default_rng(0).permutation(len(lengths))]
