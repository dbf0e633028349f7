"""`hetprof plan`: search placements for an RL job on a cluster, report them, write the plan file.

Only click is imported at module level; the simulator, cost models and searches (Optuna, PuLP)
load inside the command so `hetprof --help` stays fast.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import click

from hetprof.cli import RegistryOption, catalog_option, db_option, db_path, existing_db_path
from hetprof.specs.cluster import ClusterSpec, check_plannable
from hetprof.specs.plan import GENERATION_BACKENDS

OBJECTIVES = ("throughput", "cost", "throughput-under-budget")
READS_FITTED_MODELS = ("fitted",)  # cost models that are nothing without a profile database's fitted rows


def _searches() -> list[str]:
    from hetprof.planner.search import available_searches

    return available_searches()


def _cost_models() -> list[str]:
    from hetprof.costmodels import available_cost_models

    return available_cost_models()


def _effort(budget_s: float | None, max_evals: int | None, workers: int, max_tp: int,
            max_pp: int) -> tuple[float, int]:
    """The time budget and worker count after defaults; a non-positive knob is refused by name."""
    from hetprof.errors import SpecError

    if budget_s is None:
        budget_s = 3600.0 if max_evals is not None else 60.0   # an evaluation budget paces itself
    # one process by default: forked workers start with cold layout caches and each rung ships
    # whole arm states, which costs more than a second process gains on a search's short rungs
    for name, value in (("--budget-s", budget_s), ("--max-tp", max_tp), ("--max-pp", max_pp),
                        ("--max-evals", 1 if max_evals is None else max_evals), ("--workers", workers)):
        if value <= 0:
            raise SpecError(name, "", "a positive number", value)
    return budget_s, workers


def _db_to_read(cost_model: str) -> Path:
    """Planning only reads: a database the cost model cannot do without must exist (exit 2); for the
    others a missing one means datasheet numbers."""
    return existing_db_path() if cost_model in READS_FITTED_MODELS else db_path()


def _no_plan(outcomes, options, what: str) -> str:
    """Why no search gave a plan. When every search found plans but none within --budget: the budget and
    the cheapest feasible $/hour any of them scored, once, rather than each search's own refusal."""
    from hetprof.planner import session

    prices = {o.search: o.extra["cheapest_per_hour"] for o in outcomes if "cheapest_per_hour" in o.extra}
    if len(outcomes) > 1 and len(prices) == len(outcomes):
        search = min(prices, key=prices.__getitem__)
        return (f"no plan for {what} within --budget ${options.budget:.2f}/h: the cheapest feasible plan scored "
                f"costs ${prices[search]:.2f}/h ({search}; {len(outcomes)} searches)")
    return f"no feasible plan for {what}: " + "; ".join(session.why_not(o, options) for o in outcomes)


def _print_effort(console, best) -> None:
    """How many plans the winning search scored, in how long, and what stopped it."""
    stopped = f", stopped by {best.extra['stopped_by']}" if best.extra.get("stopped_by") else ""
    console.print(f"{best.search} scored {best.extra.get('evaluations', 0):,} plans in {best.seconds:.1f} s{stopped}")


def _check_plannable(cluster: ClusterSpec, cluster_path: str, what_ifs: tuple[str, ...]) -> None:
    """The cluster and every what-if's within the planner's reach, before the first search starts."""
    from hetprof.planner import session

    check_plannable(cluster, cluster_path)
    for text in what_ifs:
        check_plannable(session.what_if_cluster(cluster, text), f"--what-if {text}")


def _warn_missing_rows(db, workload, cluster, options, evaluate_path: str | None, workload_path: str,
                       cluster_path: str) -> None:
    """One line on stderr per task the database has no rows of the job's shapes or engine for
    (planner/coverage.py), each with the `hetprof profile` command that measures them."""
    from hetprof.planner.coverage import coverage_warnings
    from hetprof.planner.engines import default_backend
    from hetprof.specs import Plan

    engine = options.backend or (Plan.load(evaluate_path).backend if evaluate_path else default_backend(cluster))
    for line in coverage_warnings(db, workload, cluster, engine, workload_path, cluster_path, str(db_path())):
        click.echo(f"warning: {line}", err=True)


def _target_backend(target: str | None, backend: str | None) -> str | None:
    """The generation engine to price: with --target, one the framework runs (vllm unless given)."""
    if target is None:
        return backend
    from hetprof.errors import SpecError
    from hetprof.specs.expressible import ENGINES

    if backend is not None and backend not in ENGINES:
        raise SpecError("--backend", "", f"one of {', '.join(ENGINES)} with --target {target}", backend)
    return backend or ENGINES[0]


def _print_unrestricted(console, cluster, workload, search: str, options, db, best, sim,
                        evaluate_path: str | None) -> None:
    """With --target (and a search): price the same search without it — what it would gain, and which
    framework features it needs."""
    if not options.target or evaluate_path:
        return
    import dataclasses

    from hetprof.planner import session
    from hetprof.planner.targets import needs

    free_options = dataclasses.replace(options, target=None)
    outcomes, free_sim = session.run_searches(cluster, workload, search, free_options, db)
    free = session.best(outcomes, free_sim, free_options)
    mine = sim.objective_value(best.score, options.objective, options.budget)
    if free is None or free_sim.objective_value(free.score, options.objective, options.budget) >= mine:
        console.print(f"unrestricted {search} plan: nothing better than the {options.target}-expressible plan")
        return
    gain = 1 - free.score.iteration_s / best.score.iteration_s
    features = needs(free_sim, options.target, free.candidate)
    console.print(f"unrestricted {search} plan: {free.score.iteration_s:.2f} s per iteration, {gain:.0%} faster "
                  f"than the {options.target}-expressible {best.score.iteration_s:.2f} s; {options.target} would "
                  f"need: {'; '.join(features) or 'nothing (it expresses it)'}")


@click.command("plan")
@click.option("--cluster", "-c", "cluster_path", required=True, type=click.Path(dir_okay=False),
              help="cluster spec (YAML/JSON)")
@click.option("--workload", "-w", "workload_path", required=True, type=click.Path(dir_okay=False),
              help="workload spec (YAML/JSON)")
@click.option("--search", "search", default="hetrl", show_default=True, cls=RegistryOption,
              names=lambda: [*_searches(), "all"], help="search by name, or `all` (every search, side by side)")
@click.option("--objective", type=click.Choice(OBJECTIVES), default="throughput", show_default=True,
              help="minimise seconds per iteration, $ per iteration, or seconds under a $/hour budget")
@click.option("--budget", type=float, default=None, help="$/hour cap for --objective throughput-under-budget")
@click.option("--budget-s", "budget_s", type=float, default=None,
              help="wall-clock seconds each search may take [default: 60; with --max-evals 3600, a safety cap]")
@click.option("--max-evals", type=int, default=None,
              help="evaluation budget per search: the same plan on any machine and under any load")
@click.option("--workers", type=int, default=1, show_default=True,
              help="processes evaluating placements at once (hetrl; the same plan with any number)")
@click.option("--seed", type=int, default=0, show_default=True, help="search and length-sampling seed")
@click.option("--search-seed", type=int, default=None,
              help="seed of the search's own choices only [default: --seed]; processes sharing a --storage "
                   "each take their own")
@click.option("--cost-model", "cost_model", default="analytical", show_default=True, cls=RegistryOption,
              names=lambda: _cost_models(), help="cost model by name")
@click.option("--max-tp", type=int, default=8, show_default=True, help="largest tensor-parallel degree")
@click.option("--max-pp", type=int, default=4, show_default=True, help="largest number of pipeline stages")
@click.option("--storage", default=None,
              help="Optuna storage URL (sqlite:///study.db; postgresql://… or mysql://… for many machines): "
                   "resumable, inspectable, and shared by every process given the same URL")
@click.option("--streaming/--no-streaming", default=None,
              help="price generation streaming its rollouts into the next stage (StreamRL pipelining) or "
                   "consumers waiting for all of it [default: as `hetprof run` does for --runnable plans (it "
                   "does not stream), streaming for --any-layout what-ifs]; the plan records which")
@click.option("--runnable/--any-layout", "runnable", default=True, show_default=True,
              help="plan only layouts `hetprof run` carries out (no pipeline stages for generation or critic "
                   "inference, one layer split for all replicas of a training task, TP dividing heads, KV heads "
                   "and FFN); --any-layout searches every layout the models allow (what-if studies)")
@click.option("--evaluate", "evaluate_path", type=click.Path(dir_okay=False), default=None,
              help="score an existing plan file instead of searching (e.g. with another cost model or cluster)")
@click.option("--what-if", "what_ifs", multiple=True,
              help='re-plan a changed cluster: "add 8xH100@us-east", "remove 4xL4", '
                   '"link us-east:eu-west 10ms 5Gbps" (";" joins edits; repeatable)')
@click.option("--backend", type=click.Choice(GENERATION_BACKENDS), default=None,
              help="generation engine to price and record in the plan: vllm (continuous batching, paged KV) or "
                   "hf (padded loop); default vllm on a cluster with GPUs, hf on a CPU-only cluster")
@click.option("--target", type=click.Choice(("verl", "areal")), default=None,
              help="plan only what this framework can express (`hetprof export --to` runs it there); the report "
                   "also prices the unrestricted plan and names the framework features it needs")
@click.option("--out", "-o", "out_path", type=click.Path(dir_okay=False), default=None, help="write the plan (JSON)")
@click.option("--gantt", "gantt_path", type=click.Path(dir_okay=False), default=None,
              help="write a Gantt chart (PNG) of one iteration")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="override a workload spec field, e.g. --set training.lr=1e-6 (repeatable; YAML values)")
@catalog_option
@db_option
def plan(cluster_path: str, workload_path: str, search: str, objective: str, budget: float | None,
         budget_s: float | None, max_evals: int | None, workers: int, seed: int, search_seed: int | None,
         cost_model: str, max_tp: int, max_pp: int, storage: str | None, streaming: bool | None, runnable: bool,
         evaluate_path: str | None, what_ifs: tuple[str, ...], backend: str | None, out_path: str | None,
         gantt_path: str | None, catalog_path: str | None, target: str | None, overrides: tuple[str, ...] = ()) -> None:
    """Find the fastest (or cheapest) placement of an RL job on a heterogeneous cluster.

    \b
    Examples:
      hetprof plan -c examples/clusters/hetrl-multi-region.yaml -w examples/workloads/qwen3-8b-ppo-sync.yaml
      hetprof plan -c C.yaml -w W.yaml --search all --budget-s 30
      hetprof plan -c C.yaml -w W.yaml --objective cost --out plan.json --gantt plan.png
      hetprof plan -c C.yaml -w W.yaml --max-evals 5000 --storage sqlite:///study.db --search-seed 1
      hetprof plan -c C.yaml -w W.yaml --backend hf --out plan.json
      hetprof plan -c C.yaml -w W.yaml --what-if "add 8xH100@us-east"
      hetprof plan -c C.yaml -w W.yaml --evaluate plan.json --cost-model fitted
      hetprof plan -c C.yaml -w W.yaml --catalog team-gpus.yaml
    """
    from rich.console import Console

    from hetprof.errors import InfeasibleError, SpecError
    from hetprof.planner import session
    from hetprof.planner.report import print_comparison, print_plan
    from hetprof.specs import ClusterSpec, WorkloadSpec
    from hetprof.specs.catalog import load_catalog

    console = Console() if sys.stdout.isatty() or os.environ.get("COLUMNS") else Console(width=120)  # pipes: full
    if objective == "throughput-under-budget" and (budget is None or budget <= 0):
        raise SpecError("--budget", "", "a positive $/hour budget with --objective throughput-under-budget", budget)
    budget_s, workers = _effort(budget_s, max_evals, workers, max_tp, max_pp)
    cluster = ClusterSpec.load(cluster_path, catalog=load_catalog(catalog_path) if catalog_path else None)
    _check_plannable(cluster, cluster_path, what_ifs)
    workload = WorkloadSpec.load(workload_path, overrides)
    options = session.PlanOptions(objective=objective, budget=budget, budget_s=budget_s, max_evals=max_evals,
                                  seed=seed, cost_model=cost_model, max_tp=max_tp, max_pp=max_pp, storage=storage,
                                  workers=workers, search_seed=search_seed,
                                  streaming=streaming, executable=runnable,
                                  backend=_target_backend(target, backend), target=target)
    with session.open_db(_db_to_read(cost_model)) as db:
        if db is not None and cost_model in READS_FITTED_MODELS:
            _warn_missing_rows(db, workload, cluster, options, evaluate_path, workload_path, cluster_path)
        if evaluate_path:
            outcome, sim = session.evaluate_plan_file(cluster, workload, evaluate_path, options, db)
            outcomes = [outcome]
        else:
            outcomes, sim = session.run_searches(cluster, workload, search, options, db, console)
        snapshot = db.snapshot_hash() if db is not None else ""
        best = session.best(outcomes, sim, options)
        if len(outcomes) > 1:
            print_comparison(console, outcomes, reference="verl", title=f"{workload.name} on {cluster.name}")
        if best is None:
            raise InfeasibleError(_no_plan(outcomes, options, f"{workload.name} on {cluster.name}"))
        print_plan(console, sim, best.candidate, best.score, title=f"{best.search} plan")
        if not evaluate_path:  # a search's effort; an evaluated plan file had none
            _print_effort(console, best)
        problems = session.independent_memory_check(sim, best, options, snapshot)
        for problem in problems:
            console.print(f"[yellow]independent memory check disagrees:[/yellow] {problem}")
        if not problems:
            console.print("independent memory check: every GPU holds what the plan puts on it")
        _print_unrestricted(console, cluster, workload, search, options, db, best, sim, evaluate_path)
        if out_path:
            session.write_plan(sim, best, options, snapshot, Path(out_path))
            console.print(f"plan written to {out_path}")
        if gantt_path:
            from hetprof.planner.gantt import save_gantt

            save_gantt(best.score, best.candidate, gantt_path,
                       title=f"{workload.name} on {cluster.name} ({best.search}): "
                             f"{best.score.iteration_s:.2f} s per iteration")
            console.print(f"Gantt chart written to {gantt_path}")
        for text in what_ifs:
            _print_what_if(console, text, cluster, workload, search, options, db, best, evaluate_path)


def _print_what_if(console, text: str, cluster, workload, search: str, options, db, best,
                   evaluate_path: str | None) -> None:
    """Re-plan the cluster changed by one --what-if edit and print it beside the plan before."""
    from hetprof.planner import session
    from hetprof.planner.report import print_comparison, print_plan

    changed = session.what_if_cluster(cluster, text)
    if evaluate_path:
        after, after_sim = session.evaluate_plan_file(changed, workload, evaluate_path, options, db)
        after_list = [after]
    else:
        after_list, after_sim = session.run_searches(changed, workload, search, options, db, console)
    after_best = session.best(after_list, after_sim, options)
    rows = [session.renamed(best, "before"), session.renamed(after_best, f"after: {text}")
            if after_best else session.failed(f"after: {text}", after_list, options)]
    print_comparison(console, rows, reference="before", title=f"what if {text}?")
    if after_best is not None and math.isfinite(after_best.score.iteration_s):
        print_plan(console, after_sim, after_best.candidate, after_best.score, title=f"plan after {text!r}")
