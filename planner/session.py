"""One planning session: load the cost model and simulator, run searches, write and check the plan.

The CLI is a thin shell over these functions so that benchmarks and tests drive exactly the same
path a user does, without parsing terminal output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from hetprof.errors import HetprofError, InfeasibleError
from hetprof.planner.candidate import Candidate
from hetprof.planner.memcheck import check_plan
from hetprof.planner.report import Outcome
from hetprof.planner.simulator import Score, Simulator
from hetprof.planner.whatif import apply_what_if
from hetprof.specs import ClusterSpec, Group, Plan, Prediction, TaskPlacement, WorkloadSpec
from hetprof.specs.vocabulary import TaskKind


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    objective: str = "throughput"
    budget: float | None = None
    budget_s: float = 60.0
    max_evals: int | None = None
    seed: int = 0
    search_seed: int | None = None  # the search's own random choices (None: `seed`)
    cost_model: str = "analytical"
    max_tp: int = 8
    max_pp: int = 4
    storage: str | None = None
    workers: int = 1           # processes evaluating placements at once (hetrl)
    streaming: bool | None = None  # None: as `hetprof run` carries it out (runnable), else streaming
    executable: bool = True  # only layouts `hetprof run` carries out (hetprof/specs/executable.py)
    backend: str | None = None  # generation engine priced; None: simulator.default_backend of the cluster
    target: str | None = None  # plan only what this framework expresses (planner/targets.py)


@contextlib.contextmanager
def open_db(path: Path | None) -> Iterator[object | None]:
    """The profile database read-only if it exists; planning never creates one."""
    if path is None or not Path(path).exists():
        yield None
        return
    from hetprof.profiles import ProfileDB

    with ProfileDB(path, readonly=True) as db:
        yield db


def make_simulator(cluster: ClusterSpec, workload: WorkloadSpec, options: PlanOptions, db=None) -> Simulator:
    """Cost model + simulator; raises InfeasibleError early for missing links or models that fit nowhere."""
    from hetprof.costmodels import get_cost_model

    cm = get_cost_model(options.cost_model, db=db, catalog=cluster.catalog)
    kind = Simulator
    if options.target:
        from hetprof.planner.targets import TargetedSimulator as kind
    sim = kind(cluster, workload, cm, seed=options.seed, db=db, streaming=options.streaming,
               executable=options.executable, backend=options.backend)
    if options.target:
        sim.target = options.target
    sim.check_fits(options.max_tp, options.max_pp)
    return sim


EXHAUSTIVE_MAX_GPUS = 8  # "all" includes the exhaustive search only where it can finish


def search_list(name: str, gpus: int = 0) -> list[str]:
    from hetprof.planner.search import available_searches

    if name != "all":
        return [name]
    return [n for n in available_searches() if n != "exhaustive" or gpus <= EXHAUSTIVE_MAX_GPUS]


def run_search(sim: Simulator, name: str, options: PlanOptions,
               progress: Callable[[Any], None] | None = None) -> Outcome:
    """One search on `sim`; `progress` (a callable taking search.Progress) hears how it goes."""
    from hetprof.planner.search import SearchContext, get_search

    cls = get_search(name)
    # the study is named by the problem (hetrl's default), not the search's seed: runs with other
    # search seeds on one --storage join the same search
    seed = options.seed if options.search_seed is None else options.search_seed
    ctx = SearchContext(planning=sim.planning, objective=options.objective, budget=options.budget, seed=seed,
                        time_budget_s=options.budget_s, max_tp=options.max_tp, max_pp=options.max_pp,
                        max_evals=options.max_evals, storage=options.storage, workers=options.workers,
                        progress=progress)
    res = cls(ctx).run()
    candidate = res.candidate
    if options.target and candidate is not None:  # what was scored: the projected candidate
        from hetprof.planner.targets import project

        candidate = project(candidate, sim.workload.sequences_per_step)
    return Outcome(name, candidate, res.score, res.seconds, trace=tuple(res.trace),
                   extra={"evaluations": res.evaluations, **res.extra})


def run_searches(cluster: ClusterSpec, workload: WorkloadSpec, search: str, options: PlanOptions, db=None,
                 console=None) -> tuple[list[Outcome], Simulator]:
    """Each requested search on one simulator. With "all", a search that fails becomes a row saying why."""
    sim = make_simulator(cluster, workload, options, db)
    names = search_list(search, len(sim.devices))
    if options.target:  # the framework's own tuning as a floor: --target never plans slower than it
        from hetprof.planner.targets import baseline_searches

        names += [n for n in baseline_searches(options.target) if n not in names]
    outcomes = []
    for name in names:
        started = time.perf_counter()
        status = console.status(f"searching with {name} …") if console is not None else None
        try:
            with status if status is not None else contextlib.nullcontext():
                outcomes.append(run_search(sim, name, options, progress_line(status, name, options)))
        except HetprofError as exc:
            if len(names) == 1:
                raise
            over = getattr(exc, "cheapest_per_hour", None)  # an OverBudgetError: the figure the summary names
            outcomes.append(Outcome(name, None, None, time.perf_counter() - started, error=str(exc),
                                    extra={} if over is None else {"cheapest_per_hour": over}))
    return outcomes, sim


def progress_line(status: Any, name: str, options: PlanOptions) -> Callable[[Any], None] | None:
    """A callback that keeps a rich status line at best-so-far, evaluations and elapsed time."""
    if status is None:
        return None
    unit = "$/iteration" if options.objective == "cost" else "s/iteration"

    def show(p) -> None:
        best = f"{p.best:.4g} {unit}" if math.isfinite(p.best) else "no feasible plan yet"
        evals = f"{p.evaluations:,}" + (f"/{p.max_evals:,}" if p.max_evals else "")
        status.update(f"{name}: best {best} · {evals} evaluations · {p.elapsed_s:.1f} s of "
                      f"{p.time_budget_s:.0f} s")
    return show


def evaluate_plan_file(cluster: ClusterSpec, workload: WorkloadSpec, path: str | Path, options: PlanOptions,
                       db=None) -> tuple[Outcome, Simulator]:
    """Score an existing plan on this cluster and workload (devices must still exist)."""
    plan = Plan.load(path)
    candidate = Candidate.of_plan(plan)
    if options.backend is None:  # re-score with the engine the plan was made for
        options = dataclasses.replace(options, backend=plan.backend)
    sim = make_simulator(cluster, workload, options, db)
    return Outcome(plan.search or "plan file", candidate, sim.evaluate(candidate)), sim


def best(outcomes: Sequence[Outcome], sim: Simulator, options: PlanOptions) -> Outcome | None:
    """The outcome with the lowest objective value among feasible ones."""
    scored = [(sim.objective_value(o.score, options.objective, options.budget), i, o)
              for i, o in enumerate(outcomes) if o.score is not None and o.score.feasible]
    scored = [x for x in scored if math.isfinite(x[0])]
    return min(scored)[2] if scored else None


def build_plan(sim: Simulator, candidate: Candidate, score: Score | None = None, *, search: str = "",
               seed: int = 0, objective: str = "throughput", trace: Iterable[Mapping[str, Any]] = (),
               profile_snapshot: str = "", evaluations: int | None = None) -> Plan:
    """The plan file of a feasible candidate: its layouts as they are (followers beside their leaders),
    groups named group0, group1, …, each task's predicted seconds and peak memory, and where the plan
    came from. An infeasible candidate raises InfeasibleError with its reasons."""
    score = score if score is not None else sim.evaluate(candidate)
    if not score.feasible:
        reasons = "; ".join(score.violations[:5]) or "no finite iteration time"
        raise InfeasibleError(f"the {search or 'given'} plan is infeasible: {reasons}")
    layouts, grouped = sim.with_followers(candidate)
    group_of = {t: i for i, g in enumerate(grouped) for t in g}
    groups = [Group(f"group{i}", list(tasks), list(devs), offload=i in candidate.offload)
              for i, (tasks, devs) in enumerate(zip(grouped, candidate.group_devices, strict=True))]
    placements = []
    for t in sim.graph.tasks:
        lay = layouts[t]
        peak = max(sim.task_eval(lay).memory[d].total for d in lay.devices())
        # a follower runs on its leader's (sharded) model but shards no state of its own: the plan says none
        own = lay if sim.graph.kind_of(t) == TaskKind.TRAINING else dataclasses.replace(lay, sharding="none")
        seconds = score.task_seconds.get(t)
        placements.append(TaskPlacement(own, f"group{group_of[t]}", float(seconds) if seconds is not None and
                                        math.isfinite(seconds) else None, float(peak)))
    headroom = {d: float(sim.capacity[d] - score.memory_peak.get(d, 0.0)) for d in candidate.devices()}
    prediction = Prediction(iteration_s=score.iteration_s, breakdown=dict(score.breakdown),
                            bottleneck=score.bottleneck, memory_headroom=headroom,
                            cost_per_iteration=score.cost_per_iteration, throughput=score.throughput)
    plan = Plan(cluster=sim.cluster.to_dict(), workload=sim.workload.to_dict(), groups=groups, tasks=placements,
                predicted=prediction, backend=sim.backend, streaming=sim.streaming,
                cost_model=getattr(sim.cost_model, "name", "") or type(sim.cost_model).__name__,
                profile_snapshot=profile_snapshot, search=search, seed=seed, objective=objective,
                search_trace=[dict(x) for x in trace if math.isfinite(x.get("best", 0.0))],
                search_evaluations=evaluations)  # JSON has no Infinity: a point before any feasible plan is dropped
    plan.validate()
    return plan


def plan_of(sim: Simulator, outcome: Outcome, options: PlanOptions, snapshot: str = "") -> Plan:
    return build_plan(sim, outcome.candidate, outcome.score, search=outcome.search, seed=options.seed,
                   objective=options.objective, trace=outcome.trace, profile_snapshot=snapshot,
                   evaluations=outcome.extra.get("evaluations"))


def write_plan(sim: Simulator, outcome: Outcome, options: PlanOptions, snapshot: str, path: Path) -> Plan:
    plan = plan_of(sim, outcome, options, snapshot)
    path.parent.mkdir(parents=True, exist_ok=True)
    plan.save(path)
    return plan


def independent_memory_check(sim: Simulator, outcome: Outcome, options: PlanOptions, snapshot: str = "") -> list[str]:
    return check_plan(plan_of(sim, outcome, options, snapshot))


def what_if_cluster(cluster: ClusterSpec, text: str) -> ClusterSpec:
    return apply_what_if(cluster, text)


def renamed(outcome: Outcome, name: str) -> Outcome:
    return dataclasses.replace(outcome, search=name)


def why_not(outcome: Outcome, options: PlanOptions) -> str:
    """Why an outcome is not an acceptable plan, in one phrase."""
    if outcome.error:
        return f"{outcome.search}: {outcome.error}"
    if outcome.score is None:
        return f"{outcome.search}: no plan"
    if not outcome.score.feasible:
        return f"{outcome.search}: " + "; ".join(outcome.score.violations[:2])
    if options.budget is not None and outcome.score.price_per_hour > options.budget:
        return (f"{outcome.search}: its GPUs cost ${outcome.score.price_per_hour:.2f}/h, over the "
                f"${options.budget:.2f}/h budget")
    return f"{outcome.search}: no finite objective"


def failed(name: str, outcomes: Sequence[Outcome], options: PlanOptions | None = None) -> Outcome:
    reasons = "; ".join(why_not(o, options or PlanOptions()) for o in outcomes)
    return Outcome(name, None, None, error=reasons or "no feasible plan")
