"""Synchronous successive halving over arms: every live arm gets the same evaluations per rung,
the best 1/ETA survive, survivors get ETA times more.

Optuna's own SuccessiveHalvingPruner is the *asynchronous* variant (promotion depends on arrival
order), so the cut is ranked here and only recorded through Optuna: rungs as intermediate
values, cut arms PRUNED, finalists COMPLETE.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hetprof.planner.search.arms import ETA
from hetprof.planner.search.evolution import ArmEvolution, rank_arms
from hetprof.planner.search.study import close_trial

if TYPE_CHECKING:
    from hetprof.planner.search.base import Ledger
    from hetprof.planner.search.parallel import EvaluationPool
    from hetprof.planner.search.study import ArmStudy


def rungs_for(arms: int) -> int:
    return max(1, math.ceil(math.log(max(1, arms), ETA))) + 1


class Halving:
    """Runs brackets of successive halving on one ledger, pool and study.

    `timed` (no evaluation budget): rung sizes follow the measured evaluation rate so the rungs fit
    the time left; `until` (perf_counter) ends the current bracket before the ledger's deadline.
    """

    def __init__(self, ledger: Ledger, pool: EvaluationPool, study: ArmStudy, timed: bool) -> None:
        self.ledger = ledger
        self.pool = pool
        self.study = study
        self.timed = timed
        self.until: float | None = None

    def deadline(self) -> float:
        """When the current bracket must stop: its own end, or the ledger's deadline."""
        return self.ledger.deadline if self.until is None else min(self.until, self.ledger.deadline)

    def over(self) -> bool:
        return self.ledger.exhausted or (self.until is not None and time.perf_counter() >= self.until)

    def advance(self, states: list[ArmEvolution], n: int) -> None:
        self.pool.advance(states, n, self.deadline(), self.over)

    def bracket(self, states: list[ArmEvolution], trials: Sequence[Any], budget: int,
                final: bool = True) -> ArmEvolution:
        """One bracket of synchronous successive halving over `states`; returns the surviving arm."""
        import optuna

        ledger = self.ledger
        alive = list(states)
        # clock-paced with many arms, the first rung looks once per arm (its locality-ordered seed)
        per_arm = max(1 if self.timed else 2, budget // max(1, len(alive) * rungs_for(len(alive))))
        start, started = ledger.evaluations, time.perf_counter()
        trial_of = {id(s): t for s, t in zip(states, trials, strict=True)}
        rung = 0
        while True:
            self.advance(alive, per_arm)
            for s in alive:
                t = trial_of[id(s)]
                if t is not None:
                    t.report(s.value if math.isfinite(s.value) else 1e300, step=rung)
            if len(alive) == 1 or self.over():
                break
            kept = rank_arms(alive, max(1, math.ceil(len(alive) / ETA)))
            for s in alive:
                if s not in kept:
                    close_trial(self.study.study, trial_of[id(s)], s, optuna.trial.TrialState.PRUNED)
            alive = kept
            per_arm *= ETA
            if not final and not self.timed:
                # an earlier bracket keeps to its share, so later brackets (MILP arms) still run
                per_arm = min(per_arm, max(1, (budget - (ledger.evaluations - start)) // len(alive)))
            if self.timed:
                per_arm = self._paced(alive, start, started)
            rung += 1
        left = budget - (ledger.evaluations - start)
        if self.timed:
            # the clock stops the last bracket (or one with its own end); an earlier one leaves
            # half the time to the next
            rate = (ledger.evaluations - start) / max(1e-6, time.perf_counter() - started)
            left = 1 << 30 if final or self.until is not None else \
                int(rate * max(0.0, ledger.deadline - time.perf_counter()) / 2)
        if left > 0 and not self.over():
            self.advance(alive[:1], left)
        ranked = rank_arms(alive, len(alive))
        for s in ranked:
            close_trial(self.study.study, trial_of[id(s)], s, optuna.trial.TrialState.COMPLETE)
        return ranked[0]

    def _paced(self, alive: list[ArmEvolution], start: int, started: float) -> int:
        """Evaluations per arm for the next rung so the remaining rungs fit the time left."""
        ledger = self.ledger
        rate = (ledger.evaluations - start) / max(1e-6, time.perf_counter() - started)
        left = max(0.0, self.deadline() - time.perf_counter())
        return max(2, int(rate * left / (len(alive) * rungs_for(len(alive)))))
