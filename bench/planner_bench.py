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

    .venv/bin/python bench/planner_bench.py --subset12 --seeds 3 --equal-evals 2000   # median of 3 seeds
    .venv/bin/python bench/planner_bench.py --cost-check --equal-evals 800 --no-ilp    # $/iter vs sub-pools
    .venv/bin/python bench/planner_bench.py --subset12 --seeds 3 --anytime 10 60 --load  # anytime quality

The mixture-of-experts grid (Qwen3-30B-A3B GRPO, sync and async, on every scenario; expert
parallelism searched by hetrl and configured by each baseline as its users do):

    .venv/bin/python bench/planner_bench.py --models 30b-a3b --algorithms grpo --equal-evals 1000 --no-ilp --no-scale
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

from planner_checks import ALGORITHMS, MODELS, MODES, SCENARIOS, cost_check, cpu_load, median_of, subset12
from rich.console import Console
from rich.table import Table

from hetprof.costmodels import get_cost_model
from hetprof.errors import InfeasibleError
from hetprof.planner.search import SearchContext, get_search
from hetprof.planner.search.ilp import ILPConfig
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec

ROOT = Path(__file__).resolve().parent.parent


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
    ctx = SearchContext(planning=sim.planning, seed=seed, time_budget_s=budget_s if evals is None else 3600.0, workers=workers,
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


def run_row(scenario, model, algorithm, mode, args, cm, seed: int | None = None) -> dict:
    """One grid row: hetrl and every fair baseline on the same simulator, optionally the ILP and
    the sub-pool cost check."""
    seed = args.seed if seed is None else seed
    cluster, workload = load(scenario, model, algorithm, mode)
    sim = Simulator(cluster, workload, cm, seed=seed)
    row = {"scenario": scenario, "model": f"qwen3-{model}", "algorithm": algorithm, "mode": mode, "seed": seed}
    het, het_s, err = search(sim, "hetrl", args.budget_s, seed, args.workers, args.equal_evals)
    row["hetrl_s"] = het_s
    row["hetrl_iter_s"] = het.score.iteration_s if het else math.nan
    row["hetrl_cost"] = het.score.cost_per_iteration if het else math.nan
    row["hetrl_evals"] = het.evaluations if het else 0
    row["hetrl_error"] = err
    row["hetrl_best_at_s"] = het.trace[-1]["t"] if het and het.trace else math.nan
    best = None
    for name in ("verl", "streamrl") + (("arealhex",) if mode == "async" else ()):
        res, secs, err = search(sim, name, args.budget_s, seed, 1, args.equal_evals)
        row[name] = ratio(res, het)
        row[f"{name}_s"] = secs
        row[f"{name}_evals"] = res.evaluations if res else 0
        row[f"{name}_chosen"] = (res.extra.get("chosen") or describe(sim, res.candidate)) if res else err
        row[f"{name}_error"] = err
        if res is not None and (best is None or res.score.iteration_s < best.score.iteration_s):
            best = res
    row["best_baseline"] = best.search if best else ""
    row["best_baseline_cost"] = best.score.cost_per_iteration if best else math.nan
    row["best"] = ratio(best, het)
    if het is not None and not args.no_ilp:
        res, secs, err = search(sim, "ilp", args.budget_s, seed, 1, warm_start=het.candidate,
                                config=ILPConfig(time_limit_s=args.ilp_limit_s, shortlist=args.shortlist))
        row["ilp"] = ratio(res, het)
        row["ilp_optimal"] = bool(res and res.extra.get("optimal"))
        row["ilp_gap"] = res.extra.get("gap") if res else None
        row["ilp_s"] = secs
        row["ilp_error"] = err
    if args.cost_check:
        row.update(cost_check(sim, lambda s: search(s, "hetrl", args.budget_s, seed, args.workers,
                                                    args.equal_evals, objective="cost")[0]))
    return row


def run_seeds(key: tuple[str, str, str, str], args, cm) -> dict:
    """A row over `args.seeds` seeds: the first seed's row, with the medians over all of them."""
    runs = [run_row(*key, args, cm, seed=args.seed + k) for k in range(args.seeds)]
    row = runs[0]
    if len(runs) > 1:
        row["best_median"] = median_of([r["best"] for r in runs])
        row["hetrl_iter_median"] = median_of([r["hetrl_iter_s"] for r in runs])
    return row


def grid(args) -> list[tuple[str, str, str, str]]:
    """The rows asked for: the 12-row subset, or the grid filtered by the scenario/model/... options."""
    if args.subset12:
        return subset12()
    quick = args.quick
    scenarios = args.scenarios or (["single-region", "multi-region"] if quick else SCENARIOS)
    models = args.models or (["8b"] if quick else MODELS)
    return [(s, m, a, o) for s in scenarios for m in models for a in args.algorithms or ALGORITHMS
            for o in args.modes or MODES]


def options() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a subset: two scenarios, Qwen3-8B, small budgets")
    ap.add_argument("--budget-s", type=float, default=None, help="hetrl time budget per row (default 60, quick 15)")
    ap.add_argument("--ilp-limit-s", type=float, default=None, help="CBC time limit per solve")
    ap.add_argument("--shortlist", type=int, default=6, help="ILP solutions re-ranked by the simulator")
    ap.add_argument("--scenarios", nargs="*", default=None)
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--algorithms", nargs="*", default=None, help="subset of ppo grpo (default both)")
    ap.add_argument("--modes", nargs="*", default=None, help="subset of sync async (default both)")
    ap.add_argument("--subset12", action="store_true",
                    help="the 12-row subset (every scenario × model, algorithms and modes mixed)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N rows of the selection")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per row; the table adds their median")
    ap.add_argument("--cost-check", action="store_true",
                    help="hetrl's $/iteration must not exceed its own result on any one region or GPU type")
    ap.add_argument("--anytime", nargs=2, type=float, default=None, metavar=("SHORT_S", "LONG_S"),
                    help="hetrl at SHORT_S against LONG_S seconds on the selected rows (e.g. 10 60)")
    ap.add_argument("--load", action="store_true", help="the anytime check again beside a CPU-heavy process")
    ap.add_argument("--no-ilp", action="store_true")
    ap.add_argument("--no-scale", action="store_true", help="skip the 128/256-GPU timing")
    ap.add_argument("--scale-only", action="store_true", help="only the 128/256-GPU timing (no 64-GPU grid)")
    ap.add_argument("--scale-budget-s", type=float, default=None, help="hetrl budget at 256 GPUs (default 180)")
    ap.add_argument("--workers", type=int, default=1, help="hetrl evaluation processes")
    ap.add_argument("--equal-evals", type=int, default=None,
                    help="every search gets this evaluation budget instead of a time budget")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    return ap


def main() -> None:
    args = options().parse_args()
    quick = args.quick
    args.budget_s = args.budget_s or (15.0 if quick else 60.0)
    args.ilp_limit_s = args.ilp_limit_s or (5.0 if quick else 20.0)
    console = Console(width=180)
    cm = get_cost_model("analytical")
    for name in ("hetrl", "ilp", "arealhex", "verl", "streamrl"):
        get_search(name)               # import every search (and Optuna, PuLP) before anything is timed
    import optuna  # noqa: F401
    import pulp  # noqa: F401

    keys = grid(args)[:args.limit]
    rows = []
    if args.anytime:
        rows = anytime(keys, args, cm, console)
        keys = []
    for key in ([] if args.scale_only else keys):
        row = run_seeds(key, args, cm)
        rows.append(row)
        console.print(f"[dim]{' '.join(key)}: hetrl {row['hetrl_iter_s']:.1f} s/iter in {row['hetrl_s']:.0f} s, "
                      f"{row['hetrl_evals']} evaluations[/dim]")

    if rows and not args.anytime:
        summarise(rows, args, console)
    if not args.no_scale and not args.anytime:
        scale_rows(rows, args, cm, console, quick)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str) + "\n")


def anytime(keys: list[tuple[str, str, str, str]], args, cm, console: Console) -> list[dict]:
    """hetrl's iteration time at a short and a long clock budget, median over seeds, per row; with
    `--load` the short budget again beside a CPU-heavy process, against the quiet long result (the
    stricter test: load may only cost evaluations). The evaluations columns split the ratio in two:
    the search's work follows evaluations, so quality at the short budget is best(N) at the N its
    clock buys; "evals to 5%" is the N at which the long runs first came within 5% of their end."""
    short, long = args.anytime
    table = Table(title=f"Anytime: hetrl at {short:.0f} s vs {long:.0f} s (median of {args.seeds} seeds)")
    for col in ("row", "load", f"s/iter at {short:.0f} s", f"s/iter at {long:.0f} s", "ratio", "goal ≤ 1.05",
                f"evals at {short:.0f} s", f"evals at {long:.0f} s", "evals to 5%", "search s (short/long)"):
        table.add_column(col, justify="left" if col in ("row", "load") else "right")
    quiet: dict[tuple, dict] = {}
    out = []
    for loaded in (False, True) if args.load else (False,):
        for key in keys:
            budgets = (short,) if loaded else (short, long)
            with cpu_load(loaded):
                got = {b: [anytime_run(key, args, cm, b, args.seed + k) for k in range(args.seeds)] for b in budgets}
            if not loaded:
                quiet[key] = got[long]
            row = anytime_row(key, loaded, got[short], quiet[key])
            out.append(row)
            table.add_row(row["row"], "CPU-heavy process" if loaded else "—", f"{row['short']:.2f}",
                          f"{row['long']:.2f}", f"{row['ratio']:.3f}", "yes" if row["ratio"] <= 1.05 else "no",
                          f"{row['evals_short']:.0f}", f"{row['evals_long']:.0f}", f"{row['evals_to_5pct']:.0f}",
                          f"{row['seconds_short']:.1f}/{row['seconds_long']:.1f}")
    console.print(table)
    for loaded in (False, True) if args.load else (False,):
        ratios = [r["ratio"] for r in out if r["load"] == loaded]
        console.print(f"anytime {'beside a CPU-heavy process' if loaded else 'quiet'}: "
                      f"{sum(r <= 1.05 for r in ratios)}/{len(ratios)} rows within 5%, median ratio "
                      f"{statistics.median(ratios):.3f}, worst {max(ratios):.3f}")
    return out


def anytime_run(key: tuple[str, str, str, str], args, cm, budget_s: float, seed: int):
    """One clock-budget hetrl search on a fresh simulator (no cache carried between runs)."""
    cluster, workload = load(*key)
    fresh = Simulator(cluster, workload, cm, seed=args.seed)
    res, secs, _ = search(fresh, "hetrl", budget_s, seed, args.workers)
    return res, secs


def anytime_row(key: tuple[str, str, str, str], loaded: bool, short: list, long: list) -> dict:
    """Medians over seeds of the short and the long runs ((result, seconds) pairs) of one row."""
    def iters(runs: list) -> float:
        return median_of([r.score.iteration_s if r else math.inf for r, _ in runs])

    def to_5pct(res) -> float:
        if res is None:
            return math.inf
        return next(t["evals"] for t in res.trace if t["best"] <= res.objective_value * 1.05)

    a, b = iters(short), iters(long)
    return {"row": " ".join(key), "load": loaded, "short": a, "long": b,
            "ratio": a / b if math.isfinite(b) else math.nan,
            "evals_short": statistics.median(r.evaluations if r else 0 for r, _ in short),
            "evals_long": statistics.median(r.evaluations if r else 0 for r, _ in long),
            "evals_to_5pct": statistics.median(to_5pct(r) for r, _ in long),
            "seconds_short": max(s for _, s in short), "seconds_long": max(s for _, s in long)}


def summarise(rows: list[dict], args: argparse.Namespace, console: Console) -> None:
    """The ratio table and the goals (issue 5) over the 64-GPU rows."""
    effort = f"every search {args.equal_evals} evaluations" if args.equal_evals else \
        f"hetrl budget {args.budget_s:.0f} s"
    table = Table(title=f"Throughput of hetrl relative to each search (HetRL 64-GPU cluster; {effort}; "
                        "same simulator, one run)")
    median = (f"÷best med{args.seeds}",) if args.seeds > 1 else ()
    for col in ("scenario", "model", "alg", "mode", "hetrl s/iter", "÷best", *median, "÷verl",
                "÷streamrl", "÷arealhex", "÷ilp", "ilp opt", "hetrl $/iter", "best base $/iter",
                "evals hetrl/verl/streamrl/arealhex", "hetrl search s", "best at s"):
        table.add_column(col, justify="right" if col not in ("scenario", "model", "alg", "mode") else "left")
    for r in rows:
        evals = "/".join(str(r.get(f"{k}_evals", "—")) for k in ("hetrl", "verl", "streamrl", "arealhex"))
        table.add_row(r["scenario"], r["model"], r["algorithm"], r["mode"], f"{r['hetrl_iter_s']:.1f}",
                      fmt(r.get("best", math.nan)), *(fmt(r.get("best_median", math.nan)) for _ in median),
                      fmt(r.get("verl", math.nan)), fmt(r.get("streamrl", math.nan)),
                      fmt(r.get("arealhex", math.nan)), fmt(r.get("ilp", math.nan)),
                      "yes" if r.get("ilp_optimal") else "no", f"${r['hetrl_cost']:.3f}",
                      f"${r['best_baseline_cost']:.3f}", evals, f"{r['hetrl_s']:.1f}", f"{r['hetrl_best_at_s']:.1f}")
    console.print(table)
    for r in rows:
        if "cost_ratio" in r:
            subs = ", ".join(f"{k} ${v:.3f}" for k, v in r["cost_subs"].items())
            console.print(f"cost check {r['scenario']} {r['model']} {r['algorithm']} {r['mode']}: hetrl "
                          f"${r['cost_full']:.3f}/iteration vs its own on {subs} → "
                          f"{'ok' if r['cost_ok'] else 'WORSE than ' + r['cost_cheapest_sub']} "
                          f"({r['cost_ratio']:.3f}×)")
    for r in rows:
        for name in ("verl", "streamrl", "arealhex"):
            if f"{name}_chosen" in r:
                console.print(f"{r['scenario']} {r['model']} {r['algorithm']} {r['mode']} · {name}: "
                              f"{r[f'{name}_evals']} evaluations · {r[f'{name}_chosen']}")

    verl = [r["verl"] for r in rows if r.get("verl") == r.get("verl")]
    best_base = [r["best"] for r in rows if r.get("best") == r.get("best")]
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
    medians = [r["best_median"] for r in rows if "best_median" in r]
    if medians:
        summary.add_row(f"min over rows of the median of {args.seeds} seeds' hetrl/best baseline",
                        f"{min(medians):.3f}×", "≥ 1.0×")
    costs = [r["cost_ratio"] for r in rows if "cost_ratio" in r]
    if costs:
        summary.add_row("rows where hetrl's $/iter ≤ its own on any one region or GPU type",
                        f"{sum(r['cost_ok'] for r in rows if 'cost_ok' in r)}/{len(costs)} (worst "
                        f"{max(costs):.3f}×)", "all")
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
