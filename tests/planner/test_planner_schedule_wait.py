"""The async schedule's wait for samples, against hand-computed steady states.

Generation on one group and training on another, staleness k: generation of step i may start once
training of step i-1-k has ended and its weights have synced. Over k+1 steps the cycle gen -> train ->
sync -> gen must fit, so the steady step is max(G, T, (G + T + W) / (k + 1)); k = 0 is the sync
pipeline G + T + W. When generation is the slower side, the trainer waits G - T a step for samples
(what verl's fully async trainer logs as its gen time, beside its update).
"""

from __future__ import annotations

import pytest

from hetprof.planner.graph import Edge
from hetprof.planner.schedule import ScheduleInput, simulate

ROLLOUTS = Edge("gen", "train", "rollouts")
WEIGHTS = Edge("train", "gen", "weights", model="actor")


def step_seconds(gen_s: float, train_s: float, sync_s: float, staleness: int) -> float:
    """The steady step of a two-group pipeline, played for enough steps to settle."""
    return simulate(ScheduleInput(
        tasks=("gen", "train"), group_of={"gen": 0, "train": 1},
        curve={"gen": (gen_s,), "train": (train_s,)}, swap={},
        forward=((ROLLOUTS, 0.0),), weights=((WEIGHTS, sync_s),), staleness=staleness, streaming=False,
        iterations=12, group_devices={0: ("g0",), 1: ("g1",)},
        task_devices={"gen": ("g0",), "train": ("g1",)})).iteration_s


@pytest.mark.parametrize(("gen_s", "train_s", "sync_s", "staleness", "expected"), [
    (100.0, 60.0, 0.0, 1, 100.0),    # generation slower: the trainer waits 40 s a step
    (100.0, 60.0, 50.0, 1, 105.0),   # the cycle 100 + 60 + 50 over two steps binds
    (40.0, 60.0, 0.0, 1, 60.0),      # training slower: no wait, the trainer sets the pace
    (40.0, 60.0, 10.0, 0, 110.0),    # synchronous: every step pays generation, training and sync
    (100.0, 60.0, 50.0, 2, 100.0),   # one more step of staleness hides the sync again
])
def test_async_step_is_the_slower_side_or_the_cycle(gen_s, train_s, sync_s, staleness, expected):
    assert step_seconds(gen_s, train_s, sync_s, staleness) == pytest.approx(expected)
