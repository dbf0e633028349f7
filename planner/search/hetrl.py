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
"""

from __future__ import annotations

import concurrent.futures
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


def structured_arms(groupings: Sequence[Grouping], types: Sequence[str], totals: Sequence[int]) -> list[Arm]:
    """Arms a person would try first: whole GPU kinds per group, and even splits of every kind."""
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
    return list(arms.values())


def _arm_params(arm: Arm) -> dict[str, Any]:
    params: dict[str, Any] = {"grouping": grouping_label(arm.grouping)}
    for g, c in enumerate(arm.counts):
        for t, n in zip(arm.types, c, strict=True):
            params[f"n[{t}][{g}]"] = n
    return params


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
        arms = enumerate_arms(groupings, types, totals) if exact else structured_arms(groupings, types, totals)
        # With an evaluation budget the search is deterministic; without one it is paced by the
        # clock (rungs sized from the measured evaluation rate) and uses the whole time budget.
        counted = ctx.max_evals or ctx.options.get("evals")
        total_evals = counted or max(400, EVALS_PER_ARM * len(arms))
        ledger.max_evals = counted
        self._timed = counted is None
        arms = self._affordable(arms, groupings, types, totals, total_evals)

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
        try:
            next_index = 0
            carry: ArmEvolution | None = None
            items = [(None, arm) for arm in arms]
            while not ledger.exhausted:
                brackets += 1
                trials, states = [], []
                for trial, arm in items:
                    if trial is None:
                        study.enqueue_trial(_arm_params(arm), skip_if_exists=False)
                        trial = study.ask()
                        arm = _arm_from_trial(trial, groupings, types, totals)
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
                survivor = self._halving(states, trials, budget, ledger, pool, study,
                                         final=exact or brackets >= 3)
                if stored is not None:
                    fresh = [t for t in study.get_trials(deepcopy=False)[saved:] if t.state.is_finished()]
                    stored.add_trials(fresh)
                    saved += len(fresh)
                best_arm = survivor if best_arm is None or survivor.value <= best_arm.value else best_arm
                carry = survivor
                if exact or ledger.exhausted:
                    break
                # Further brackets: the study's TPE sampler proposes arms from all recorded trials.
                items = []
                for _ in range(BRACKET_ARMS):
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
                             resumed_candidates=len(resumed))

    # ---- pieces ---------------------------------------------------------------------------------
    def _affordable(self, arms: list[Arm], groupings, types, totals, evals: int) -> list[Arm]:
        """As many arms as halving can afford (two looks each per rung, every rung costing about
        the same): structured arms first, then a seeded sample of the rest."""
        room = len(arms)
        while room > 1 and 2 * room * (math.ceil(math.log(room, ETA)) + 1) > evals:
            room -= 1
        if len(arms) <= room:
            return arms
        first = structured_arms(groupings, types, totals)
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
            genome = genome_from_candidate(cand, state.arm, all_devices)
            if genome in state.seen:
                continue
            state.seen.add(genome)
            built = state.candidate(genome)
            value = math.inf if built is None else ledger.evaluate(built)[0]
            if built is not None and value < state.best_value:
                state.best_value, state.best_candidate = value, built
            state._insert(value, genome)
        if self.ctx.warm_start is not None and state.index == 0:
            ledger.evaluate(self.ctx.warm_start)

    def _advance(self, states: list[ArmEvolution], n: int, ledger: Ledger, pool) -> None:
        def evaluate(cand: Candidate) -> float:
            if ledger.max_evals is not None and ledger.evaluations >= ledger.max_evals:
                return math.inf
            return ledger.evaluate(cand)[0]

        def stop() -> bool:
            return ledger.exhausted

        if pool is None or len(states) < 2:
            for s in states:
                if ledger.exhausted:
                    break
                s.advance(n, evaluate, stop)
            return
        deadline_wall = time.time() + max(0.0, ledger.deadline - time.perf_counter())
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
        per_arm = max(2, budget // max(1, len(alive) * rungs))
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
            if len(alive) == 1 or ledger.exhausted:
                break
            keep = max(1, math.ceil(len(alive) / ETA))
            kept = rank_arms(alive, keep)
            for s in alive:
                if s not in kept:
                    self._close(study, trial_of[id(s)], s, optuna.trial.TrialState.PRUNED)
            alive = kept
            per_arm *= ETA
            if self._timed:
                per_arm = self._paced(alive, ledger, start, started)
            rung += 1
        left = budget - (ledger.evaluations - start)
        if self._timed:
            # the clock stops the last bracket; an earlier one leaves half the time to the next
            rate = (ledger.evaluations - start) / max(1e-6, time.perf_counter() - started)
            left = 1 << 30 if final else int(rate * max(0.0, ledger.deadline - time.perf_counter()) / 2)
        if left > 0 and not ledger.exhausted:
            self._advance(alive[:1], left, ledger, pool)
        ranked = rank_arms(alive, len(alive))
        for s in ranked:
            self._close(study, trial_of[id(s)], s, optuna.trial.TrialState.COMPLETE)
        return ranked[0]

    @staticmethod
    def _paced(alive: list[ArmEvolution], ledger: Ledger, start: int, started: float) -> int:
        """Evaluations per arm for the next rung so the remaining rungs fit the time left."""
        rate = (ledger.evaluations - start) / max(1e-6, time.perf_counter() - started)
        left = max(0.0, ledger.deadline - time.perf_counter())
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

        if how == optuna.trial.TrialState.COMPLETE:
            study.tell(trial, state.value if math.isfinite(state.value) else 1e300)
        else:
            study.tell(trial, state=how)
