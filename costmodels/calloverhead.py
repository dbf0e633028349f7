"""What a generation call costs beyond its prefill and decode steps, from the `task.generate` rows.

The cost model prices a generation call as its prefill plus one decode row per new token. A real call
(hetprof/runtime/generation.py) also pads the prompts, grows the attention mask every step, runs its first
steps after the prefill slower than steady ones, and runs one decode forward fewer than it samples
tokens. The profiler times whole calls of that very loop; the difference from the fitted phases,
measured per profiled (batch, prompt) shape, is this term; it can be negative (at batch 1 the
forward the call does not run outweighs the rest).

Like profiled-point corrections, a shape the profiler ran gets its own difference; any other shape
gets the median over the profiled ones. A difference is seconds, not a ratio, because it is per call:
a long response does not make it larger. Stored as plain numbers in the fitted decode entry.

Rows carry the engine that made the call (`backend`; absent: `hf`, the executor's own loop). Each
engine's calls cost differently beyond the same phases (vLLM schedules, samples and batches in its
own code), so the `hf` rows give `call_overhead` and every other engine's rows its own entry of
`engine_call_overhead`; an engine without rows is priced with the `hf` term.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

BENCHMARK = "task.generate"
DEFAULT_ENGINE = "hf"  # the engine of a row without `backend`
MAX_ENGINES = 16
MAX_POINTS = 5_000   # a shared entry may not carry an unbounded table
MAX_SECONDS = 60.0   # a per-call difference beyond a minute is not a measurement of this


@dataclasses.dataclass(frozen=True)
class CallOverhead:
    """Seconds a generation call takes beyond its phases: per profiled (batch, prompt) and elsewhere."""

    default_s: float
    points: dict[tuple[int, int], float] = dataclasses.field(default_factory=dict)

    def seconds(self, batch: int, prompt: int) -> float:
        return self.points.get((int(batch), int(prompt)), self.default_s)

    def to_json(self) -> dict[str, Any]:
        return {"default_s": self.default_s, "points": [[b, p, s] for (b, p), s in sorted(self.points.items())]}


def learn(calls: list[tuple[int, int, float, float]]) -> CallOverhead | None:
    """From (batch, prompt, measured call seconds, fitted phases' seconds) per profiled shape."""
    diffs = {(int(b), int(p)): float(m - f) for b, p, m, f in calls
             if math.isfinite(m) and math.isfinite(f) and m > 0 and f > 0 and abs(m - f) <= MAX_SECONDS}
    if not diffs:
        return None
    return CallOverhead(float(statistics.median(diffs.values())), diffs)


def load(raw: Any) -> CallOverhead | None:
    """Validate a stored `call_overhead` object (absent: None); ValueError says what is wrong."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError("call_overhead is not an object")
    default = raw.get("default_s")
    if not _seconds(default):
        raise ValueError(f"call_overhead.default_s must be a number of seconds within ±{MAX_SECONDS:g}")
    rows = raw.get("points", [])
    if not isinstance(rows, list) or len(rows) > MAX_POINTS:
        raise ValueError(f"call_overhead.points must be a list of at most {MAX_POINTS} [batch, prompt, seconds]")
    points = {}
    for row in rows:
        if (not isinstance(row, list) or len(row) != 3 or not all(_count(v) for v in row[:2])
                or not _seconds(row[2])):
            raise ValueError("call_overhead.points rows must be [batch ≥ 1, prompt ≥ 1, seconds]")
        points[(int(row[0]), int(row[1]))] = float(row[2])
    return CallOverhead(float(default), points)


def _seconds(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and abs(v) <= MAX_SECONDS


def _count(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and float(v).is_integer() and 1 <= v <= 1e9


def load_by_engine(raw: Any) -> dict[str, CallOverhead]:
    """Validate a stored `engine_call_overhead` object ({engine: call_overhead}; absent: {})."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or len(raw) > MAX_ENGINES or not all(isinstance(k, str) and k for k in raw):
        raise ValueError(f"engine_call_overhead must map at most {MAX_ENGINES} engine names to call_overhead objects")
    out = {}
    for engine, entry in raw.items():
        try:
            call = load(entry)
        except ValueError as exc:
            raise ValueError(f"engine_call_overhead.{engine}: {exc}") from None
        if call is not None:
            out[engine] = call
    return out
