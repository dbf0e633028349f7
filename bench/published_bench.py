"""The simulator against published RL step times: does a plan's predicted iteration hold up?

Every case under bench/published/ is a public framework's measured RL step (NeMo RL, verl, AReaL:
cluster, model, batch, lengths, algorithm and the GPU layout the run used) priced by the simulator
at that same layout, with one set of catalog constants for every case. Per case it prints the
predicted and published seconds and their ratio (per phase where the source breaks the step
down), then how many cases land within 0.80–1.25, the median |ln(predicted/published)|, and the
leave-one-source-out figure: the constants fitted without a source, scored on that source. Cases
whose files use what hetprof does not express yet (their `needs`) are listed apart with the reason.

    .venv/bin/python bench/published_bench.py                    # the table, the summary, LOSO
    .venv/bin/python bench/published_bench.py --json out.json    # also {"cases": [...]} for scripts
    .venv/bin/python bench/published_bench.py --calibrate        # fit the constants, print them and LOSO
    .venv/bin/python bench/published_bench.py --plans DIR        # each case's pinned layout as a plan file
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

import published_calibration as cal
from published_cases import CASES_DIR, Case, Priced, Skipped, scan_cases, simulator
from rich.console import Console
from rich.table import Table

from hetprof.errors import InfeasibleError
from hetprof.planner.pinned import pinned_candidate
from hetprof.planner.session import build_plan

BAND = (0.80, 1.25)
console = Console(width=120)  # wide enough for the case titles in a log file


def _ratio_text(ratio: float) -> str:
    if not math.isfinite(ratio):
        return "[red]—[/red]"
    colour = "green" if BAND[0] <= ratio <= BAND[1] else "yellow" if 0.67 <= ratio <= 1.5 else "red"
    return f"[{colour}]{ratio:.2f}[/{colour}]"


def case_table(p: Priced) -> Table:
    """One case: the step and each published phase, predicted vs published."""
    case = p.case
    table = Table(title=f"{case.name}  [dim]({case.source.id}: {case.source.where})[/dim]", title_justify="left")
    for col in ("", "predicted s", "published s", "pred/pub"):
        table.add_column(col, justify="left" if not col else "right")
    if not p.feasible:
        table.add_row("step", "[red]INFEASIBLE[/red]", f"{case.published_s:.1f}", _ratio_text(math.inf))
        table.add_row("why", "; ".join(p.problems)[:160], "", "")
        return table
    table.add_row("step", f"{p.predicted_s:.1f}", f"{case.published_s:.1f}", _ratio_text(p.ratio))
    for phase, seconds in case.spec.published.phases.items():
        pred = p.phases.get(phase, math.nan)
        table.add_row(f"  {phase}", f"{pred:.1f}", f"{seconds:.1f}", _ratio_text(pred / seconds))
    for first, last, seconds in case.spec.published.windows():  # the run clock's windows: not scored
        table.add_row(f"  [dim]steps {first}–{last} (run clock)[/dim]", f"{p.predicted_s:.1f}", f"{seconds:.1f}",
                      _ratio_text(p.predicted_s / seconds))
    return table


def summary_table(priced: Sequence[Priced], folds: Sequence[cal.HeldOut] | None) -> Table:
    """Within-band count, median |ln ratio| (all cases and per source) and the LOSO figure."""
    table = Table(title="Summary: predicted / published", title_justify="left")
    for col in ("cases", "n", "within 0.80–1.25", "median |ln ratio|", "median ratio", "infeasible"):
        table.add_column(col, justify="left" if col == "cases" else "right")
    groups = {"all": list(priced)}
    for p in priced:
        groups.setdefault(p.case.source.id, []).append(p)
    for name, ps in groups.items():
        inside = sum(1 for p in ps if p.feasible and BAND[0] <= p.ratio <= BAND[1])
        table.add_row(name, str(len(ps)), f"{inside}/{len(ps)}", f"{cal.median_abs_ln(ps):.3f}",
                      _ratio_text(statistics.median(p.ratio for p in ps)), str(sum(not p.feasible for p in ps)))
    if folds:
        for fold in folds:
            table.add_row(f"LOSO held out: {fold.source}", str(len(fold.priced)), "",
                          f"{fold.median_abs_ln:.3f}", "", str(sum(not p.feasible for p in fold.priced)))
        table.add_row("[bold]leave-one-source-out[/bold]", str(sum(len(f.priced) for f in folds)), "",
                      f"[bold]{cal.pooled_median(folds):.3f}[/bold]", "", "")
    return table


def skipped_table(skipped: Sequence[Skipped]) -> Table:
    """Cases waiting on what hetprof does not express yet: what each needs and why its files did not load."""
    table = Table(title="Skipped: cases whose files need what hetprof does not express yet", title_justify="left")
    for col in ("case", "needs", "why it did not load"):
        table.add_column(col)
    for s in skipped:
        table.add_row(s.name, "; ".join(s.needs), s.reason[:200])
    return table


def factors_table(title: str, rows: dict[str, dict[str, float]]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("fit")
    for knob in cal.KNOBS:
        table.add_column(knob.name, justify="right")
    for name, factors in rows.items():
        table.add_row(name, *(f"×{factors[k.name]:.3f}" for k in cal.KNOBS))
    return table


def folds_table(folds: Sequence[cal.HeldOut]) -> Table:
    """Each fold's fit against the committed catalog on the cases it was fitted to, and what the held-out
    source paid for it: a large move for a small in-sample gain is what raises the LOSO figure."""
    table = Table(title="Leave-one-source-out folds: median |ln ratio|", title_justify="left")
    for col in ("held out", "fitted on, committed", "fitted on, fold's fit", "held out, committed",
                "held out, fold's fit"):
        table.add_column(col, justify="left" if col == "held out" else "right")
    for fold in folds:
        table.add_row(fold.source, f"{fold.train_committed:.3f}", f"{fold.train_fitted:.3f}",
                      f"{fold.held_committed:.3f}", f"{fold.median_abs_ln:.3f}")
    return table


def write_json(path: Path, priced: Sequence[Priced], skipped: Sequence[Skipped] = ()) -> None:
    cases = [{"name": p.case.name, "source": p.case.source.id, "predicted_s": p.predicted_s if p.feasible else None,
              "published_s": p.case.published_s, "phases": p.phases if p.feasible else {},
              "published_phases": p.case.spec.published.phases, "problems": list(p.problems),
              "published_windows": [list(w) for w in p.case.spec.published.windows()]} for p in priced]
    waiting = [{"name": s.name, "needs": list(s.needs), "reason": s.reason} for s in skipped]
    path.write_text(json.dumps({"cases": cases, "skipped": waiting}, indent=2) + "\n")


def write_plans(folder: Path, cases: Sequence[Case], catalog) -> None:
    """Each case's pinned layout as a plan file: `hetprof plan --evaluate` re-prices it."""
    from hetprof.costmodels import get_cost_model

    folder.mkdir(parents=True, exist_ok=True)
    for case in cases:
        sim = simulator(case, get_cost_model("analytical", catalog=catalog))
        cand = pinned_candidate(sim, case.layout, file=str(case.folder / "case.yaml"))
        try:
            plan = build_plan(sim, cand, sim.evaluate(cand), search="published-layout", seed=0, objective="throughput")
        except InfeasibleError as exc:
            console.print(f"[red]{case.name}: no plan file, {exc}[/red]")
            continue
        (folder / f"{case.name}.json").write_text(json.dumps(plan.to_dict(), indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=Path, default=CASES_DIR, help="folder of case folders")
    ap.add_argument("--json", type=Path, help="write {'cases': [{name, source, predicted_s, published_s}, ...]}")
    ap.add_argument("--calibrate", action="store_true", help="fit the knob factors on every case and print them")
    ap.add_argument("--trials", type=int, default=150, help="optuna trials per fit (calibration and each LOSO fold)")
    ap.add_argument("--no-loso", action="store_true", help="skip leave-one-source-out (it refits once per source)")
    ap.add_argument("--plans", type=Path, help="write each case's pinned layout as a plan file in this folder")
    ap.add_argument("--quick", action="store_true", help="a few trials per fit (a smoke run)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.quick:
        args.trials = min(args.trials, 12)

    cases, skipped = scan_cases(args.cases)
    data = cal.builtin_data()
    factors = cal.fit(cases, args.trials, args.seed, data) if args.calibrate else dict(cal.NEUTRAL)
    catalog = cal.catalog_with(factors, data)
    priced = cal.price_all(cases, catalog)
    for p in priced:
        console.print(case_table(p))
    folds = None
    if not args.no_loso:
        folds = cal.leave_one_source_out(cases, args.trials, args.seed,
                                         progress=lambda s: console.print(f"[dim]LOSO: fitting without {s}…[/dim]"))
    console.print(summary_table(priced, folds))
    if skipped:
        console.print(skipped_table(skipped))
    rows = {"committed catalog" if not args.calibrate else "all cases": factors}
    rows.update({f"without {f.source}": f.factors for f in folds or ()})
    console.print(factors_table("Knobs against the committed catalog (×1 = as committed)", rows))
    if folds:
        console.print(folds_table(folds))
    if args.calibrate:
        console.print(f"[bold]calibrated on {len(cases)} cases from {len({c.source.id for c in cases})} sources; "
                      f"median |ln ratio| {cal.median_abs_ln(priced):.3f}[/bold]")
    if args.json:
        write_json(args.json, priced, skipped)
    if args.plans:
        write_plans(args.plans, cases, catalog)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
