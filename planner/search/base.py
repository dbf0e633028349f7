"""What every search shares: its inputs, its answer, and the bookkeeping of best-so-far.

A search only proposes `Candidate`s; the simulator scores them (it is the single source of
truth), so every search keeps the same ledger: how many candidates it scored, the best one, and
the time at which the best improved. That ledger is the trace a report plots, and it is kept here
once instead of in each search.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hetprof.errors import InfeasibleError, SpecError

if TYPE_CHECKING:
    from hetprof.planner.candidate import Candidate
    from hetprof.planner.planning import PlanningContext
    from hetprof.planner.score import Score


# Objective values within this relative distance count as equal; the cheaper plan then wins.
TIE = 1e-9
# The clock reserve: a search looks at the clock between steps, so it stops early enough for one
# more step and its closing work to end within the budget (`Ledger.reserve_s`).
STEP_MARGIN = 2.0       # the reserve holds this many of the longest recent steps ...
STEP_DECAY = 0.99       # ... each step's weight shrinking by this at every later look (a cold start fades)
RESERVE_FLOOR_S = 0.05  # ... plus the search's closing work and this
RESERVE_SHARE = 0.25    # ... and at most this share of the budget
PROGRESS_EVERY_S = 0.25  # a progress callback hears of evaluations at most this often (improvements at once)


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where a running search stands, for a progress line: plain data, reported by the ledger."""

    evaluations: int
    best: float                 # objective value of the best plan so far (inf: none feasible yet)
    elapsed_s: float
    max_evals: int | None
    time_budget_s: float


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """Base of each search's own knobs: a frozen dataclass whose fields carry `help` metadata.

    Typed fields replace free-form option dicts so a misspelt or mistyped knob fails at once,
    naming itself, instead of being ignored. `from_dict` builds one from plain data (YAML, JSON).
    """

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            low = f.metadata.get("min")
            value = getattr(self, f.name)
            if low is not None and value is not None and value < low:
                raise SpecError(None, f.name, f"a value ≥ {low} ({f.metadata.get('help', '')})", value)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SearchConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in known:
                raise SpecError(None, key, f"one of {', '.join(sorted(known)) or '(none)'}", data[key])
        return cls(**data)

    @classmethod
    def describe(cls) -> dict[str, str]:
        """Each knob's help text, for documentation and `--help`-style listings."""
        return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}


def knob(default: Any, help: str, minimum: float | None = None) -> Any:  # noqa: A002 - the field's help text
    """A SearchConfig field with its help text and, optionally, the least value it accepts."""
    return dataclasses.field(default=default, metadata={"help": help, "min": minimum})


@dataclasses.dataclass
class SearchContext:
    """Inputs of one search.

    The first fields are the contract every search honours. The later ones are optional knobs:
    `max_evals` makes a search deterministic (a wall-clock budget depends on machine load, an
    evaluation budget does not), `storage`/`study_name` make an Optuna-driven search resumable,
    `warm_start` hands a search a known good candidate (the ILP starts from the heuristic's), and
    `config` holds the search's own knobs (its `Search.config_type`; None: that type's defaults).
    """

    planning: PlanningContext
    objective: str = "throughput"
    budget: float | None = None
    seed: int = 0
    time_budget_s: float = 60.0
    max_tp: int = 8
    max_pp: int = 4
    max_evals: int | None = None
    workers: int = 1
    storage: str | None = None
    study_name: str | None = None
    warm_start: Candidate | None = None
    config: SearchConfig | None = None
    progress: Callable[[Progress], None] | None = None

    def __post_init__(self) -> None:
        if self.objective not in ("throughput", "cost", "throughput-under-budget"):
            raise SpecError(None, "objective", "throughput, cost or throughput-under-budget", self.objective)
        if self.objective == "throughput-under-budget" and (self.budget is None or self.budget <= 0):
            raise SpecError(None, "budget", "a positive $/hour budget (objective throughput-under-budget)",
                            self.budget)
        if self.time_budget_s <= 0:
            raise SpecError(None, "time_budget_s", "positive seconds", self.time_budget_s)
        for name in ("max_tp", "max_pp", "workers"):
            if getattr(self, name) < 1:
                raise SpecError(None, name, "an integer ≥ 1", getattr(self, name))
        if self.max_evals is not None and self.max_evals < 1:
            raise SpecError(None, "max_evals", "an integer ≥ 1", self.max_evals)


@dataclasses.dataclass
class SearchResult:
    """A search's answer: the best candidate, its score, and how the best evolved over time."""

    search: str
    candidate: Candidate
    score: Score
    objective_value: float
    trace: list[dict[str, float]]
    seconds: float
    evaluations: int
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


class OverBudgetError(InfeasibleError):
    """Plans fit but none within the $/hour budget; `cheapest_per_hour` is the cheapest feasible one scored,
    so a caller running several searches can name one figure instead of repeating each search's."""

    def __init__(self, message: str, cheapest_per_hour: float) -> None:
        super().__init__(message)
        self.cheapest_per_hour = cheapest_per_hour


class Ledger:
    """Scores candidates through the simulator and remembers the best one and when it improved.

    Deadlines are checked here so every search stops the same way: `exhausted` turns true when
    either the evaluation budget or the wall-clock budget is spent.
    """

    def __init__(self, ctx: SearchContext, max_evals: int | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.ctx = ctx
        self.clock = clock
        self.started = clock()
        self.end = self.started + ctx.time_budget_s    # when the time budget is spent
        self.closing_s = 0.0    # what the search does after its last step (recording), as it measured it
        self._step_s = 0.0      # the longest recent step, decayed (`reserve_s`)
        self._looked: float | None = None   # when `exhausted` last said go on
        self.max_evals = max_evals if max_evals is not None else ctx.max_evals
        self.evaluations = 0
        self.best: Candidate | None = None
        self.best_score: Score | None = None
        self.best_value = math.inf
        self.trace: list[dict[str, float]] = []
        self._told = -math.inf
        self.cheapest_feasible = math.inf  # $/hour of the cheapest feasible plan scored: what a --budget refusal names

    def value(self, score: Score) -> float:
        if not score.feasible:
            return math.inf
        return float(self.ctx.planning.objective_value(score, self.ctx.objective, self.ctx.budget))

    def evaluate(self, candidate: Candidate) -> tuple[float, Score]:
        score = self.ctx.planning.evaluate(candidate)
        self.evaluations += 1
        value = self.value(score)
        self.offer(candidate, score, value)
        self.tell()
        return value, score

    def tell(self, now: bool = False) -> None:
        """Report progress to the context's callback: at once if `now`, else at most every
        PROGRESS_EVERY_S (the callback only displays; the search never depends on it)."""
        if self.ctx.progress is None:
            return
        t = self.clock()
        if now or t - self._told >= PROGRESS_EVERY_S:
            self._told = t
            self.ctx.progress(Progress(self.evaluations, self.best_value, t - self.started, self.max_evals,
                                       self.ctx.time_budget_s))

    def offer(self, candidate: Candidate, score: Score, value: float) -> bool:
        """Record a scored candidate; True if it is the new best (equal objective: the cheaper wins)."""
        if score.feasible:
            self.cheapest_feasible = min(self.cheapest_feasible, score.price_per_hour)
        better = self.best is None or value < self.best_value * (1 - TIE) or (
            value <= self.best_value * (1 + TIE) and self.best_score is not None
            and score.cost_per_iteration < self.best_score.cost_per_iteration * (1 - TIE))
        if better:
            improved = self.best is None or value < self.best_value
            self.best, self.best_score, self.best_value = candidate, score, value
            if improved:
                self.trace.append({"t": round(self.elapsed, 4), "best": value, "evals": self.evaluations})
                self.tell(now=True)
        return better

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    @property
    def reserve_s(self) -> float:
        """Seconds kept back from the budget: room for the step running when the clock is next
        looked at (STEP_MARGIN of the longest recent one: a step is the work a search does between
        two looks, one evaluation or one bracket's recording) and for the closing work. Measured,
        not fixed: a step over 256 GPUs on a loaded machine takes seconds, one over 64 milliseconds."""
        return min(RESERVE_SHARE * self.ctx.time_budget_s, RESERVE_FLOOR_S + STEP_MARGIN * self._step_s + self.closing_s)

    @property
    def deadline(self) -> float:
        """When the last step may start (the clock `exhausted` reads)."""
        return self.end - self.reserve_s

    def bounded(self, since: float | None = None) -> None:
        """The work since the last look kept to the deadline itself (a solve under its time limit,
        workers that read the clock): not a step the reserve must make room for. `since` (a clock
        reading) is where that work ended: what followed it (taking in the workers' results) did
        not read the deadline, so the next look counts it as a step."""
        self._looked = self.clock() if since is None else since

    @property
    def exhausted(self) -> bool:
        if self.max_evals is not None and self.evaluations >= self.max_evals:
            return True
        now = self.clock()
        if self._looked is not None:
            self._step_s = max(now - self._looked, self._step_s * STEP_DECAY)
        done = now >= self.deadline
        self._looked = None if done else now
        return done

    def result(self, search: str, **extra: Any) -> SearchResult:
        if self.best is None or self.best_score is None:
            raise InfeasibleError(f"search {search!r} evaluated no candidate (is the cluster empty?)")
        if not math.isfinite(self.best_value) and self.ctx.budget is not None and math.isfinite(self.cheapest_feasible):
            raise OverBudgetError(f"search {search!r} found no plan within --budget ${self.ctx.budget:.2f}/h: the "
                                  f"cheapest feasible plan it scored costs ${self.cheapest_feasible:.2f}/h "
                                  f"({self.evaluations:,} plans scored)", self.cheapest_feasible)
        if not math.isfinite(self.best_value):
            problems = "; ".join(self.best_score.violations[:3]) or "no feasible placement"
            raise InfeasibleError(f"search {search!r} found no feasible plan: {problems}")
        return SearchResult(search=search, candidate=self.best, score=self.best_score,
                            objective_value=self.best_value, trace=list(self.trace), seconds=self.elapsed,
                            evaluations=self.evaluations, extra=dict(extra))


class Search:
    """Base of all searches: construct with a context, `run()` returns a SearchResult."""

    name: str = ""
    config_type: type[SearchConfig] = SearchConfig

    def __init__(self, ctx: SearchContext) -> None:
        self.ctx = ctx
        if ctx.config is not None and not isinstance(ctx.config, self.config_type):
            raise SpecError(None, "config", f"a {self.config_type.__name__} for search {self.name!r}",
                            type(ctx.config).__name__)
        self.config = ctx.config if ctx.config is not None else self.config_type()

    def run(self) -> SearchResult:  # pragma: no cover - interface
        raise NotImplementedError
