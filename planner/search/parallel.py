"""Arms advanced in worker processes: each arm's evolution runs whole in one worker.

An arm's state is plain data with its own seeded generator, so advancing it in a worker gives the
same result as in the parent; the parent then adds the workers' evaluations to its ledger and
offers each arm's best find. Workers are forked so they inherit the simulator (and its caches)
instead of receiving a copy per task.

A worker's caches grow apart from the parent's after the fork: layouts one worker balances, the
other and the parent balance again, and the parent re-scores each arm's best find. Two workers
therefore spend more CPU in all than one process, and are faster only where a second core is
idle; on a machine already busier than its cores they are slower, with the same plan.
"""

from __future__ import annotations

import concurrent.futures
import math
import multiprocessing
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hetprof.planner.search.base import TIE
from hetprof.planner.search.space import Assembler, decode_candidate, encode_candidate

if TYPE_CHECKING:
    from hetprof.planner.candidate import Candidate
    from hetprof.planner.planning import PlanningContext
    from hetprof.planner.search.base import Ledger
    from hetprof.planner.search.evolution import ArmEvolution

# A forked worker's simulator and assembler: set once per process by the pool initializer and only
# ever read by that process's own tasks.
_WORKER: dict[str, Any] = {}


def _init_worker(planning: PlanningContext, objective: str, budget: float | None, max_tp: int, max_pp: int) -> None:
    _WORKER.update(planning=planning, objective=objective, budget=budget, assembler=Assembler(planning, max_tp, max_pp))


def _advance_in_worker(state: ArmEvolution, n: int, deadline_wall: float) -> tuple[ArmEvolution, list]:
    planning = _WORKER["planning"]
    state.assembler = _WORKER["assembler"]
    found: list[tuple[float, str]] = []

    best: list[tuple[float, float]] = []     # (value, $/iteration) of the best so far

    def evaluate(cand: Candidate) -> float:
        score = planning.evaluate(cand)
        value = float(planning.objective_value(score, _WORKER["objective"], _WORKER["budget"])) if score.feasible \
            else math.inf
        # the ledger's rule: lower value, or within TIE and cheaper
        if not best or value < best[-1][0] * (1 - TIE) or (
                value <= best[-1][0] * (1 + TIE) and score.cost_per_iteration < best[-1][1] * (1 - TIE)):
            best.append((value, score.cost_per_iteration))
            found.append((value, encode_candidate(cand)))
        return value

    state.advance(n, evaluate, lambda: time.time() >= deadline_wall)
    state.assembler = None
    return state, found[-1:]


class EvaluationPool:
    """Advances arms `n` evaluations each, in `workers` processes (1: in this process)."""

    def __init__(self, ledger: Ledger, workers: int, max_tp: int, max_pp: int) -> None:
        ctx = ledger.ctx
        self.ledger = ledger
        self.pool = None
        if workers > 1:
            self.pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=workers, mp_context=multiprocessing.get_context("fork"),
                initializer=_init_worker, initargs=(ctx.planning, ctx.objective, ctx.budget, max_tp, max_pp))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()

    def advance(self, states: list[ArmEvolution], n: int, deadline: float, over: Callable[[], bool]) -> None:
        """Spend up to n evaluations on each arm; `deadline` (perf_counter) and `over` stop early."""
        ledger = self.ledger

        def evaluate(cand: Candidate) -> float:
            if ledger.max_evals is not None and ledger.evaluations >= ledger.max_evals:
                return math.inf
            return ledger.evaluate(cand)[0]

        # the rung that reaches the evaluation budget runs here, arm by arm, so exactly the
        # evaluations a one-process run would make are made (a worker cannot see the others' count)
        short = ledger.max_evals is not None and ledger.max_evals - ledger.evaluations < n * len(states)
        if self.pool is None or len(states) < 2 or short:
            for s in states:
                if over():
                    break
                s.advance(n, evaluate, over)
            return
        deadline_wall = time.time() + max(0.0, deadline - time.perf_counter())
        assembler = states[0].assembler
        for s in states:
            s.assembler = None
        futures = [self.pool.submit(_advance_in_worker, s, n, deadline_wall) for s in states]
        concurrent.futures.wait(futures)
        returned = ledger.clock()       # the workers read the deadline; what follows here does not
        for i, fut in enumerate(futures):
            new_state, found = fut.result()
            new_state.assembler = assembler
            ledger.evaluations += new_state.evaluations - states[i].evaluations
            states[i].__dict__.update(new_state.__dict__)
            for value, text in found:
                cand = decode_candidate(text)
                ledger.offer(cand, ledger.ctx.planning.evaluate(cand), value)
            ledger.tell()
        ledger.bounded(since=returned)
