"""The ledger's clock reserve, on a fake clock: a search that looks at the clock between steps ends
within its time budget, its last step and closing work included."""

from __future__ import annotations

import types

import pytest

from hetprof.planner.search.base import RESERVE_SHARE, Ledger, SearchContext


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class SlowSim:
    """Every evaluation costs `steps[i]` seconds of the fake clock (the last entry repeats)."""

    def __init__(self, clock: FakeClock, steps: list[float]) -> None:
        self.clock, self.steps, self.calls = clock, steps, 0

    def evaluate(self, candidate):
        self.clock.now += self.steps[min(self.calls, len(self.steps) - 1)]
        self.calls += 1
        return types.SimpleNamespace(feasible=True, price_per_hour=1.0, cost_per_iteration=1.0 / self.calls)

    def objective_value(self, score, objective, budget):
        return score.cost_per_iteration


def run(budget_s: float, steps: list[float], closing_s: float) -> tuple[float, int]:
    """A search loop as hetrl's: look, step, look ...; then the closing work. Returns (seconds, evaluations)."""
    clock = FakeClock()
    sim = SlowSim(clock, steps)
    ledger = Ledger(SearchContext(planning=sim, time_budget_s=budget_s), clock=clock)
    ledger.closing_s = closing_s
    while not ledger.exhausted:
        ledger.evaluate(object())
    clock.now += closing_s
    return clock.now - ledger.started, ledger.evaluations


@pytest.mark.parametrize("steps", [[0.5], [0.01], [3.0, 0.05], [0.05] * 50 + [1.0] + [0.05]])
def test_a_budget_of_t_seconds_ends_by_t(steps):
    seconds, evaluations = run(10.0, steps, closing_s=0.3)
    assert seconds <= 10.0
    assert evaluations > 1


def test_the_reserve_follows_the_steps_not_the_budget():
    # short steps: the search uses nearly all of its budget (a fixed 5 % reserve kept 3 s of 60 back)
    seconds, _ = run(60.0, [0.01], closing_s=0.0)
    assert seconds > 59.5
    # a cold first step fades: later evaluations are not held to its length
    seconds, _ = run(60.0, [5.0, 0.01], closing_s=0.0)
    assert seconds > 59.5


def test_the_reserve_is_capped_at_a_share_of_the_budget():
    clock = FakeClock()
    ledger = Ledger(SearchContext(planning=SlowSim(clock, [0.0]), time_budget_s=10.0), clock=clock)
    assert not ledger.exhausted
    clock.now += 8.0                    # one enormous step
    assert ledger.exhausted
    assert ledger.reserve_s == pytest.approx(RESERVE_SHARE * 10.0)


def test_work_bounded_by_the_deadline_is_no_step():
    clock = FakeClock()
    ledger = Ledger(SearchContext(planning=SlowSim(clock, [0.0]), time_budget_s=60.0), clock=clock)
    assert not ledger.exhausted
    clock.now += 20.0                   # a solve under its own time limit
    ledger.bounded()
    assert not ledger.exhausted
    assert ledger.reserve_s < 0.1


def test_the_milp_arms_keep_the_whole_shortlist_within_what_is_left(monkeypatch):
    import time

    from hetprof.errors import InfeasibleError
    from hetprof.planner.search import milp_arms

    seen = []

    def fake_solve(sim, grouping, ledger, limits, **kw):
        seen.append(limits)
        raise InfeasibleError("no MILP in this test")

    monkeypatch.setattr(milp_arms, "solve_restricted", fake_solve)
    ctx = SearchContext(planning=SlowSim(FakeClock(), [0.0]), time_budget_s=60.0)
    ranked = [types.SimpleNamespace(value=1.0, index=0, arm=types.SimpleNamespace(grouping=(("actor_gen",),)))]
    milp_arms.MilpArms(ctx, ("A100-40GB",)).arms(ranked, 1, time.perf_counter() + 7.0)
    (limits,) = seen
    assert limits.shortlist > 1 and limits.total_s is not None and limits.total_s <= 7.0


def test_taking_in_bounded_work_counts_as_a_step():
    clock = FakeClock()
    ledger = Ledger(SearchContext(planning=SlowSim(clock, [0.0]), time_budget_s=60.0), clock=clock)
    assert not ledger.exhausted
    clock.now += 20.0                   # workers that read the deadline ...
    returned = clock()
    clock.now += 2.0                    # ... then re-scoring their finds here, which does not
    ledger.bounded(since=returned)
    assert not ledger.exhausted
    assert ledger.reserve_s >= 2 * 2.0  # room for another such intake before the budget ends
