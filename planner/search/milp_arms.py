"""hetrl's arms from the restricted MILP: counts per GPU type *and region* that structured and
TPE arms rarely name (a whole region's A100s and L40S for training, everything else for inference).

For the best-ranked groupings found so far, `solve_restricted` (the `ilp` search's own solver)
is asked for a shortlist; each solution becomes an arm (its GPU counts per type) whose population
starts from that solution. With an evaluation budget CBC runs under a node limit, so the search
stays deterministic; the search's deadline only cuts a solve that would outlast the search.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hetprof.errors import InfeasibleError
from hetprof.planner.search.arms import Arm
from hetprof.planner.search.base import Ledger
from hetprof.planner.search.ilp_model import ReplicaRates
from hetprof.planner.search.ilp_solve import SolveLimits, solve_restricted
from hetprof.planner.search.space import Grouping, counts_of, grouping_label

if TYPE_CHECKING:
    from hetprof.planner.candidate import Candidate
    from hetprof.planner.search.base import SearchContext
    from hetprof.planner.search.evolution import ArmEvolution

SHORTLIST = 2       # MILP solutions per grouping that become arms (its one solve is the costliest step of a search)
NODES = 3000        # CBC node limit with an evaluation budget (deterministic)


@dataclasses.dataclass
class MilpArms:
    """The MILP solves of one hetrl run: groupings tried, replica rates shared, and an account."""

    ctx: SearchContext
    types: Sequence[str]
    tried: set[Grouping] = dataclasses.field(default_factory=set)
    rates: ReplicaRates = dataclasses.field(default_factory=ReplicaRates)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def _groupings(self, ranked: Sequence[ArmEvolution], count: int) -> list[Grouping]:
        """The `count` best-ranked groupings that no earlier call solved."""
        out: list[Grouping] = []
        for st in sorted(ranked, key=lambda s: (s.value, s.index)):
            if not math.isfinite(st.value) or len(out) >= count:
                break
            if st.arm.grouping not in out and st.arm.grouping not in self.tried:
                out.append(st.arm.grouping)
        return out

    def arms(self, ranked: Sequence[ArmEvolution], count: int, deadline: float) -> list[tuple[Arm, list[Candidate]]]:
        """Arms seeded from the MILP, solved for the `count` best groupings in `ranked` not tried yet.

        CBC's node limit bounds each solve, so the answer does not depend on machine load; the
        search's `deadline` (perf_counter) only cuts a solve that would outlast the whole search.
        """
        ctx, planning = self.ctx, self.ctx.planning
        groupings = self._groupings(ranked, count)
        out: dict[Arm, list[Candidate]] = {}
        started = time.perf_counter()
        solved: list[str] = list(self.info.get("groupings", []))
        for grouping in groupings:
            left = deadline - time.perf_counter()
            if left < 0.5:
                break
            # the whole call within what is left, not each solve of its shortlist
            limits = SolveLimits(time_limit_s=min(600.0, left), shortlist=SHORTLIST, total_s=left, max_nodes=NODES)
            self.tried.add(grouping)
            # its own ledger, started here: `total_s` then caps this solve as a whole. No warm start:
            # the heuristic's candidate is rarely type-pure, CBC then rejects it or keeps a poor
            # incumbent and found worse solutions in the same time (measured)
            ledger = Ledger(dataclasses.replace(ctx, warm_start=None, max_evals=None, storage=None, config=None))
            try:
                found = solve_restricted(planning, grouping, ledger, limits, max_tp=ctx.max_tp, max_pp=ctx.max_pp,
                                         rates=self.rates)
            except InfeasibleError:
                continue
            if found.first is None:
                continue
            solved.append(grouping_label(grouping))
            for _value, cand in sorted(found.solutions, key=lambda vc: vc[0]):
                counts = tuple(counts_of(planning, devs, self.types) for devs in cand.group_devices)
                out.setdefault(Arm(grouping, counts, tuple(self.types)), []).append(cand)
        self.info.update(groupings=solved, arms=self.info.get("arms", 0) + len(out),
                         seconds=round(self.info.get("seconds", 0.0) + time.perf_counter() - started, 3))
        return list(out.items())
