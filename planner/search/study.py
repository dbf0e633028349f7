"""HetRL's arm level as an Optuna study: arms as trials, halving rungs as intermediate values.

Each arm is a trial with parameters `grouping` and `n[type][group]`; cut arms are told PRUNED,
finalists COMPLETE, and each trial keeps its best candidate as a JSON user attribute (plain data,
never a pickle). The search runs on an in-memory study — an RDB round trip per trial call would
cost more than the simulator — and each finished bracket is copied to `--storage` in one batch,
so a later run (or another process sharing the storage) reads every recorded arm back.

Several processes or machines may share one storage and study name while they run (each best
with its own seed): every trial names the process that recorded it, and at each bracket's end a
process reads the others' new trials — their arms inform its TPE sampler and their best plans are
offered to its ledger — so the last process to finish returns the study's best plan.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from hetprof.errors import SpecError
from hetprof.planner.search.arms import Arm
from hetprof.planner.search.space import Grouping, decode_candidate, encode_candidate, grouping_label

if TYPE_CHECKING:
    import optuna

    from hetprof.planner.candidate import Candidate
    from hetprof.planner.search.evolution import ArmEvolution


def arm_params(arm: Arm) -> dict[str, Any]:
    params: dict[str, Any] = {"grouping": grouping_label(arm.grouping)}
    for g, c in enumerate(arm.counts):
        for t, n in zip(arm.types, c, strict=True):
            params[f"n[{t}][{g}]"] = n
    return params


def arm_distributions(groupings: Sequence[Grouping], types: Sequence[str], totals: Sequence[int]) -> dict:
    """The distributions `arm_from_trial` suggests from (every group index any grouping has)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    out: dict[str, Any] = {"grouping": CategoricalDistribution([grouping_label(g) for g in groupings])}
    for g in range(max(len(gr) for gr in groupings)):
        for t, n in zip(types, totals, strict=True):
            out[f"n[{t}][{g}]"] = IntDistribution(0, n)
    return out


class PendingTrial:
    """An arm the search named itself (enumerated, structured or from the MILP), not the sampler.

    Such an arm is recorded in the study as one finished trial when its bracket ends, instead of
    enqueue/ask/report/tell per arm: each ask re-reads every trial, so per-arm calls grow
    quadratically with the arms and would eat the search budget. It offers the trial calls used here.
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

        params = arm_params(self.arm)
        state = self.state or optuna.trial.TrialState.PRUNED
        return optuna.trial.create_trial(
            state=state, value=self.value if state == optuna.trial.TrialState.COMPLETE else None,
            params=params, distributions={k: distributions[k] for k in params}, user_attrs=self.attrs,
            intermediate_values=self.reports)


def arm_from_trial(trial: optuna.trial.Trial, groupings: Sequence[Grouping], types: Sequence[str],
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
            for g in range(k):
                raw[g][ti] = int(math.floor(scaled[g]))
    counts = tuple(tuple(r) for r in raw)
    if not all(sum(c) > 0 for c in counts):
        return None
    return Arm(grouping, counts, tuple(types))


def stored_candidates(study: optuna.Study, devices: Collection[str]) -> dict[str, list[Candidate]]:
    """Best candidates earlier runs stored in this study, by arm label (resuming a search); a stored
    trial that holds no candidate of this cluster is skipped (space.decode_candidate says why)."""
    out: dict[str, list[Candidate]] = {}
    for t in study.get_trials(deepcopy=False):
        text, label = t.user_attrs.get("candidate"), t.user_attrs.get("arm")
        if text and isinstance(label, str):
            try:
                out.setdefault(label, []).append(decode_candidate(text, devices))
            except ValueError:
                continue
    return out


SHARED_BEST = 8    # the best candidates of other processes' (or earlier runs') trials a search adopts


def trial_value(t: optuna.trial.FrozenTrial) -> float:
    """A finished arm's best value: its final value, or its last rung's when it was cut."""
    if t.value is not None:
        return float(t.value)
    if t.intermediate_values:
        return float(t.intermediate_values[max(t.intermediate_values)])
    return math.inf


def best_candidates(trials: Sequence[optuna.trial.FrozenTrial], devices: Collection[str],
                    k: int = SHARED_BEST) -> list[Candidate]:
    """The candidates of the k best trials that keep one of this cluster (plain JSON user attributes)."""
    out = []
    for t in sorted((t for t in trials if t.user_attrs.get("candidate")), key=trial_value)[:k]:
        try:
            out.append(decode_candidate(t.user_attrs["candidate"], devices))
        except ValueError:
            continue
    return out


def close_trial(study: optuna.Study, trial: Any, state: ArmEvolution, how: Any) -> None:
    """Record an arm's outcome on its trial: its best candidate, evaluations, and PRUNED/COMPLETE."""
    if trial is None:
        return
    if state.best_candidate is not None:
        trial.set_user_attr("candidate", encode_candidate(state.best_candidate))
    trial.set_user_attr("evaluations", state.evaluations)
    import optuna

    if isinstance(trial, PendingTrial):
        trial.close(how, state.value)
    elif how == optuna.trial.TrialState.COMPLETE:
        study.tell(trial, state.value if math.isfinite(state.value) else 1e300)
    else:
        study.tell(trial, state=how)


STORAGE_TRIES = 5


def _storage(url: str) -> Any:
    """An RDB storage; SQLite waits for a writer in another process instead of failing at once.

    Processes started together race to create a new database's schema; the loser's insert fails
    on a unique constraint, and a retry then finds the schema the winner made.
    """
    import optuna
    import sqlalchemy.exc

    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    for attempt in range(STORAGE_TRIES - 1):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError):
            time.sleep(0.2 * (attempt + 1))
    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)


def _open_stored(name: str, url: str) -> Any:
    """The study `name` on the storage at `url`; a URL that names no usable storage is a SpecError."""
    import optuna
    import sqlalchemy.exc

    try:
        return optuna.create_study(study_name=name, storage=_storage(url), direction="minimize", load_if_exists=True)
    except (ValueError, ImportError, sqlalchemy.exc.ArgumentError, sqlalchemy.exc.OperationalError) as exc:
        raise SpecError(None, "storage", "an Optuna RDB URL that can be opened, e.g. sqlite:///study.db "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0][:120]})", url) from exc


class ArmStudy:
    """The in-memory study a search runs on, mirrored batch-wise to an optional RDB storage."""

    def __init__(self, name: str, seed: int, storage: str | None, devices: Collection[str]) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.name = name
        self.devices = frozenset(devices)  # what a stored candidate may name (a shared study is someone else's)
        self.process = f"{socket.gethostname()}:{os.getpid()}"
        self.study = optuna.create_study(direction="minimize",
                                         sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=10))
        self.stored = None
        self.shared = 0                 # trials read from other processes while this one ran
        self.seen: set[int] = set()     # stored trial numbers already in this study
        if storage:
            self.stored = _open_stored(name, storage)
            finished = [t for t in self.stored.get_trials(deepcopy=False) if t.state.is_finished()]
            self.study.add_trials(finished)
            self.seen = {t.number for t in finished}
        self.saved = len(self.study.trials)

    def resumed(self) -> dict[str, list[Candidate]]:
        return stored_candidates(self.study, self.devices)

    def best_stored(self) -> list[Candidate]:
        """The best plans this study held when the search started (earlier runs, other processes)."""
        return best_candidates(self.study.get_trials(deepcopy=False), self.devices)

    def record(self, trials: Sequence[Any], distributions: dict) -> list[Candidate]:
        """Add a finished bracket's self-named arms to the study, copy what is new to the storage,
        and return the best candidates other processes stored meanwhile."""
        # an arm the bracket never reached (the budget ran out first) is no trial yet
        self.study.add_trials([t.frozen(distributions) for t in trials if isinstance(t, PendingTrial) and t.reports])
        if self.stored is None:
            return []
        fresh = [t for t in self.study.get_trials(deepcopy=False)[self.saved:] if t.state.is_finished()]
        self.stored.add_trials(fresh)
        self.saved = len(self.study.trials)
        return self.pull()

    def pull(self) -> list[Candidate]:
        """Finished trials other processes stored since the last look: into this study (TPE learns
        from them) and, the best few as candidates, to the caller."""
        if self.stored is None:
            return []
        new = [t for t in self.stored.get_trials(deepcopy=False) if t.number not in self.seen
               and t.state.is_finished() and t.user_attrs.get("process") != self.process]
        self.seen |= {t.number for t in self.stored.get_trials(deepcopy=False)
                      if t.user_attrs.get("process") == self.process}
        self.seen |= {t.number for t in new}
        if not new:
            return []
        self.study.add_trials(new)
        self.saved = len(self.study.trials)
        self.shared += len(new)
        return best_candidates(new, self.devices)
