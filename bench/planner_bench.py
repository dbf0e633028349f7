"""Planner searches side by side on the HetRL evaluation cluster (DESIGN §9).

For each network scenario × Qwen3 size × algorithm × mode, every search plans the same problem
with the same simulator and the table shows throughput ratios measured in this one run:
hetrl/verl, hetrl/streamrl, hetrl/arealhex (async rows), hetrl/ilp, hetrl's search time, the
evaluations each search used, and $ per iteration of hetrl and of the best baseline. Then hetrl's
search time on 128- and 256-GPU versions of the cluster.

    .venv/bin/python bench/planner_bench.py --quick            # a subset, small budgets
    .venv/bin/python bench/planner_bench.py --budget-s 60      # the full grid, 60 s per hetrl search
    .venv/bin/python bench/planner_bench.py --equal-evals 3000 # every search gets 3000 evaluations

With `--equal-evals N` every search runs under the same evaluation budget instead of a clock
(a baseline whose knob space is smaller uses fewer, and the table says how many).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hetprof.costmodels import get_cost_model
from hetprof.errors import InfeasibleError
from hetprof.planner.search import SearchContext, get_search
from hetprof.planner.search.ilp import ILPConfig
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ["single-region", "multi-region", "multi-country", "multi-continent"]
MODELS = ["4b", "8b", "14b"]
ALGORITHMS = ["ppo", "grpo"]
MODES = ["sync", "async"]


def load(scenario: str, model: str, algorithm: str, mode: str) -> tuple[ClusterSpec, WorkloadSpec]:
    cluster = ClusterSpec.load(ROOT / "examples" / "clusters" / f"hetrl-{scenario}.yaml")
    workload = WorkloadSpec.load(ROOT / "examples" / "workloads" / f"qwen3-{model}-{algorithm}-{mode}.yaml")
    return cluster, workload


def scaled(cluster: ClusterSpec, factor: int) -> ClusterSpec:
    """The same cluster with every host entry repeated `factor` times (same regions and links)."""
    data = cluster.to_dict()
    data["name"] = f"{cluster.name}-x{factor}"
    data["hosts"] = [{**h, "count": h.get("count", 1) * factor} for h in data["hosts"]]
    return ClusterSpec.from_dict(data)


def search(sim: Simulator, name: str, budget_s: float, seed: int, workers: int, evals: int | None = None, **kw):
    """One search; with `evals` it runs on that evaluation budget (the clock only as a safety cap)."""
    ctx = SearchContext(sim=sim, seed=seed, time_budget_s=budget_s if evals is None else 3600.0, workers=workers,
                        max_evals=evals, **kw)
    t0 = time.perf_counter()
    try:
        res = get_search(name)(ctx).run()
    except InfeasibleError as err:
        return None, time.perf_counter() - t0, str(err)
    return res, time.perf_counter() - t0, ""


def describe(sim: Simulator, cand) -> str:
    """A plan in one line: per group its tasks, GPUs by type and regions, and each task's layout."""
    parts = []
    for tasks, devs in zip(cand.groups, cand.group_devices, strict=True):
        kinds: dict[str, int] = {}
        for d in devs:
            kinds[sim.devices[d].type] = kinds.get(sim.devices[d].type, 0) + 1
        gpus = "+".join(f"{n}×{t}" for t, n in sorted(kinds.items()))
        where = ",".join(sorted({sim.devices[d].region for d in devs}))
        lays = " ".join(cand.layout(t).describe() for t in tasks)
        parts.append(f"{'+'.join(tasks)} on {gpus} @{where} [{lays}]")
    return " | ".join(parts)


def ratio(other, mine) -> float:
    """Throughput of hetrl over another search's: their iteration time over ours."""
    if other is None or mine is None:
        return math.nan
    return other.score.iteration_s / mine.score.iteration_s


def fmt(x: float) -> str:
    return "—" if x != x else f"{x:.2f}×"


def run_row(scenario, model, algorithm, mode, args, cm) -> dict:
    cluster, workload = load(scenario, model, algorithm, mode)
    sim = Simulator(cluster, workload, cm, seed=args.seed)
    row = {"scenario": scenario, "model": f"qwen3-{model}", "algorithm": algorithm, "mode": mode}
    het, het_s, err = search(sim, "hetrl", args.budget_s, args.seed, args.workers, args.equal_evals)
    row["hetrl_s"] = het_s
    row["hetrl_iter_s"] = het.score.iteration_s if het else math.nan
    row["hetrl_cost"] = het.score.cost_per_iteration if het else math.nan
    row["hetrl_evals"] = het.evaluations if het else 0
    row["hetrl_error"] = err
    row["hetrl_best_at_s"] = het.trace[-1]["t"] if het and het.trace else math.nan
    best = None
    for name in ("verl", "streamrl") + (("arealhex",) if mode == "async" else ()):
        res, secs, err = search(sim, name, args.budget_s, args.seed, 1, args.equal_evals)
        row[name] = ratio(res, het)
        row[f"{name}_s"] = secs
        row[f"{name}_evals"] = res.evaluations if res else 0
        row[f"{name}_chosen"] = (res.extra.get("chosen") or describe(sim, res.candidate)) if res else err
        row[f"{name}_error"] = err
        if res is not None and (best is None or res.score.iteration_s < best.score.iteration_s):
            best = res
    row["best_baseline"] = best.search if best else ""
    row["best_baseline_cost"] = best.score.cost_per_iteration if best else math.nan
    if het is not None and not args.no_ilp:
        res, secs, err = search(sim, "ilp", args.budget_s, args.seed, 1, warm_start=het.candidate,
                                config=ILPConfig(time_limit_s=args.ilp_limit_s, shortlist=args.shortlist))
        row["ilp"] = ratio(res, het)
        row["ilp_optimal"] = bool(res and res.extra.get("optimal"))
        row["ilp_gap"] = res.extra.get("gap") if res else None
        row["ilp_s"] = secs
        row["ilp_error"] = err
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a subset: two scenarios, Qwen3-8B, small budgets")
    ap.add_argument("--budget-s", type=float, default=None, help="hetrl time budget per row (default 60, quick 15)")
    ap.add_argument("--ilp-limit-s", type=float, default=None, help="CBC time limit per solve")
    ap.add_argument("--shortlist", type=int, default=6, help="ILP solutions re-ranked by the simulator")
    ap.add_argument("--scenarios", nargs="*", default=None)
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--algorithms", nargs="*", default=None, help="subset of ppo grpo (default both)")
    ap.add_argument("--modes", nargs="*", default=None, help="subset of sync async (default both)")
    ap.add_argument("--no-ilp", action="store_true")
    ap.add_argument("--no-scale", action="store_true", help="skip the 128/256-GPU timing")
    ap.add_argument("--scale-only", action="store_true", help="only the 128/256-GPU timing (no 64-GPU grid)")
    ap.add_argument("--scale-budget-s", type=float, default=None, help="hetrl budget at 256 GPUs (default 180)")
    ap.add_argument("--workers", type=int, default=1, help="hetrl evaluation processes")
    ap.add_argument("--equal-evals", type=int, default=None,
                    help="every search gets this evaluation budget instead of a time budget")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args()
    quick = args.quick
    args.budget_s = args.budget_s or (15.0 if quick else 60.0)
    args.ilp_limit_s = args.ilp_limit_s or (5.0 if quick else 20.0)
    scenarios = args.scenarios or (["single-region", "multi-region"] if quick else SCENARIOS)
    models = args.models or (["8b"] if quick else MODELS)
    console = Console(width=180)
    cm = get_cost_model("analytical")
    for name in ("hetrl", "ilp", "arealhex", "verl", "streamrl"):
        get_search(name)               # import every search (and Optuna, PuLP) before anything is timed
    import optuna  # noqa: F401
    import pulp  # noqa: F401

    rows = []
    for scenario in ([] if args.scale_only else scenarios):
        for model in models:
            for algorithm in args.algorithms or ALGORITHMS:
                for mode in args.modes or MODES:
                    row = run_row(scenario, model, algorithm, mode, args, cm)
                    rows.append(row)
                    console.print(f"[dim]{scenario} qwen3-{model} {algorithm} {mode}: hetrl "
                                  f"{row['hetrl_iter_s']:.1f} s/iter in {row['hetrl_s']:.0f} s[/dim]")

    if rows:
        summarise(rows, args, console)
    if not args.no_scale:
        scale_rows(rows, args, cm, console, quick)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str) + "\n")


def summarise(rows: list[dict], args: argparse.Namespace, console: Console) -> None:
    """The ratio table and the goals (issue 5) over the 64-GPU rows."""
    effort = f"every search {args.equal_evals} evaluations" if args.equal_evals else \
        f"hetrl budget {args.budget_s:.0f} s"
    table = Table(title=f"Throughput of hetrl relative to each search (HetRL 64-GPU cluster; {effort}; "
                        "same simulator, one run)")
    for col in ("scenario", "model", "alg", "mode", "hetrl s/iter", "÷verl", "÷streamrl", "÷arealhex",
                "÷ilp", "ilp opt", "hetrl $/iter", "best base $/iter", "evals hetrl/verl/streamrl/arealhex",
                "hetrl search s", "best at s"):
        table.add_column(col, justify="right" if col not in ("scenario", "model", "alg", "mode") else "left")
    for r in rows:
        evals = "/".join(str(r.get(f"{k}_evals", "—")) for k in ("hetrl", "verl", "streamrl", "arealhex"))
        table.add_row(r["scenario"], r["model"], r["algorithm"], r["mode"], f"{r['hetrl_iter_s']:.1f}",
                      fmt(r.get("verl", math.nan)), fmt(r.get("streamrl", math.nan)),
                      fmt(r.get("arealhex", math.nan)), fmt(r.get("ilp", math.nan)),
                      "yes" if r.get("ilp_optimal") else "no", f"${r['hetrl_cost']:.3f}",
                      f"${r['best_baseline_cost']:.3f}", evals, f"{r['hetrl_s']:.1f}", f"{r['hetrl_best_at_s']:.1f}")
    console.print(table)
    for r in rows:
        for name in ("verl", "streamrl", "arealhex"):
            if f"{name}_chosen" in r:
                console.print(f"{r['scenario']} {r['model']} {r['algorithm']} {r['mode']} · {name}: "
                              f"{r[f'{name}_evals']} evaluations · {r[f'{name}_chosen']}")

    verl = [r["verl"] for r in rows if r.get("verl") == r.get("verl")]
    best_base = []
    for r in rows:
        vals = [r[k] for k in ("verl", "streamrl", "arealhex") if k in r and r[k] == r[k]]
        if vals:
            best_base.append(min(vals))
    ilp_opt = [r["ilp"] for r in rows if r.get("ilp_optimal") and r.get("ilp") == r.get("ilp")]
    summary = Table(title="Goals")
    summary.add_column("measure")
    summary.add_column("measured", justify="right")
    summary.add_column("goal", justify="right")
    if verl:
        summary.add_row("mean hetrl/verl", f"{statistics.mean(verl):.2f}×", "reported, no target")
    if best_base:
        summary.add_row("min over rows of hetrl/best baseline", f"{min(best_base):.3f}×", "≥ 1.0×")
        summary.add_row("mean over rows of hetrl/best baseline", f"{statistics.mean(best_base):.3f}×", "—")
        summary.add_row("rows where hetrl ≥ best baseline", f"{sum(b >= 1 - 1e-9 for b in best_base)}/{len(best_base)}",
                        "all")
    if ilp_opt:
        summary.add_row("min hetrl/ilp where ILP proved optimal", f"{min(ilp_opt):.3f}×", "≥ 0.98×")
    summary.add_row("max hetrl search time, 64 GPUs", f"{max(r['hetrl_s'] for r in rows):.1f} s", "≤ 60 s")
    console.print(summary)


def scale_rows(rows: list[dict], args: argparse.Namespace, cm, console: Console, quick: bool) -> None:
    """hetrl's search time on 128 and 256 GPUs (the 64-GPU cluster's hosts repeated)."""
    scale = Table(title="hetrl search time on larger versions of the cluster (multi-region, qwen3-8b ppo sync)")
    for col in ("GPUs", "budget s", "search s", "best found at s", "evaluations", "s/iter", "÷verl"):
        scale.add_column(col, justify="right")
    top = args.scale_budget_s or (45.0 if quick else 180.0)
    for factor in (2, 4):
        cluster, workload = load("multi-region", "8b", "ppo", "sync")
        sim = Simulator(scaled(cluster, factor), workload, cm, seed=args.seed)
        budget = top * factor / 4
        het, secs, _ = search(sim, "hetrl", budget, args.seed, args.workers)
        base, _, _ = search(sim, "verl", budget, args.seed, 1)
        scale.add_row(str(64 * factor), f"{budget:.0f}", f"{secs:.1f}",
                      f"{het.trace[-1]['t']:.1f}" if het else "—", str(het.evaluations if het else 0),
                      f"{het.score.iteration_s:.1f}" if het else "—", fmt(ratio(base, het)))
        rows.append({"scale_gpus": 64 * factor, "hetrl_s": secs, "budget_s": budget,
                     "best_at_s": het.trace[-1]["t"] if het else None})
    console.print(scale)


if __name__ == "__main__":
    main()
