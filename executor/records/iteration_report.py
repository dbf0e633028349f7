"""What one rank measured in one iteration: a typed report, sent to the leader as JSON.

Each rank fills one `IterationReport` as its loop step runs and hands it to the leader, whose
record thread turns every rank's report into the iteration's run record (run_record.py). The
timings of single pieces of work (`work_timings`) are shaped like the profiler's task rows
(kind, batch, tokens, seconds), so `hetprof fit` can learn from real runs (costmodels/runrows.py).
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any


@dataclasses.dataclass
class RankInfo:
    """Where a rank's timings were taken: fixed for the run."""

    device_type: str | None
    threads: int
    dtypes: dict[str, str]  # per task on this rank: the compute dtype ("fp32", "bf16")


@dataclasses.dataclass
class BatchStats:
    """The leader's view of the batch it assembled and scored."""

    tokens: int
    prompt_tokens_mean: float
    response_tokens_mean: float
    staleness_max: int
    staleness_mean: float
    reward_mean: float = 0.0
    reward_std: float = 0.0
    samples: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # a few (prompt, response) pairs
    sequences: int = 0  # rows of the batch (prompts × responses per prompt)


@dataclasses.dataclass
class SyncStats:
    bytes: int
    seconds: float


@dataclasses.dataclass
class IterationReport:
    """One rank's iteration. `task_seconds` holds each task's compute time on this rank, plus the
    leader's reward / advantage / wait_rollouts and each sync edge's transfer; `laps` the wall time
    of each step of the loop, waits included (where the iteration went beyond the tasks' compute)."""

    rank: int
    device: str
    pid: int
    rank_info: RankInfo
    task_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    laps: dict[str, float] = dataclasses.field(default_factory=dict)
    work_timings: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    train_stats: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    sync: dict[str, SyncStats] = dataclasses.field(default_factory=dict)
    digests: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    gen_version: int | None = None
    backend_checks: dict[str, float] = dataclasses.field(default_factory=dict)  # the engine's after a sync
    checkpoint_saved: bool = False
    batch: BatchStats | None = None
    validation: dict[str, float] = dataclasses.field(default_factory=dict)  # the leader's, when evaluated
    spans: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # task: [start, end] wall-clock s
    _clock: float = dataclasses.field(default_factory=lambda: time.time() - time.perf_counter(), repr=False)

    def timed(self, task: str, start: float, end: float | None = None) -> float:
        """Record that `task` ran from perf_counter `start` to `end` (now): its seconds and its span
        on the wall clock, which the ranks of one host share (the measured Gantt lines them up)."""
        end = time.perf_counter() if end is None else end
        self.task_seconds[task] = end - start
        self.spans[task] = [self.wall(start), self.wall(end)]
        return end - start

    def wall(self, perf: float) -> float:
        """A perf_counter reading on the wall clock."""
        return self._clock + perf

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), default=_plain).encode()

    @classmethod
    def from_json(cls, data: bytes) -> IterationReport:
        raw = json.loads(data)
        raw["rank_info"] = RankInfo(**raw["rank_info"])
        raw["sync"] = {edge: SyncStats(**s) for edge, s in raw["sync"].items()}
        raw["batch"] = BatchStats(**raw["batch"]) if raw["batch"] is not None else None
        return cls(**raw)


class Laps:
    """Wall time between successive calls, by name, added to a report's `laps`."""

    def __init__(self, into: dict[str, float]) -> None:
        self.seconds = into
        self._mark = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._mark
        self._mark = now


def prefill_timing(rows: int, width: int, seconds: float) -> dict[str, Any]:
    """An inference task's forward over its slice, as the profiler's prefill row (with the head)."""
    return {"kind": "prefill", "batch": int(rows), "tokens": int(width), "seconds": seconds, "with_head": True}


def train_timing(rows: int, width: int, seconds: float, ppo_epochs: int, mini_batches: int, packs: float = 1.0,
                 optimizer_seconds: float = 0.0) -> dict[str, Any]:
    """A training task's time as the profiler's `task.train` row: one pass over a mini-batch's
    pack (`packs` of them make the mini-batch) with one optimizer step.

    The learner takes ppo_epochs × mini_batches steps over this replica's slice, so the per-step
    time is the task's time over that count (a recompute of proximal log-probs in async runs is
    folded in: it is part of what each step costs there). A packed step holds `packs` packs' passes
    but one optimizer step (`optimizer_seconds` is all steps', measured), which is what a profiled
    row holds for one pack; `packs` stays on the record, as the data-parallel all-reduce, once per
    step, is shared by the packs too.
    """
    steps = max(1, ppo_epochs * mini_batches)
    packs = max(1.0, float(packs))
    step_s = max(0.0, min(optimizer_seconds, seconds)) / steps
    one = (seconds / steps - step_s) / packs + step_s
    return {"kind": "train", "batch": -(-int(rows) // max(1, mini_batches)), "tokens": int(width),
            "seconds": one, "with_head": True, "steps": steps, "packs": packs}


def _plain(value: Any) -> Any:
    """JSON for the numbers a report may carry as tensors or numpy scalars."""
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"a run report cannot carry {type(value).__name__}")


def sample_texts(batch: dict[str, Any], prompts: list[Any], tokenizer: Any, count: int = 4) -> list[dict[str, Any]]:
    """The first response to each of the batch's first `count` prompts, as text with its reward:
    what a reader of the run's log or TensorBoard checks the policy against."""
    out: list[dict[str, Any]] = []
    seen: set[int] = set()
    for row, idx in enumerate(batch["prompt_index"].tolist()):
        if idx in seen or len(out) == count:
            continue
        seen.add(idx)
        ids = batch["input_ids"][row][batch["response_mask"][row].bool()].tolist()
        out.append({"prompt": prompts[idx].text, "answer": prompts[idx].answer,
                    "response": tokenizer.decode(ids), "reward": float(batch["rewards"][row])})
    return out
