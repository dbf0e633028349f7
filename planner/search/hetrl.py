"""HetRL's multi-level search (arXiv 2512.12476): successive halving over arms, evolution inside.

Levels 1-2 (task grouping; GPUs of each kind per group) are *arms*. Arms are cheap to name and
expensive to judge — an arm is only as good as the best placement inside it — so the search
budget is allocated by synchronous successive halving: every live arm gets the same number of
evaluations, the best 1/η survive, survivors get η times more. Inside an arm, levels 3-5 are
filled by `evolution.ArmEvolution`.

Optuna drives the arm level. Each arm is a trial of one study with parameters `grouping` and
`n[type][group]`; the halving rungs are the trial's intermediate values, cut arms are told
PRUNED, finalists COMPLETE, and each trial keeps its best candidate as a JSON user attribute. With
`--storage sqlite:///x.db` a later run on the same problem resumes: stored candidates re-enter
their arms' populations and the study's TPE sampler proposes new arms from everything recorded,
and optuna-dashboard shows the whole history. Optuna's own SuccessiveHalvingPruner is the
*asynchronous* variant (promotion depends on arrival order), so the cut is ranked here and only
recorded through Optuna.

Small problems enumerate every arm; larger ones start from structured arms (whole GPU kinds per
group, even splits) and add TPE-proposed arms in further brackets while budget remains.

On larger problems the arm level also asks a mathematical program: after the first bracket has
ranked the groupings, the restricted MILP (`ilp.py`: GPU counts per type *and region*, type-pure
replicas, one shape per task) is solved for the best few groupings, and each of its shortlisted
solutions enters the next bracket as an arm whose population starts from that solution. Structured
and TPE arms split GPUs per type only and rarely hit the region-aligned count mixes the MILP finds
(a whole region's A100s and L40S for training, everything else for inference); evolution then
refines these arms beyond the restricted space (mixed replicas, other tasklet orders). The arm
that survives the second bracket may have a grouping none of those solves covered (a TPE or MILP
arm, or one that overtook late); then the MILP is solved for that grouping too and its arms join
a last, short bracket beside the survivor. With an evaluation budget the MILP runs under a node
limit, so the search stays deterministic.

Time: a clock-paced search stops its evolution at the ledger's deadline, which keeps back a
margin for wrapping up (closing the study's trials, building the result), so the whole run ends
within `time_budget_s`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import math
import multiprocessing
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hetprof.planner.search import register_search
from hetprof.planner.search.base import Ledger, Search, SearchResult
from hetprof.planner.search.evolution import Arm, ArmEvolution, Genome, rank_arms
from hetprof.planner.search.space import (
    Assembler,
    Grouping,
    all_groupings,
    counts_of,
    decode_candidate,
    devices_by_type,
    encode_candidate,
    gpu_types,
    grouping_label,
    problem_key,
)

if TYPE_CHECKING:
    import optuna

    from hetprof.planner.candidate import Candidate

ETA = 3
ENUMERATE_LIMIT = 1500      # arms: below this every (grouping, counts) arm is tried
BRACKET_ARMS = 27           # TPE-proposed arms per extra bracket
EVALS_PER_ARM = 24          # default evaluation budget per initial arm
MILP_AT = 0.40              # clock-paced: the first bracket ends at this share of the budget ...
MILP_UNTIL = 0.65           # ... and the MILP seeding must be done by this share (the best
MILP_FIRST = 0.6            # grouping's solve gets this part of that window)
MILP_GROUPINGS = 2          # best-ranked groupings the MILP is solved for
MILP_SHORTLIST = 3          # MILP solutions per grouping that become arms
MILP_NODES = 3000           # CBC node limit with an evaluation budget (deterministic)
MILP_LAST_AT = 0.82         # clock-paced: the second bracket ends here; if its best grouping had no
MILP_LAST_UNTIL = 0.90      # MILP solve yet, one is done by this share, and a last bracket follows
ASK_SHARE = 0.04            # clock-paced: most of the budget spent asking TPE for arms per bracket


def compositions(n: int, parts: int) -> list[tuple[int, ...]]:
    """Every way to write n as an ordered sum of `parts` non-negative integers."""
    out = []
    for bars in itertools.combinations(range(n + parts - 1), parts - 1):
        prev, parts_ = -1, []
        for b in (*bars, n + parts - 1):
            parts_.append(b - prev - 1)
            prev = b
        out.append(tuple(parts_))
    return out


def arm_count(groupings: Sequence[Grouping], totals: Sequence[int]) -> int:
    return sum(math.prod(math.comb(n + len(g), len(g)) for n in totals) for g in groupings)


def enumerate_arms(groupings: Sequence[Grouping], types: Sequence[str], totals: Sequence[int]) -> list[Arm]:
    """All arms: per grouping, every split of every GPU kind over its groups and the idle pool."""
    arms = []
    for grouping in groupings:
        k = len(grouping)
        per_type = [compositions(n, k + 1) for n in totals]
        for combo in itertools.product(*per_type):
            counts = tuple(tuple(combo[t][g] for t in range(len(types))) for g in range(k))
            if all(sum(c) > 0 for c in counts):
                arms.append(Arm(grouping, counts, tuple(types)))
    return arms


def region_cuts(sim, by_type: dict[str, tuple[str, ...]], types: Sequence[str]) -> list[tuple[int, ...]]:
    """Per GPU kind, the counts that hand one side a whole-region block of its locality-ordered
    GPUs: every place the region changes, seen from either end (c and total - c)."""
    out = []
    for t in types:
        pool = by_type.get(t, ())
        cuts = {i for i in range(1, len(pool)) if sim.devices[pool[i]].region != sim.devices[pool[i - 1]].region}
        out.append(tuple(sorted(cuts | {len(pool) - c for c in cuts})))
    return out


def structured_arms(groupings: Sequence[Grouping], types: Sequence[str], totals: Sequence[int],
                    cuts: Sequence[Sequence[int]] | None = None) -> list[Arm]:
    """Arms a person would try first: whole GPU kinds per group, even splits of every kind, and
    (two groups) one kind split in quarters or at a region boundary (`cuts`, from `region_cuts`).

    A region-aligned split is the disaggregated plan a geo-distributed cluster invites, e.g.
    generation on one region's L40S and every other kind, training on another region's L40S
    (StreamRL's structure); quarters of a kind cut through hosts and regions and miss it.
    """
    arms: dict[tuple, Arm] = {}
    for grouping in groupings:
        k = len(grouping)
        if k <= len(types):
            for owner in itertools.product(range(k), repeat=len(types)):
                counts = tuple(tuple(totals[t] if owner[t] == g else 0 for t in range(len(types)))
                               for g in range(k))
                if all(sum(c) > 0 for c in counts):
                    arms[(grouping, counts)] = Arm(grouping, counts, tuple(types))
        even = tuple(tuple(totals[t] // k + (1 if g < totals[t] % k else 0) for t in range(len(types)))
                     for g in range(k))
        if all(sum(c) > 0 for c in even):
            arms[(grouping, even)] = Arm(grouping, even, tuple(types))
        if k == 2:
            for t_major in range(len(types)):
                # one kind split in quarters, the others whole to either side
                for q in (1, 3):
                    for owner in itertools.product(range(2), repeat=len(types)):
                        counts = tuple(tuple(
                            (totals[t] * q // 4 if g == 0 else totals[t] - totals[t] * q // 4) if t == t_major
                            else (totals[t] if owner[t] == g else 0) for t in range(len(types))) for g in range(2))
                        if all(sum(c) > 0 for c in counts):
                            arms[(grouping, counts)] = Arm(grouping, counts, tuple(types))
    for grouping in groupings:
        if len(grouping) != 2 or not cuts:
            continue
        for t_major in range(len(types)):
            # the first group takes `cut` of this kind (its locality-ordered first GPUs in the seed
            # placement; the second group's seed variant takes the rest's first), others whole
            for cut in cuts[t_major]:
                for owner in itertools.product(range(2), repeat=len(types)):
                    counts = tuple(tuple(
                        (cut if g == 0 else totals[t] - cut) if t == t_major
                        else (totals[t] if owner[t] == g else 0) for t in range(len(types))) for g in range(2))
                    if all(sum(c) > 0 for c in counts):
                        arms.setdefault((grouping, counts), Arm(grouping, counts, tuple(types)))
    return list(arms.values())


def _arm_params(arm: Arm) -> dict[str, Any]:
    params: dict[str, Any] = {"grouping": grouping_label(arm.grouping)}
    for g, c in enumerate(arm.counts):
        for t, n in zip(arm.types, c, strict=True):
            params[f"n[{t}][{g}]"] = n
    return params


def _arm_distributions(groupings: Sequence[Grouping], types: Sequence[str], totals: Sequence[int]) -> dict:
    """The distributions `_arm_from_trial` suggests from (every group index any grouping has)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    out: dict[str, Any] = {"grouping": CategoricalDistribution([grouping_label(g) for g in groupings])}
    for g in range(max(len(gr) for gr in groupings)):
        for t, n in zip(types, totals, strict=True):
            out[f"n[{t}][{g}]"] = IntDistribution(0, n)
    return out


class _Pending:
    """An arm the search named itself (enumerated, structured or from the MILP), not the sampler.

    Such an arm is recorded in the study as one finished trial when its bracket ends, instead of
    enqueue/ask/report/tell per arm: each ask re-reads every trial, so per-arm calls grow
    quadratically with the arms and would eat the search budget. It quacks like the trial calls used here.
    """

    def __init__(self, arm: Arm) -> None:
        self.arm = arm
        self.reports: dict[int, float] = {}
        self.attrs: dict[str, Any] = {}
        self.state: Any = None
        self.value: float | None = None

    def report(self, value: float, step: int) -> None:
        self.reports[step] = value

    def set_user_attr(self, key: str, value: Any) -> None:
        self.attrs[key] = value

    def close(self, how: Any, value: float) -> None:
        self.state, self.value = how, (value if math.isfinite(value) else 1e300)

    def frozen(self, distributions: dict) -> optuna.trial.FrozenTrial:
        import optuna

        params = _arm_params(self.arm)
        state = self.state or optuna.trial.TrialState.PRUNED
        return optuna.trial.create_trial(
            state=state, value=self.value if state == optuna.trial.TrialState.COMPLETE else None,
            params=params, distributions={k: distributions[k] for k in params}, user_attrs=self.attrs,
            intermediate_values=self.reports)


def _arm_from_trial(trial: optuna.trial.Trial, groupings: Sequence[Grouping], types: Sequence[str],
                    totals: Sequence[int]) -> Arm | None:
    """Read (or let the sampler propose) an arm; over-subscribed kinds are scaled down to fit."""
    labels = [grouping_label(g) for g in groupings]
    grouping = groupings[labels.index(trial.suggest_categorical("grouping", labels))]
    k = len(grouping)
    raw = [[trial.suggest_int(f"n[{t}][{g}]", 0, totals[ti]) for ti, t in enumerate(types)] for g in range(k)]
    for ti in range(len(types)):
        s = sum(raw[g][ti] for g in range(k))
        if s > totals[ti]:
            scaled = [raw[g][ti] * totals[ti] / s for g in range(k)]
            raw_int = [int(math.floor(x)) for x in scaled]
            for g in range(k):
                raw[g][ti] = raw_int[g]
    counts = tuple(tuple(r) for r in raw)
    if not all(sum(c) > 0 for c in counts):
        return None
    return Arm(grouping, counts, tuple(types))


def genome_from_candidate(candidate: Candidate, arm: Arm, all_devices: Sequence[str]) -> Genome:
    """A stored candidate as a genome: each group's order follows its first task's tasklets."""
    orders = []
    used: set[str] = set()
    for tasks, devs in zip(candidate.groups, candidate.group_devices, strict=True):
        lay = candidate.layout(tasks[0])
        first = [d for r in lay.replicas for d in r]
        order = tuple(first + [d for d in devs if d not in first])
        orders.append(order)
        used.update(order)
    orders.append(tuple(d for d in all_devices if d not in used))
    shapes = tuple(sorted((t, (lay.tp, lay.pp)) for t, lay in candidate.layouts))
    return Genome(tuple(orders), shapes)


# ---- worker processes ---------------------------------------------------------------------------
# A forked worker inherits the simulator; this module-level slot is per process, set once by the
# pool initializer, and only ever read by that process's own tasks.
_WORKER: dict[str, Any] = {}


def _init_worker(sim, objective, budget, assembler_args) -> None:
    _WORKER.update(sim=sim, objective=objective, budget=budget, assembler=Assembler(sim, *assembler_args))


def _advance_in_worker(state: ArmEvolution, n: int, deadline_wall: float) -> tuple[ArmEvolution, list]:
    sim = _WORKER["sim"]
    state.assembler = _WORKER["assembler"]
    found: list[tuple[float, str]] = []

    def evaluate(cand: Candidate) -> float:
        score = sim.evaluate(cand)
        value = float(sim.objective_value(score, _WORKER["objective"], _WORKER["budget"])) if score.feasible \
            else math.inf
        if not found or value < found[-1][0]:
            found.append((value, encode_candidate(cand)))
        return value

    state.advance(n, evaluate, lambda: time.time() >= deadline_wall)
    state.assembler = None
    return state, found[-1:]


@register_search("hetrl")
class HetRLSearch(Search):
    """Successive halving over (grouping, GPU counts) arms; evolution over placements inside each."""

    def run(self) -> SearchResult:
        import optuna

        ctx, sim = self.ctx, self.ctx.sim
        ledger = Ledger(ctx)
        assembler = Assembler(sim, ctx.max_tp, ctx.max_pp)
        types = gpu_types(sim)
        by_type = devices_by_type(sim)
        totals = [len(by_type[t]) for t in types]
        groupings = all_groupings(sim)
        n_enum = arm_count(groupings, totals)
        exact = n_enum <= ctx.options.get("enumerate_limit", ENUMERATE_LIMIT)
        cuts = region_cuts(sim, by_type, types)
        arms = enumerate_arms(groupings, types, totals) if exact else \
            structured_arms(groupings, types, totals, cuts)
        # With an evaluation budget the search is deterministic; without one it is paced by the
        # clock (rungs sized from the measured evaluation rate) and uses the whole time budget.
        counted = ctx.max_evals or ctx.options.get("evals")
        total_evals = counted or max(400, EVALS_PER_ARM * len(arms))
        ledger.max_evals = counted
        self._timed = counted is None
        arms = self._affordable(arms, groupings, types, totals, total_evals, cuts)

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        name = ctx.study_name or f"hetrl-{problem_key(sim, ctx.objective, ctx.budget)}-seed{ctx.seed}"
        # The search runs on an in-memory study (an RDB round trip per trial call would cost more
        # than the simulator); each finished bracket is copied to the storage in one batch.
        study = optuna.create_study(direction="minimize",
                                    sampler=optuna.samplers.TPESampler(seed=ctx.seed, n_startup_trials=10))
        stored = None
        if ctx.storage:
            stored = optuna.create_study(study_name=name, storage=ctx.storage, direction="minimize",
                                         load_if_exists=True)
            study.add_trials([t for t in stored.get_trials(deepcopy=False) if t.state.is_finished()])
        resumed = self._stored_candidates(study)
        saved = len(study.trials)

        pool = None
        if ctx.workers > 1:
            pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=ctx.workers, mp_context=multiprocessing.get_context("fork"),
                initializer=_init_worker, initargs=(sim, ctx.objective, ctx.budget, (ctx.max_tp, ctx.max_pp)))
        brackets = 0
        best_arm = None
        use_milp = not exact and ctx.options.get("milp_arms", True)
        milp_info: dict[str, Any] = {}
        self._seeds: dict[Arm, list[Candidate]] = {}
        self._milp_tried: set[Grouping] = set()      # groupings the MILP was solved for
        self._milp_constants: dict = {}              # replica rates shared between those solves
        self._until: float | None = None
        span = ledger.deadline - ledger.started
        try:
            next_index = 0
            carry: ArmEvolution | None = None
            items = [(None, arm) for arm in arms]
            ranked_states: list[ArmEvolution] = []
            while not ledger.exhausted:
                brackets += 1
                trials, states = [], []
                for trial, arm in items:
                    if trial is None and arm is not None:
                        trial = _Pending(arm)
                    if arm is None:
                        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                        continue
                    state = ArmEvolution(arm, next_index, ctx.seed, assembler, by_type)
                    next_index += 1
                    self._warm(state, resumed, ledger, by_type)
                    trial.set_user_attr("arm", arm.label)
                    trials.append(trial)
                    states.append(state)
                if carry is not None:
                    states.append(carry)
                    trials.append(None)
                remaining = (ledger.max_evals or total_evals) - ledger.evaluations
                budget = remaining if exact else max(len(states), remaining // (1 if brackets >= 3 else 2))
                final = exact or brackets >= 3
                if self._timed and use_milp:
                    # clock-paced with MILP seeding: bracket 1 until MILP_AT, bracket 2 until
                    # MILP_LAST_AT, then a final bracket (the last grouping's MILP arms and the survivor)
                    self._until = ledger.started + (MILP_AT if brackets == 1 else MILP_LAST_AT) * span \
                        if brackets <= 2 else None
                survivor = self._halving(states, trials, budget, ledger, pool, study, final=final)
                self._until = None
                ranked_states.extend(states)
                distributions = _arm_distributions(groupings, types, totals)
                study.add_trials([t.frozen(distributions) for t in trials if isinstance(t, _Pending)])
                if stored is not None:
                    fresh = [t for t in study.get_trials(deepcopy=False)[saved:] if t.state.is_finished()]
                    stored.add_trials(fresh)
                    saved += len(fresh)
                best_arm = survivor if best_arm is None or survivor.value <= best_arm.value else best_arm
                carry = survivor
                if exact or ledger.exhausted or final:
                    break
                items = []
                if use_milp and brackets <= 2:
                    # after bracket 1 the best-ranked groupings; after bracket 2 the survivor's
                    # grouping, when it is none of those (the arms that won may come from TPE)
                    share = MILP_UNTIL if brackets == 1 else MILP_LAST_UNTIL
                    until = ledger.started + share * span if self._timed else None
                    ranked, count = (ranked_states, MILP_GROUPINGS) if brackets == 1 else ([carry], 1)
                    for arm, cands in self._milp_arms(ranked, ledger, types, until, milp_info, count):
                        if arm == carry.arm:
                            self._seed_state(carry, cands, ledger, by_type)
                        else:
                            self._seeds[arm] = cands
                            items.append((None, arm))
                    if self._timed and brackets == 2:
                        continue            # the last, short bracket: no TPE asks
                # Further brackets: the study's TPE sampler proposes arms from all recorded trials.
                # Each ask re-reads the whole history (~1700 trials at 64 GPUs, tenths of a second
                # per ask), so a clock-paced search stops asking after ASK_SHARE of its budget.
                ask_until = time.perf_counter() + ASK_SHARE * span
                for _ in range(BRACKET_ARMS):
                    if self._timed and time.perf_counter() >= ask_until:
                        break
                    trial = study.ask()
                    items.append((trial, _arm_from_trial(trial, groupings, types, totals)))
        finally:
            if pool is not None:
                pool.shutdown()
        if ledger.max_evals and ledger.evaluations >= ledger.max_evals:
            stopped_by = "evaluations"
        elif time.perf_counter() >= ledger.deadline:
            stopped_by = "time"
        else:
            stopped_by = "search space exhausted"
        return ledger.result("hetrl", arms=len(arms), arms_enumerated=exact, brackets=brackets,
                             best_arm=best_arm.arm.label if best_arm else None, study=name,
                             storage=ctx.storage, stopped_by=stopped_by,
                             resumed_candidates=len(resumed), milp=milp_info or None)

    # ---- pieces ---------------------------------------------------------------------------------
    def _affordable(self, arms: list[Arm], groupings, types, totals, evals: int, cuts=None) -> list[Arm]:
        """As many arms as halving can afford (two looks each per rung, every rung costing about
        the same): structured arms first, then a seeded sample of the rest."""
        room = len(arms)
        while room > 1 and 2 * room * (math.ceil(math.log(room, ETA)) + 1) > evals:
            room -= 1
        if len(arms) <= room:
            return arms
        first = structured_arms(groupings, types, totals, cuts)
        known = set(arms)
        chosen = [a for a in first if a in known][:room]
        rest = [a for a in arms if a not in set(chosen)]
        rng = np.random.default_rng([self.ctx.seed, 1])
        picks = rng.choice(len(rest), size=room - len(chosen), replace=False) if room > len(chosen) else []
        return chosen + [rest[int(i)] for i in sorted(picks)]

    def _stored_candidates(self, study: optuna.Study) -> dict[str, list[Candidate]]:
        """Best candidates earlier runs stored in this study, by arm label (resuming a search)."""
        out: dict[str, list[Candidate]] = {}
        for t in study.get_trials(deepcopy=False):
            text, label = t.user_attrs.get("candidate"), t.user_attrs.get("arm")
            if text and label:
                try:
                    out.setdefault(label, []).append(decode_candidate(text))
                except (ValueError, KeyError, TypeError):
                    continue
        return out

    def _warm(self, state: ArmEvolution, resumed: dict[str, list[Candidate]], ledger: Ledger,
              by_type: dict[str, tuple[str, ...]]) -> None:
        all_devices = [d for t in sorted(by_type) for d in by_type[t]]
        for cand in resumed.get(state.arm.label, [])[:1]:
            self._adopt(state, genome_from_candidate(cand, state.arm, all_devices), ledger)
        if self.ctx.warm_start is not None and state.index == 0:
            ledger.evaluate(self.ctx.warm_start)
        self._seed_state(state, self._seeds.pop(state.arm, []), ledger, by_type)

    def _seed_state(self, state: ArmEvolution, cands: Sequence[Candidate], ledger: Ledger,
                    by_type: dict[str, tuple[str, ...]]) -> None:
        """Start an arm's population from known candidates (the MILP's solutions for this arm).

        The candidate itself is scored as given (its type-pure replicas may differ from what the
        genome rebuilds), and its genome joins the population for evolution to improve on.
        """
        all_devices = [d for t in sorted(by_type) for d in by_type[t]]
        for cand in cands:
            value = ledger.evaluate(cand)[0]
            if value < state.best_value:
                state.best_value, state.best_candidate = value, cand
            self._adopt(state, genome_from_candidate(cand, state.arm, all_devices), ledger)

    @staticmethod
    def _adopt(state: ArmEvolution, genome: Any, ledger: Ledger) -> None:
        """Score a genome once and add it to the arm's population (a new best if it is one)."""
        if genome in state.seen:
            return
        state.seen.add(genome)
        built = state.candidate(genome)
        value = math.inf if built is None else ledger.evaluate(built)[0]
        if built is not None and value < state.best_value:
            state.best_value, state.best_candidate = value, built
        state._insert(value, genome)

    def _milp_arms(self, ranked: Sequence[ArmEvolution], ledger: Ledger, types: Sequence[str],
                   until: float | None, info: dict[str, Any], count: int) -> list[tuple[Arm, list[Candidate]]]:
        """Arms from the restricted MILP, solved for the `count` best-ranked groupings found so far
        that no earlier call solved.

        Each shortlisted MILP solution becomes an arm (its GPU counts per type) seeded with that
        solution. `until` (clock-paced) caps the wall time; otherwise CBC's node limit bounds it.
        """
        from hetprof.errors import InfeasibleError
        from hetprof.planner.search.ilp import ILPSearch

        ctx, sim = self.ctx, self.ctx.sim
        groupings: list[Grouping] = []
        best: dict[Grouping, ArmEvolution] = {}
        for st in sorted(ranked, key=lambda s: (s.value, s.index)):
            if not math.isfinite(st.value) or len(groupings) >= count:
                break
            if st.arm.grouping not in best and st.arm.grouping not in self._milp_tried:
                best[st.arm.grouping] = st
                groupings.append(st.arm.grouping)
        out: dict[Arm, list[Candidate]] = {}
        started = time.perf_counter()
        solved: list[str] = list(info.get("groupings", []))
        for i, grouping in enumerate(groupings):
            options: dict[str, Any] = {"grouping": grouping, "shortlist": MILP_SHORTLIST,
                                       "constants": self._milp_constants}
            if until is not None:
                left = (until - time.perf_counter()) * (MILP_FIRST if i < len(groupings) - 1 else 1.0)
                if left < 0.5:
                    break
                options.update(time_limit_s=left, total_s=left)
            else:
                options.update(time_limit_s=600.0, max_nodes=MILP_NODES)
            # no warm start: the heuristic's candidate is rarely type-pure, CBC then rejects or
            # keeps a poor incumbent and found worse solutions in the same time (measured)
            sub = dataclasses.replace(ctx, warm_start=None, max_evals=None, storage=None, options=options)
            search = ILPSearch(sub)
            self._milp_tried.add(grouping)
            try:
                search.run()
            except InfeasibleError:
                continue
            solved.append(grouping_label(grouping))
            for _value, cand in sorted(search.solutions, key=lambda vc: vc[0]):
                counts = tuple(counts_of(sim, devs, types) for devs in cand.group_devices)
                arm = Arm(grouping, counts, tuple(types))
                out.setdefault(arm, []).append(cand)
        info.update(groupings=solved, arms=info.get("arms", 0) + len(out),
                    seconds=round(info.get("seconds", 0.0) + time.perf_counter() - started, 3))
        return list(out.items())

    def _advance(self, states: list[ArmEvolution], n: int, ledger: Ledger, pool) -> None:
        def evaluate(cand: Candidate) -> float:
            if ledger.max_evals is not None and ledger.evaluations >= ledger.max_evals:
                return math.inf
            return ledger.evaluate(cand)[0]

        def stop() -> bool:
            return self._over(ledger)

        if pool is None or len(states) < 2:
            for s in states:
                if self._over(ledger):
                    break
                s.advance(n, evaluate, stop)
            return
        deadline_wall = time.time() + max(0.0, self._deadline(ledger) - time.perf_counter())
        assembler = states[0].assembler
        for s in states:
            s.assembler = None
        futures = [pool.submit(_advance_in_worker, s, n, deadline_wall) for s in states]
        for i, fut in enumerate(futures):
            new_state, found = fut.result()
            new_state.assembler = assembler
            ledger.evaluations += new_state.evaluations - states[i].evaluations
            states[i].__dict__.update(new_state.__dict__)
            for value, text in found:
                cand = decode_candidate(text)
                score = ledger.ctx.sim.evaluate(cand)
                ledger.offer(cand, score, value)

    def _halving(self, states: list[ArmEvolution], trials: list, budget: int, ledger: Ledger, pool,
                 study: optuna.Study, final: bool = True) -> ArmEvolution:
        """Synchronous successive halving over `states`; returns the surviving arm."""
        import optuna

        alive = list(states)
        rungs = max(1, math.ceil(math.log(max(1, len(alive)), ETA))) + 1
        # clock-paced with many arms, the first rung looks once per arm (its locality-ordered seed)
        per_arm = max(1 if self._timed else 2, budget // max(1, len(alive) * rungs))
        start = ledger.evaluations
        started = time.perf_counter()
        rung = 0
        trial_of = {id(s): t for s, t in zip(states, trials, strict=True)}
        while True:
            self._advance(alive, per_arm, ledger, pool)
            for s in alive:
                t = trial_of[id(s)]
                if t is not None:
                    t.report(s.value if math.isfinite(s.value) else 1e300, step=rung)
            if len(alive) == 1 or self._over(ledger):
                break
            keep = max(1, math.ceil(len(alive) / ETA))
            kept = rank_arms(alive, keep)
            for s in alive:
                if s not in kept:
                    self._close(study, trial_of[id(s)], s, optuna.trial.TrialState.PRUNED)
            alive = kept
            per_arm *= ETA
            if not final and not self._timed:
                # an earlier bracket keeps to its share, so later brackets (MILP arms) still run
                per_arm = min(per_arm, max(1, (budget - (ledger.evaluations - start)) // len(alive)))
            if self._timed:
                per_arm = self._paced(alive, ledger, start, started, self._deadline(ledger))
            rung += 1
        left = budget - (ledger.evaluations - start)
        if self._timed:
            # the clock stops the last bracket (or one with its own end); an earlier one leaves
            # half the time to the next
            rate = (ledger.evaluations - start) / max(1e-6, time.perf_counter() - started)
            left = 1 << 30 if final or self._until is not None else \
                int(rate * max(0.0, ledger.deadline - time.perf_counter()) / 2)
        if left > 0 and not self._over(ledger):
            self._advance(alive[:1], left, ledger, pool)
        ranked = rank_arms(alive, len(alive))
        for s in ranked:
            self._close(study, trial_of[id(s)], s, optuna.trial.TrialState.COMPLETE)
        return ranked[0]

    def _deadline(self, ledger: Ledger) -> float:
        """When the current bracket must stop: its own end, or the ledger's deadline."""
        return ledger.deadline if self._until is None else min(self._until, ledger.deadline)

    def _over(self, ledger: Ledger) -> bool:
        return ledger.exhausted or (self._until is not None and time.perf_counter() >= self._until)

    @staticmethod
    def _paced(alive: list[ArmEvolution], ledger: Ledger, start: int, started: float, deadline: float) -> int:
        """Evaluations per arm for the next rung so the remaining rungs fit the time left."""
        rate = (ledger.evaluations - start) / max(1e-6, time.perf_counter() - started)
        left = max(0.0, deadline - time.perf_counter())
        rungs = max(1, math.ceil(math.log(max(1, len(alive)), ETA))) + 1
        return max(2, int(rate * left / (len(alive) * rungs)))

    @staticmethod
    def _close(study: optuna.Study, trial, state: ArmEvolution, how) -> None:
        if trial is None:
            return
        if state.best_candidate is not None:
            trial.set_user_attr("candidate", encode_candidate(state.best_candidate))
        trial.set_user_attr("evaluations", state.evaluations)
        import optuna

        if isinstance(trial, _Pending):
            trial.close(how, state.value)
        elif how == optuna.trial.TrialState.COMPLETE:
            study.tell(trial, state.value if math.isfinite(state.value) else 1e300)
        else:
            study.tell(trial, state=how)
