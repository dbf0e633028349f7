"""Generation engines: how a generator replica turns the cost model's call times into its own time.

The plan names its engine (`hetprof plan --backend`); each prices one replica's batch the way that
engine runs it:
- `vllm`: continuous batching over a paged KV cache whose blocks are taken as tokens are written
  (Kwon et al., "Efficient Memory Management for Large Language Model Serving with PagedAttention",
  SOSP 2023, §4.2; vLLM's scheduler allocates a step's slots as it schedules it). Requests are
  admitted first come, first served while a seat (`max_num_seqs`) is free and the cache has room
  for their prompt; every decode step advances each live sequence by one token at the live batch
  and its mean context; when the live sequences' next tokens no longer fit, the latest admitted is
  preempted — its blocks freed, and it goes back to the head of the queue to recompute its prompt
  and the tokens it had made when readmitted (vLLM's default recompute preemption); a finished
  sequence frees its seat and blocks at once, so the batch shrinks as short responses finish and
  refills from the queue.
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


@dataclasses.dataclass(frozen=True)
class PagedSchedule:
    """When a replica's sequences run under on-demand KV allocation: a list of spans, each `steps`
    decode steps at a constant `live` batch and mean context `context`, preceded by the prefill of
    `admitted` requests holding `prefill_tokens` tokens (prompts, and a readmitted sequence's tokens
    made before its preemption); `finish[i]` is the span at whose end sequence i is done. It depends
    on lengths and limits only, not on any cost, so one schedule serves every replica kind with it."""

    steps: np.ndarray
    live: np.ndarray
    context: np.ndarray
    admitted: np.ndarray
    prefill_tokens: np.ndarray
    finish: np.ndarray
    preemptions: int


def _next_finish(finishing: list[tuple[int, int]], live: dict[int, int], begun: list[int], lens: tuple[int, ...],
                 made: list[int]) -> int:
    """The step the next live sequence finishes at, dropping the heap's entries of runs a preemption
    ended (a sequence's current run finishes at begun + lens − made)."""
    while finishing[0][1] not in live or begun[finishing[0][1]] + lens[finishing[0][1]] - made[finishing[0][1]] \
            != finishing[0][0]:
        heapq.heappop(finishing)
    return finishing[0][0]


@functools.lru_cache(maxsize=1024)
def paged_schedule(lens: tuple[int, ...], prompt: int, seats: int, room: int) -> PagedSchedule:
    """First come, first served admission while a seat is free and `room` tokens of KV cache hold the
    live sequences' tokens and the next request's; between events (an admission, a finish, the cache
    filling) every live sequence grows by one token a step; when the next step's tokens would not
    fit, the latest admitted sequence is preempted to the head of the queue, keeping what it made."""
    n = len(lens)
    made = [0] * n                    # tokens each sequence had made when it last (re)started
    begun = [0] * n                   # the step it last (re)started at
    queue = list(range(n - 1, -1, -1))  # a stack: the head of the queue last
    finishing: list[tuple[int, int]] = []  # (finish step, i), lazily dropped once preempted
    order: list[tuple[int, int]] = []       # (-admission number, i): the latest admitted on top
    live_ids: dict[int, int] = {}           # i -> its admission number
    used = step = admissions = preemptions = 0
    spans: list[tuple[int, int, float, int, int]] = []
    finish = [0] * n
    pending_count = pending_tokens = 0
    while queue or live_ids:
        preempted = False
        while live_ids and used + len(live_ids) > room:   # the next step's tokens must fit
            while order[0][1] not in live_ids or live_ids[order[0][1]] != -order[0][0]:
                heapq.heappop(order)
            _, j = heapq.heappop(order)
            made[j] += step - begun[j]
            used -= prompt + made[j]
            del live_ids[j]
            queue.append(j)
            preemptions += 1
            preempted = True
        # a request joins while its tokens and the next step's of every live sequence, its own too, fit
        while (not preempted and queue and len(live_ids) < seats
               and used + prompt + made[queue[-1]] + len(live_ids) + 1 <= room):
            i = queue.pop()
            admissions += 1
            live_ids[i] = admissions
            heapq.heappush(order, (-admissions, i))
            heapq.heappush(finishing, (step + lens[i] - made[i], i))
            begun[i] = step
            used += prompt + made[i]
            pending_count += 1
            pending_tokens += prompt + made[i]
        if not live_ids:
            raise ValueError(f"a {prompt + max(lens)}-token sequence does not fit {room} tokens of KV cache")
        live = len(live_ids)
        span = max(1, min(_next_finish(finishing, live_ids, begun, lens, made) - step, (room - used) // live))
        spans.append((span, live, used / live + span / 2, pending_count, pending_tokens))
        pending_count = pending_tokens = 0
        step += span
        used += live * span
        while live_ids and _next_finish(finishing, live_ids, begun, lens, made) == step:
            _, i = heapq.heappop(finishing)
            used -= prompt + lens[i]
            del live_ids[i]
            finish[i] = len(spans) - 1
    cols = list(zip(*spans, strict=True))
    return PagedSchedule(np.asarray(cols[0], dtype=float), np.asarray(cols[1]), np.asarray(cols[2]),
                         np.asarray(cols[3]), np.asarray(cols[4], dtype=float), np.asarray(finish), preemptions)


def vllm_generation(request: GenerationRequest, call: Call) -> EngineRun:
    """Continuous batching of the request's sequences, in arrival order, behind mean-length prompts,
    on a KV cache allocated as tokens are written (`paged_schedule`).

    Each span between events costs its steps at its live batch and its mean context mid-span, and
    the requests admitted before it a prefill: of their prompts, and of a readmitted sequence's
    tokens too (priced as that many more prompt tokens).
    """
    prompt, limits = request.prompt, request.limits
    lens = tuple(max(1, int(x)) for x in request.lengths)
    if not lens:
        return EngineRun(0.0, ())
    room = (limits.kv_tokens // limits.block_tokens) * limits.block_tokens
    longest = math.ceil(prompt) + max(lens)
    if longest > room:
        return EngineRun(math.inf, (), f"a {longest}-token sequence needs {math.ceil(longest / limits.block_tokens)} "
                                        f"KV blocks of {limits.block_tokens} tokens; the replica has room for "
                                        f"{limits.kv_tokens // limits.block_tokens}")
    table = request.table or StepTable(call, prompt, min(limits.max_num_seqs, len(lens)), max(lens), limits.kv_tokens)
    plan = paged_schedule(lens, math.ceil(prompt), limits.max_num_seqs, room)
    admitted = np.maximum(plan.admitted, 1)
    fill = np.where(plan.admitted > 0, table.prefill(admitted) * plan.prefill_tokens
                    / (admitted * max(prompt, 1.0)), 0.0)
    after = np.cumsum(fill + plan.steps * table.decode(plan.live, plan.context))
    finish = after[plan.finish]
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
