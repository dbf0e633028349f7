"""HetRL's multi-level search (arXiv 2512.12476): successive halving over arms, evolution inside.

Levels 1-2 (task grouping; GPUs of each kind per group) are *arms* (`arms`); the search budget is
allocated among them by synchronous successive halving (`halving`): every live arm gets the same
number of evaluations, the best 1/η survive, survivors get η times more. Inside an arm, levels
3-5 are filled by an evolutionary search (`evolution`), in worker processes when asked
(`parallel`). Optuna records the arm level (`study`): with `--storage sqlite:///x.db` a later run
resumes, its TPE sampler proposes arms from everything recorded, and optuna-dashboard shows it.

Small problems enumerate every arm; larger ones start from structured arms (whole GPU kinds per
group, even splits, region-aligned splits, generation on whole hosts of one type, and sub-pools — a region, a GPU type, a type within a
region — with the rest of the cluster idle) and add TPE-proposed arms in further brackets. On
larger problems the arm level also asks the restricted MILP (`milp_arms`): after a bracket has
ranked the groupings it is solved for the best few, and each shortlisted solution enters the next
bracket as an arm seeded with it; evolution then refines those arms beyond the restricted space.

Screening: stages afford arms in list order, and the arms that win are often deep in it (a
region's pool for a grouping named late). Before the first stage the first `screen_arms` structured
arms are each scored on one seed placement and every stage takes them in that rank: a few hundred
evaluations put the likely winners in the first stage instead of the fourth.

Pacing: the search runs in *stages* of doubling evaluation budgets (400, 800, 1600, …), each a
full sequence of brackets over the arms its budget affords, every arm keeping its population from
stage to stage. Nothing in that sequence reads the clock or the total budget, so `--max-evals N`
is exactly the first N evaluations of any longer run, a loaded machine does the same work more
slowly, and the time budget only cuts the sequence short (the ledger keeps back room, measured
from the steps so far, for the last step and for recording the study). Quality therefore follows
evaluations, never seconds.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING, Any

from hetprof.errors import InfeasibleError
from hetprof.planner.search import register_search
from hetprof.planner.search.arms import (
    Arm,
    affordable_arms,
    arm_count,
    enumerate_arms,
    host_splits,
    one_region_pools,
    pool_pairs,
    region_cuts,
    region_pair_arms,
    region_pools,
    structured_arms,
    sub_pools,
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
from hetprof.planner.search.subpools import sub_clusters

if TYPE_CHECKING:
    from collections.abc import Callable

    from hetprof.planner.candidate import Candidate
    from hetprof.planner.planning import PlanningContext

ENUMERATE_LIMIT = 1500      # arms: below this every (grouping, counts) arm is tried
BRACKET_ARMS = 27           # TPE-proposed arms per extra bracket
STAGE_EVALS = 400           # the first stage's evaluation budget; every later stage doubles it
MILP_FROM = 3200            # stages with at least this budget ask the MILP for arms ...
MILP_GROUPINGS = 2          # ... for the best-ranked groupings not solved yet
MILP_MAX = 3                # groupings the MILP is solved for in one run, at most
PAIR_GROUPINGS = 3          # best-screened two-group groupings also tried on each ordered pair of regions
SCREEN_ARMS = 243           # structured arms scored on one seed each before the first stage (what 3200 evaluations afford)


@dataclasses.dataclass(frozen=True)
class HetRLConfig(SearchConfig):
    enumerate_limit: int = knob(ENUMERATE_LIMIT, "enumerate every arm when there are at most this many", 0)
    milp_arms: bool = knob(True, "seed arms from the restricted MILP on problems too large to enumerate")
    screen_arms: int = knob(SCREEN_ARMS, "structured arms scored on one seed placement each before the first "
                                         "stage and then taken in that rank (0: in list order)", 0)
    pair_groupings: int = knob(PAIR_GROUPINGS, "best-screened two-group groupings also screened with each group "
                                               "on another region's whole pool (0: none)", 0)
    milp_from: int = knob(MILP_FROM, "the least stage budget (evaluations) at which the MILP is asked", 1)
    sub_pools: bool = knob(True, "objective cost: also search each one-region and one-GPU-type sub-cluster alone")
    pool_pairs: bool = knob(True, "arms with generation on one region's pool and the rest on another's, and "
                                  "with training on one region's pool and the rest on every other GPU")


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


def arm_space(planning: PlanningContext, config: HetRLConfig, objective: str) -> tuple[_Problem, list[Arm], list[Arm]]:
    """The problem's arms: every (grouping, counts) arm when few enough (`enumerate_limit`), else the
    structured ones; and the structured arms a screening ranks."""
    types, by_type = gpu_types(planning), devices_by_type(planning)
    totals = [len(by_type[t]) for t in types]
    groupings = all_groupings(planning)
    exact = arm_count(groupings, totals) <= config.enumerate_limit
    cuts, pools = region_cuts(planning, by_type, types), sub_pools(planning, types)
    if not exact:
        # parts of sub-pools only where GPUs are priced: they crowd a throughput search's arms
        parts = objective != "throughput"
        pairs = (pool_pairs(planning, types) or host_splits(planning, types)) if config.pool_pairs else []
        trainers = one_region_pools(planning, types) if config.pool_pairs else []
        structured = structured_arms(groupings, types, totals, cuts, pools, parts, pairs, trainers)
        return _Problem(types, by_type, totals, groupings, exact), structured, structured
    # enumeration names every count split, but not where a sub-pool's GPUs come from: those
    # arms join the rest, sampled like them, after the structured arms a budget takes first.
    # Pairs of pools are left out: on a cluster this small evolution's swaps move a group
    # between regions in a few steps, and more arms only thin the sample.
    pooled = [a for a in structured_arms(groupings, types, totals, cuts, pools) if a.region]
    arms = enumerate_arms(groupings, types, totals) + pooled
    structured = structured_arms(groupings, types, totals, cuts)
    return _Problem(types, by_type, totals, groupings, exact), arms, structured


def offer_shared(found: list[Candidate], ledger: Ledger) -> None:
    """Offer stored or other processes' best plans to this ledger, scored here (one problem,
    one score); they are not this process's evaluations, so its own work stays what its budget
    says."""
    for cand in found:
        try:
            score = ledger.ctx.planning.evaluate(cand)
        except (KeyError, ValueError):
            continue                # a plan for devices this cluster does not have
        ledger.offer(cand, score, ledger.value(score))


def tpe_items(study: ArmStudy, problem: _Problem, ledger: Ledger) -> list[tuple[Any, Arm | None]]:
    """Arms the study's TPE sampler proposes from all recorded trials."""
    items: list[tuple[Any, Arm | None]] = []
    for _ in range(BRACKET_ARMS):
        if ledger.exhausted:
            break
        trial = study.study.ask()
        items.append((trial, arm_from_trial(trial, problem.groupings, problem.types, problem.totals)))
    return items


def region_pairs(ranked: list[Arm], structured: list[Arm], problem: _Problem, value: Callable[[Arm], float],
                 pools: list, limit: int) -> list[Arm]:
    """Region-pair arms (`region_pair_arms`) for the best-screened two-group groupings (at most
    `limit`; `value`: an arm's screened objective): the list pairs regions only for generation alone,
    and a colocated grouping that screens well on one region's pool is often fastest split across two
    (each group's traffic in its datacenter)."""
    known, tried = set(structured), set()
    out: list[Arm] = []
    for arm in ranked:
        if len(tried) >= limit or not pools:
            break
        if arm.grouping in tried or not math.isfinite(value(arm)):
            continue
        new = [a for a in region_pair_arms(arm.grouping, pools, problem.types) if a not in known]
        if new:                     # groupings the list already pairs (generation alone) do not count
            tried.add(arm.grouping)
            out += new
    return out


def stopped_by(ledger: Ledger) -> str:
    """Why a run ended, for its report."""
    if ledger.max_evals and ledger.evaluations >= ledger.max_evals:
        return "evaluations"
    if ledger.clock() >= ledger.deadline:
        return "time"
    return "search space exhausted"


@register_search("hetrl")
class HetRLSearch(Search):
    """Successive halving over (grouping, GPU counts) arms; evolution over placements inside each."""

    config_type = HetRLConfig
    config: HetRLConfig

    def run(self) -> SearchResult:
        """The search of the whole cluster; with objective cost first the same search (without
        passes of its own) on each one-region, one-GPU-type and type-within-region sub-cluster
        (`subpools`), each with the full evaluation budget and an equal share of the clock, their
        plans offered to the whole cluster's ledger."""
        ctx = self.ctx
        passes = sub_clusters(ctx.planning.cluster, within=True) if ctx.objective == "cost" and self.config.sub_pools else []
        started = time.perf_counter()
        found: list[Candidate] = []
        evaluations = 0
        info = {}
        for i, (name, cluster) in enumerate(passes):
            share = (ctx.time_budget_s - (time.perf_counter() - started)) / (len(passes) + 1 - i)
            sub = dataclasses.replace(ctx, planning=ctx.planning.on_cluster(cluster), time_budget_s=max(share, 0.0),
                                      storage=None, study_name=None, warm_start=None, progress=None,
                                      config=dataclasses.replace(self.config, sub_pools=False))
            try:
                res = HetRLSearch(sub).run()
            except InfeasibleError:
                info[name] = None
                continue
            found.append(res.candidate)
            evaluations += res.evaluations
            info[name] = round(res.score.cost_per_iteration, 6)
        if not passes:
            return self._run_whole(found)
        self.ctx = dataclasses.replace(ctx, time_budget_s=max(0.0, ctx.time_budget_s - (time.perf_counter() - started)))
        try:
            result = self._run_whole(found)
        finally:
            self.ctx = ctx
        result.extra["sub_pools"] = info
        return dataclasses.replace(result, evaluations=result.evaluations + evaluations,
                                   seconds=time.perf_counter() - started)

    def _run_whole(self, offered: list[Candidate]) -> SearchResult:
        """The search of the whole cluster; `offered` plans (the sub-pool passes') join at the end."""
        ctx = self.ctx
        ledger = Ledger(ctx)
        problem, arms, structured = arm_space(ctx.planning, self.config, ctx.objective)
        # one study per problem (the simulator's seed draws its response lengths), whatever the
        # search's seed: processes sharing a storage each bring their own
        name = ctx.study_name or f"hetrl-{problem_key(ctx.planning, ctx.objective, ctx.budget)}-lengths{ctx.planning.seed}"
        study = ArmStudy(name, ctx.seed, ctx.storage, ctx.planning.devices)
        self._resumed = study.resumed()
        offer_shared(study.best_stored(), ledger)
        self._assembler = Assembler(ctx.planning, ctx.max_tp, ctx.max_pp)
        self._seeds: dict[Arm, list[Candidate]] = {}
        self._states: dict[Arm, ArmEvolution] = {}
        self._milp = MilpArms(ctx, problem.types)
        pool = EvaluationPool(ledger, ctx.workers, ctx.max_tp, ctx.max_pp)
        halving = Halving(ledger, pool, study)
        stages = brackets = 0
        best_arm: ArmEvolution | None = None
        budget = STAGE_EVALS
        try:
            if not problem.exact and self.config.screen_arms:
                arms = structured = self._screen(structured, problem, ledger, pool)
            # Stages of doubling evaluation budgets, each a full run of the bracket sequence over
            # the arms it can afford; arms keep their populations from stage to stage. The work
            # depends on neither budget: --max-evals N and a clock that allows N evaluations do
            # the same N, so more budget never gives a worse plan and load only slows it down.
            while not ledger.exhausted:
                before = ledger.evaluations
                stage_arms = affordable_arms(arms, structured, budget, ctx.seed)
                done, survivor = self._stage(problem, stage_arms, budget, halving, best_arm)
                stages, brackets = stages + 1, brackets + done
                if survivor is not None and (best_arm is None or survivor.value <= best_arm.value):
                    best_arm = survivor
                if ledger.evaluations == before:
                    break               # every arm is exhausted and nothing new was proposed
                budget *= 2
            offer_shared(study.pull() + offered, ledger)
        finally:
            pool.close()
        return ledger.result("hetrl", arms=len(arms), arms_enumerated=problem.exact, stages=stages,
                             brackets=brackets, best_arm=best_arm.arm.label if best_arm else None, study=name,
                             storage=ctx.storage, stopped_by=stopped_by(ledger),
                             resumed_candidates=len(self._resumed), shared_trials=study.shared,
                             milp=self._milp.info or None)

    def _stage(self, problem: _Problem, arms: list[Arm], total_evals: int, halving: Halving,
               carry: ArmEvolution | None) -> tuple[int, ArmEvolution | None]:
        """One stage: brackets of halving over the initial arms, then MILP and TPE arms, on
        `total_evals` evaluations; `carry` (the best arm so far) joins the first bracket."""
        ledger, study = halving.ledger, halving.study
        use_milp = not problem.exact and self.config.milp_arms and total_evals >= self.config.milp_from
        distributions = arm_distributions(problem.groupings, problem.types, problem.totals)
        start = ledger.evaluations
        brackets = 0
        best_arm: ArmEvolution | None = None
        items: list[tuple[Any, Arm | None]] = [(None, arm) for arm in arms]
        ranked_states: list[ArmEvolution] = []
        while not ledger.exhausted:
            brackets += 1
            trials, states = self._open(items, problem, ledger, study, carry)
            if carry is not None:
                states.append(carry)
                trials.append(None)
            if not states:
                break
            remaining = total_evals - (ledger.evaluations - start)
            budget = remaining if problem.exact else max(len(states), remaining // (1 if brackets >= 3 else 2))
            final = problem.exact or brackets >= 3
            survivor = halving.bracket(states, trials, budget, final=final)
            ranked_states.extend(states)
            recording = ledger.clock()
            offer_shared(study.record(trials, distributions), ledger)
            # the last bracket's recording runs after the clock's last look: the reserve holds it
            ledger.closing_s = max(ledger.closing_s, ledger.clock() - recording)
            best_arm = survivor if best_arm is None or survivor.value <= best_arm.value else best_arm
            carry = survivor
            if problem.exact or ledger.exhausted or final:
                break
            items = []
            if use_milp:
                items += self._milp_items(brackets, ranked_states, carry, ledger, problem)
            items += tpe_items(study, problem, ledger)
        return brackets, best_arm

    def _screen(self, structured: list[Arm], problem: _Problem, ledger: Ledger, pool: EvaluationPool) -> list[Arm]:
        """The first `screen_arms` structured arms, each scored on its first seed placement, ranked
        by it ahead of the rest: stages afford the arms in list order, and a good arm deep in the list
        (a region's pool for a grouping named late) would otherwise wait for a late stage."""
        head = structured[:self.config.screen_arms]
        states = [self._state(arm, problem, ledger) for arm in head]
        pool.advance(states, 1, ledger.deadline, lambda: ledger.exhausted)
        order = sorted(range(len(head)), key=lambda i: (states[i].value, i))
        head = [head[i] for i in order]
        pools = region_pools(self.ctx.planning, problem.types) if self.config.pair_groupings else []
        paired = region_pairs(head, structured, problem, lambda a: self._states[a].value, pools,
                              self.config.pair_groupings)
        pair_states = [self._state(arm, problem, ledger) for arm in paired]
        pool.advance(pair_states, 1, ledger.deadline, lambda: ledger.exhausted)
        screened = sorted(head + paired, key=lambda a: self._states[a].value)     # stable: ties keep list order
        return screened + structured[len(head):]

    def _state(self, arm: Arm, problem: _Problem, ledger: Ledger) -> ArmEvolution:
        """The arm's evolution: continued when met before, else started warmed (`_warm`)."""
        state = self._states.get(arm)
        if state is None:
            state = ArmEvolution(arm, len(self._states), self.ctx.seed, self._assembler, problem.by_type)
            self._states[arm] = state
            self._warm(state, ledger, problem)
        else:
            state.seed_from(self._seeds.pop(arm, []), ledger, problem.all_devices)
        return state

    def _open(self, items: list[tuple[Any, Arm | None]], problem: _Problem, ledger: Ledger, study: ArmStudy,
              carry: ArmEvolution | None) -> tuple[list, list[ArmEvolution]]:
        """A bracket's arms as evolution states and trials. An arm met before (an earlier stage)
        continues its population; a new one starts warmed from stored and MILP candidates."""
        import optuna

        trials, states = [], []
        taken = {carry.arm} if carry is not None else set()
        for trial, arm in items:
            if arm is None or arm in taken:
                if trial is not None:
                    study.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            taken.add(arm)
            state = self._state(arm, problem, ledger)
            trial = trial if trial is not None else PendingTrial(arm)
            trial.set_user_attr("arm", arm.label)
            trial.set_user_attr("process", study.process)
            trials.append(trial)
            states.append(state)
        return trials, states

    def _milp_items(self, brackets: int, ranked_states: list[ArmEvolution], carry: ArmEvolution, ledger: Ledger,
                    problem: _Problem) -> list[tuple[Any, Arm]]:
        """After a stage's first bracket the best-ranked groupings' MILP arms; after its second the
        survivor's grouping's, when it is none of those (the arms that won may come from TPE)."""
        left = MILP_MAX - len(self._milp.tried)
        if brackets > 2 or left <= 0:
            return []
        ranked, count = (ranked_states, MILP_GROUPINGS) if brackets == 1 else ([carry], 1)
        items: list[tuple[Any, Arm]] = []
        found = self._milp.arms(ranked, min(count, left), ledger.deadline)
        ledger.bounded()                # each solve kept to the deadline itself
        for arm, cands in found:
            if arm == carry.arm:
                carry.seed_from(cands, ledger, problem.all_devices)
            else:
                self._seeds[arm] = cands
                items.append((None, arm))
        return items

    def _warm(self, state: ArmEvolution, ledger: Ledger, problem: _Problem) -> None:
        """Start an arm from what is known: a stored candidate of this arm, the context's warm start
        (first arm only) and the MILP's solutions for it."""
        for cand in self._resumed.get(state.arm.label, [])[:1]:
            state.adopt(genome_from_candidate(cand, problem.all_devices), ledger)
        if self.ctx.warm_start is not None and state.index == 0:
            ledger.evaluate(self.ctx.warm_start)
        state.seed_from(self._seeds.pop(state.arm, []), ledger, problem.all_devices)
