"""Synchronous successive halving over arms: every live arm gets the same evaluations per rung,
the best 1/ETA survive, survivors get ETA times more.

Optuna's own SuccessiveHalvingPruner is the *asynchronous* variant (promotion depends on arrival
order), so the cut is ranked here and only recorded through Optuna: rungs as intermediate
values, cut arms PRUNED, finalists COMPLETE.
"""

from __future__ import annotations

import math
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

    Rung sizes follow from a bracket's evaluation budget alone, never from the clock: under load
    a bracket does the same work in the same order, only slower, and the ledger's deadline merely
    cuts the sequence short.
    """

    def __init__(self, ledger: Ledger, pool: EvaluationPool, study: ArmStudy) -> None:
        self.ledger = ledger
        self.pool = pool
        self.study = study

    def over(self) -> bool:
        return self.ledger.exhausted

    def advance(self, states: list[ArmEvolution], n: int) -> None:
        self.pool.advance(states, n, self.ledger.deadline, self.over)

    def bracket(self, states: list[ArmEvolution], trials: Sequence[Any], budget: int,
                final: bool = True) -> ArmEvolution:
        """One bracket of synchronous successive halving over `states`; returns the surviving arm."""
        import optuna

        ledger = self.ledger
        alive = list(states)
        per_arm = max(2, budget // max(1, len(alive) * rungs_for(len(alive))))
        start = ledger.evaluations
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
            if not final:
                # an earlier bracket keeps to its share, so later brackets (MILP arms) still run
                per_arm = min(per_arm, max(1, (budget - (ledger.evaluations - start)) // len(alive)))
            rung += 1
        left = budget - (ledger.evaluations - start)
        if left > 0 and not self.over():
            self.advance(alive[:1], left)
        ranked = rank_arms(alive, len(alive))
        for s in ranked:
            close_trial(self.study.study, trial_of[id(s)], s, optuna.trial.TrialState.COMPLETE)
        return ranked[0]
