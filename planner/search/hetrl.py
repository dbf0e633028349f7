"""HetRL's multi-level search (arXiv 2512.12476): successive halving over arms, evolution inside.

Levels 1-2 (task grouping; GPUs of each kind per group) are *arms* (`arms`); the search budget is
allocated among them by synchronous successive halving (`halving`): every live arm gets the same
number of evaluations, the best 1/η survive, survivors get η times more. Inside an arm, levels
3-5 are filled by an evolutionary search (`evolution`), in worker processes when asked
(`parallel`). Optuna records the arm level (`study`): with `--storage sqlite:///x.db` a later run
resumes, its TPE sampler proposes arms from everything recorded, and optuna-dashboard shows it.

Small problems enumerate every arm; larger ones start from structured arms (whole GPU kinds per
group, even splits, region-aligned splits) and add TPE-proposed arms in further brackets while
budget remains. On larger problems the arm level also asks the restricted MILP (`milp_arms`):
after the first bracket has ranked the groupings, it is solved for the best few, and each of its
shortlisted solutions enters the next bracket as an arm seeded with that solution; evolution then
refines those arms beyond the restricted space. If the arm surviving the second bracket has a
grouping no solve covered, the MILP is solved for it too and its arms join a last, short bracket.

Time: a clock-paced search stops its evolution at the ledger's deadline, which keeps back a
margin for wrapping up (closing the study's trials, building the result), so the whole run ends
within `time_budget_s`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from hetprof.planner.search import register_search
from hetprof.planner.search.arms import (
    Arm,
    affordable_arms,
    arm_count,
    enumerate_arms,
    region_cuts,
    structured_arms,
)
from hetprof.planner.search.base import Ledger, Search, SearchConfig, SearchResult, knob
from hetprof.planner.search.evolution import ArmEvolution, genome_from_candidate
from hetprof.planner.search.halving import Halving
from hetprof.planner.search.milp_arms import MilpArms
from hetprof.planner.search.parallel import EvaluationPool
from hetprof.planner.search.space import (
    Assembler,
    all_groupings,
    devices_by_type,
    gpu_types,
    problem_key,
)
from hetprof.planner.search.study import ArmStudy, PendingTrial, arm_distributions, arm_from_trial

if TYPE_CHECKING:
    from hetprof.planner.candidate import Candidate

ENUMERATE_LIMIT = 1500      # arms: below this every (grouping, counts) arm is tried
BRACKET_ARMS = 27           # TPE-proposed arms per extra bracket
EVALS_PER_ARM = 24          # default evaluation budget per initial arm
MILP_AT = 0.40              # clock-paced: the first bracket ends at this share of the budget ...
MILP_UNTIL = 0.65           # ... and the MILP seeding must be done by this share
MILP_GROUPINGS = 2          # best-ranked groupings the MILP is solved for
MILP_LAST_AT = 0.82         # clock-paced: the second bracket ends here; if its best grouping had no
MILP_LAST_UNTIL = 0.90      # MILP solve yet, one is done by this share, and a last bracket follows
ASK_SHARE = 0.04            # clock-paced: most of the budget spent asking TPE for arms per bracket


@dataclasses.dataclass(frozen=True)
class HetRLConfig(SearchConfig):
    enumerate_limit: int = knob(ENUMERATE_LIMIT, "enumerate every arm when there are at most this many", 0)
    milp_arms: bool = knob(True, "seed arms from the restricted MILP on problems too large to enumerate")


@dataclasses.dataclass
class _Problem:
    """What every bracket of one run reads: the arm space and the devices by GPU type."""

    types: tuple[str, ...]
    by_type: dict[str, tuple[str, ...]]
    totals: list[int]
    groupings: list
    exact: bool

    @property
    def all_devices(self) -> list[str]:
        return [d for t in sorted(self.by_type) for d in self.by_type[t]]


@register_search("hetrl")
class HetRLSearch(Search):
    """Successive halving over (grouping, GPU counts) arms; evolution over placements inside each."""

    config_type = HetRLConfig
    config: HetRLConfig

    def _problem(self) -> tuple[_Problem, list[Arm], list[Arm]]:
        sim = self.ctx.sim
        types, by_type = gpu_types(sim), devices_by_type(sim)
        totals = [len(by_type[t]) for t in types]
        groupings = all_groupings(sim)
        exact = arm_count(groupings, totals) <= self.config.enumerate_limit
        structured = structured_arms(groupings, types, totals, region_cuts(sim, by_type, types))
        arms = enumerate_arms(groupings, types, totals) if exact else structured
        return _Problem(types, by_type, totals, groupings, exact), arms, structured

    def run(self) -> SearchResult:
        ctx = self.ctx
        ledger = Ledger(ctx)
        problem, arms, structured = self._problem()
        # With an evaluation budget the search is deterministic; without one it is paced by the
        # clock (rungs sized from the measured evaluation rate) and uses the whole time budget.
        total_evals = ctx.max_evals or max(400, EVALS_PER_ARM * len(arms))
        arms = affordable_arms(arms, structured, total_evals, ctx.seed)
        name = ctx.study_name or f"hetrl-{problem_key(ctx.sim, ctx.objective, ctx.budget)}-seed{ctx.seed}"
        study = ArmStudy(name, ctx.seed, ctx.storage)
        self._resumed = study.resumed()
        self._assembler = Assembler(ctx.sim, ctx.max_tp, ctx.max_pp)
        self._seeds: dict[Arm, list[Candidate]] = {}
        self._milp = MilpArms(ctx, problem.types)
        pool = EvaluationPool(ledger, ctx.workers, ctx.max_tp, ctx.max_pp)
        halving = Halving(ledger, pool, study, timed=ctx.max_evals is None)
        try:
            brackets, best_arm = self._brackets(problem, arms, total_evals, halving)
        finally:
            pool.close()
        if ledger.max_evals and ledger.evaluations >= ledger.max_evals:
            stopped_by = "evaluations"
        elif time.perf_counter() >= ledger.deadline:
            stopped_by = "time"
        else:
            stopped_by = "search space exhausted"
        return ledger.result("hetrl", arms=len(arms), arms_enumerated=problem.exact, brackets=brackets,
                             best_arm=best_arm.arm.label if best_arm else None, study=name,
                             storage=ctx.storage, stopped_by=stopped_by,
                             resumed_candidates=len(self._resumed), milp=self._milp.info or None)

    def _brackets(self, problem: _Problem, arms: list[Arm], total_evals: int,
                  halving: Halving) -> tuple[int, ArmEvolution | None]:
        """Brackets of halving until a budget runs out: the initial arms, then MILP and TPE arms."""
        ledger, study = halving.ledger, halving.study
        use_milp = not problem.exact and self.config.milp_arms
        span = ledger.deadline - ledger.started
        distributions = arm_distributions(problem.groupings, problem.types, problem.totals)
        brackets, next_index = 0, 0
        best_arm: ArmEvolution | None = None
        carry: ArmEvolution | None = None
        items: list[tuple[Any, Arm | None]] = [(None, arm) for arm in arms]
        ranked_states: list[ArmEvolution] = []
        while not ledger.exhausted:
            brackets += 1
            trials, states, next_index = self._open(items, problem, ledger, study, next_index)
            if carry is not None:
                states.append(carry)
                trials.append(None)
            remaining = (ledger.max_evals or total_evals) - ledger.evaluations
            budget = remaining if problem.exact else max(len(states), remaining // (1 if brackets >= 3 else 2))
            final = problem.exact or brackets >= 3
            if halving.timed and use_milp:
                # clock-paced with MILP seeding: bracket 1 until MILP_AT, bracket 2 until
                # MILP_LAST_AT, then a final bracket (the last grouping's MILP arms and the survivor)
                halving.until = ledger.started + (MILP_AT if brackets == 1 else MILP_LAST_AT) * span \
                    if brackets <= 2 else None
            survivor = halving.bracket(states, trials, budget, final=final)
            halving.until = None
            ranked_states.extend(states)
            study.record(trials, distributions)
            best_arm = survivor if best_arm is None or survivor.value <= best_arm.value else best_arm
            carry = survivor
            if problem.exact or ledger.exhausted or final:
                break
            items = []
            if use_milp and brackets <= 2:
                items += self._milp_items(brackets, ranked_states, carry, ledger, problem, halving.timed, span)
                if halving.timed and brackets == 2:
                    continue            # the last, short bracket: no TPE asks
            items += self._tpe_items(study, problem, halving.timed, span)
        return brackets, best_arm

    def _open(self, items: list[tuple[Any, Arm | None]], problem: _Problem, ledger: Ledger, study: ArmStudy,
              next_index: int) -> tuple[list, list[ArmEvolution], int]:
        """A bracket's arms as evolution states (warmed from stored and MILP candidates) and trials."""
        import optuna

        trials, states = [], []
        for trial, arm in items:
            if arm is None:
                study.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            if trial is None:
                trial = PendingTrial(arm)
            state = ArmEvolution(arm, next_index, self.ctx.seed, self._assembler, problem.by_type)
            next_index += 1
            self._warm(state, ledger, problem)
            trial.set_user_attr("arm", arm.label)
            trials.append(trial)
            states.append(state)
        return trials, states, next_index

    def _milp_items(self, brackets: int, ranked_states: list[ArmEvolution], carry: ArmEvolution, ledger: Ledger,
                    problem: _Problem, timed: bool, span: float) -> list[tuple[Any, Arm]]:
        """After bracket 1 the best-ranked groupings' MILP arms; after bracket 2 the survivor's
        grouping's, when it is none of those (the arms that won may come from TPE)."""
        share = MILP_UNTIL if brackets == 1 else MILP_LAST_UNTIL
        until = ledger.started + share * span if timed else None
        ranked, count = (ranked_states, MILP_GROUPINGS) if brackets == 1 else ([carry], 1)
        items: list[tuple[Any, Arm]] = []
        for arm, cands in self._milp.arms(ranked, until, count):
            if arm == carry.arm:
                carry.seed_from(cands, ledger, problem.all_devices)
            else:
                self._seeds[arm] = cands
                items.append((None, arm))
        return items

    def _tpe_items(self, study: ArmStudy, problem: _Problem, timed: bool, span: float) -> list[tuple[Any, Arm | None]]:
        """Arms the study's TPE sampler proposes from all recorded trials.

        Each ask re-reads the whole history (~1700 trials at 64 GPUs, tenths of a second per ask),
        so a clock-paced search stops asking after ASK_SHARE of its budget.
        """
        ask_until = time.perf_counter() + ASK_SHARE * span
        items: list[tuple[Any, Arm | None]] = []
        for _ in range(BRACKET_ARMS):
            if timed and time.perf_counter() >= ask_until:
                break
            trial = study.study.ask()
            items.append((trial, arm_from_trial(trial, problem.groupings, problem.types, problem.totals)))
        return items

    def _warm(self, state: ArmEvolution, ledger: Ledger, problem: _Problem) -> None:
        """Start an arm from what is known: a stored candidate of this arm, the context's warm start
        (first arm only) and the MILP's solutions for it."""
        for cand in self._resumed.get(state.arm.label, [])[:1]:
            state.adopt(genome_from_candidate(cand, problem.all_devices), ledger)
        if self.ctx.warm_start is not None and state.index == 0:
            ledger.evaluate(self.ctx.warm_start)
        state.seed_from(self._seeds.pop(state.arm, []), ledger, problem.all_devices)
