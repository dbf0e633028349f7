"""An exact MILP (PuLP + CBC) over the restricted problem, warm-started from the heuristic.

The grouping is fixed (the heuristic's, or `ILPConfig.grouping`); the program (`ilp_model`)
chooses GPU counts per kind and group, one TP×PP per task and type-pure replicas per kind. CBC
solves it (`ilp_solve`) and the best `shortlist` solutions are scored by the simulator; `extra`
reports CBC's status, objective, bound and gap, and the time limit. After `run()`, `solutions`
holds every simulated shortlist candidate with its objective value.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from hetprof.errors import InfeasibleError
from hetprof.planner.search import get_search, register_search
from hetprof.planner.search.base import Ledger, Search, SearchConfig, SearchContext, SearchResult, knob
from hetprof.planner.search.ilp_solve import SolveLimits, solve_restricted

if TYPE_CHECKING:
    from hetprof.planner.candidate import Candidate
    from hetprof.planner.search.space import Grouping

SHORTLIST = 12


@dataclasses.dataclass(frozen=True)
class ILPConfig(SearchConfig):
    grouping: Grouping | None = knob(None, "the task grouping to solve for (default: the heuristic's)")
    shortlist: int = knob(SHORTLIST, "MILP solutions scored by the simulator (each later one cut off)", 1)
    time_limit_s: float | None = knob(None, "CBC's time limit per solve (default: the time budget)", 0.01)
    total_s: float | None = knob(None, "a hard cap on the whole search's seconds", 0.01)
    max_nodes: int | None = knob(None, "CBC's branch-and-bound node limit (same answer under any load)", 1)
    heuristic_evals: int = knob(300, "evaluations of the hetrl run that finds the grouping and warm start", 1)


@register_search("ilp")
class ILPSearch(Search):
    """MILP over counts per GPU type per group and replicas per type per layout; CBC with a time limit."""

    config_type = ILPConfig
    config: ILPConfig
    solutions: list[tuple[float, Candidate]]

    def _heuristic(self) -> tuple[Candidate, float]:
        """hetrl's plan under an evaluation budget, without its own MILP arms (no ILP inside the ILP)."""
        from hetprof.planner.search.hetrl import HetRLConfig

        ctx = self.ctx
        sub = SearchContext(planning=ctx.planning, objective=ctx.objective, budget=ctx.budget, seed=ctx.seed,
                            time_budget_s=max(1.0, ctx.time_budget_s / 3), max_tp=ctx.max_tp,
                            max_pp=ctx.max_pp, max_evals=self.config.heuristic_evals,
                            config=HetRLConfig(milp_arms=False))
        first = get_search("hetrl")(sub).run()
        return first.candidate, first.seconds

    def run(self) -> SearchResult:
        ctx, cfg = self.ctx, self.config
        self.solutions = []
        warm, heuristic_s = ctx.warm_start, 0.0
        grouping = cfg.grouping
        if grouping is None:
            if warm is None:
                warm, heuristic_s = self._heuristic()
            grouping = warm.groups
        ledger = Ledger(ctx, max_evals=None)
        limit = float(cfg.time_limit_s if cfg.time_limit_s is not None else max(1.0, ctx.time_budget_s - heuristic_s))
        limits = SolveLimits(time_limit_s=limit, shortlist=cfg.shortlist, total_s=cfg.total_s,
                             max_nodes=cfg.max_nodes)
        found = solve_restricted(ctx.planning, grouping, ledger, limits, max_tp=ctx.max_tp, max_pp=ctx.max_pp,
                                 warm=warm)
        self.solutions = found.solutions
        first = found.first
        if first is None:
            last = found.solves[-1]["status"] if found.solves else "none"
            raise InfeasibleError(f"ilp: CBC found no solution of the restricted problem within {limit:.0f} s "
                                  f"(status {last})")
        return ledger.result("ilp", grouping=[list(g) for g in found.grouping], gap=first.get("gap"),
                             optimal=first.get("optimal", False), status=first["status"],
                             bound=first.get("bound"), model_objective=first.get("model_objective"),
                             time_limit_s=limit, warm_started=found.warm_started, shortlist=found.solves,
                             heuristic_s=heuristic_s)
