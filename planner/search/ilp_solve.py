"""Solving the restricted MILP: CBC under a time or node limit, and a shortlist of solutions.

The MILP is a model of the simulator, not the simulator, so the best `shortlist` solutions (each
later one excluded by a no-good cut) are built and scored by the simulator; the best by that score
wins. `solve_restricted` is the one entry point: the `ilp` search and hetrl's MILP arms both call it.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetprof.planner.search.cbc import cbc
from hetprof.planner.search.ilp_decode import decode, exclude, warm_start
from hetprof.planner.search.ilp_model import ReplicaRates, build_model
from hetprof.planner.search.restricted import RestrictedSpace

if TYPE_CHECKING:
    from hetprof.planner.candidate import Candidate
    from hetprof.planner.search.base import Ledger
    from hetprof.planner.search.space import Grouping


@dataclasses.dataclass(frozen=True)
class SolveLimits:
    """How long CBC may work: per solve (`time_limit_s`), in all (`total_s`), and in branch-and-bound
    nodes (`max_nodes`: unlike a time limit it gives the same answer under any machine load)."""

    time_limit_s: float
    shortlist: int = 12
    total_s: float | None = None
    max_nodes: int | None = None


@dataclasses.dataclass
class RestrictedSolution:
    """What one `solve_restricted` call found: simulated shortlist candidates and CBC's account."""

    grouping: Grouping
    solutions: list[tuple[float, Candidate]]      # (objective value, candidate), in solve order
    solves: list[dict[str, Any]]                  # per solve: status, objective, bound, gap, counts
    warm_started: bool

    @property
    def first(self) -> dict[str, Any] | None:
        """The first solve that produced a solution (the MILP's own optimum, with its gap)."""
        return next((s for s in self.solves if "simulated" in s), None)


def cbc_summary(log: str) -> dict:
    """Status, objective, bound and gap from CBC's log (PuLP does not expose the bound)."""
    out: dict = {"optimal": "Optimal solution found" in log}
    for key, pattern in (("objective", r"Objective value:\s*([-0-9.eE+]+)"),
                         ("bound", r"Lower bound:\s*([-0-9.eE+]+)"),
                         ("gap", r"Gap:\s*([-0-9.eE+]+)")):
        m = re.search(pattern, log)
        if m:
            out[key] = float(m.group(1))
    if out["optimal"] and "gap" not in out:
        out["gap"] = 0.0
    return out


def _solve_once(prob: Any, limit: float, warm: bool, max_nodes: int | None) -> dict[str, Any]:
    import pulp

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "cbc.log"
        solver = cbc(msg=False, timeLimit=limit, warmStart=warm, logPath=str(log),
                     maxNodes=int(max_nodes) if max_nodes is not None else None)
        status = prob.solve(solver)
        text = log.read_text() if log.exists() else ""
    info = cbc_summary(text)
    info["status"] = pulp.LpStatus[status]
    info["model_objective"] = pulp.value(prob.objective)
    info["solved"] = status == pulp.LpStatusOptimal and prob.sol_status in (pulp.LpSolutionOptimal,
                                                                             pulp.LpSolutionIntegerFeasible)
    return info


def solve_restricted(planning: Any, grouping: Grouping, ledger: Ledger, limits: SolveLimits, *, max_tp: int,
                     max_pp: int, rates: ReplicaRates | None = None,
                     warm: Candidate | None = None) -> RestrictedSolution:
    """Solve the MILP of `grouping` up to `limits.shortlist` times; score each solution on `ledger`.

    The time limits count from the ledger's start, so a caller that built the ledger for this call
    gets `total_s` as a cap on the whole of it, the model's construction included.
    """
    space = RestrictedSpace(planning, tuple(tuple(g) for g in grouping), max_tp, max_pp)
    model = build_model(space, rates if rates is not None else ReplicaRates())
    warmed = warm_start(model, warm) if warm is not None else False
    out = RestrictedSolution(space.grouping, [], [], warmed)
    cap = limits.time_limit_s if limits.total_s is None else float(limits.total_s)
    for i in range(limits.shortlist):
        limit = limits.time_limit_s
        if limits.total_s is not None:
            limit = min(limit, float(limits.total_s) - ledger.elapsed)
            if limit < 0.2 and i > 0:
                break
            limit = max(0.2, limit)
        info = _solve_once(model.prob, limit, warmed and i == 0, limits.max_nodes)
        choice = decode(model) if info.pop("solved") else None
        if choice is None:
            out.solves.append(info)
            break
        counts, chosen = choice
        cand = space.candidate(counts, chosen)
        value = ledger.evaluate(cand)[0] if cand is not None else math.inf
        if cand is not None:
            out.solutions.append((value, cand))
        info.update(counts={f"group{g}": dict(zip(space.types, c, strict=True)) for g, c in enumerate(counts)},
                    shapes={k: f"TP{c[0]}×PP{c[1]}" for k, c in chosen.items()}, simulated=value)
        out.solves.append(info)
        exclude(model)
        if ledger.elapsed > cap:
            break
    return out
