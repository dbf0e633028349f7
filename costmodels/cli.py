"""`hetprof fit`: learn per-task cost models from the profile database and say how good they are."""

from __future__ import annotations

import click

from hetprof.cli import catalog_option, db_option, db_path
from hetprof.display import Col, escaped, fitted_table, print_wide, shown
from hetprof.specs.vocabulary import MoeBenchmark

EXPERTS = str(MoeBenchmark.EXPERTS)  # the grouped expert GEMMs of MoE models (costmodels/moefit.py)
TASK_TYPES = ("task.prefill", "task.decode", "task.train", EXPERTS)


@click.command("fit")
@db_option
@click.option("--task", type=click.Choice(TASK_TYPES), help="fit only this task type")
@click.option("--device", metavar="TYPE", help="fit only rows of this catalog device type (e.g. cpu, A100-40GB)")
@click.option("--report", "report", type=click.Path(dir_okay=False), metavar="FILE.png",
              help="write a predicted-vs-measured plot (held-out fitted and analytical)")
@click.option("--stat", type=click.Choice(["min", "median", "p25"]), default="min", show_default=True,
              help="how a shape's repeats become one target (min resists interference on busy hosts)")
@click.option("--envelope/--no-envelope", default=True, show_default=True,
              help="cap a shape's target by faster-measured shapes that do at least its work")
@click.option("--runs/--no-runs", default=True, show_default=True,
              help="also learn from the phases real runs recorded (`hetprof run --db`)")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the boosted families")
@click.option("--store/--no-store", default=True, show_default=True, help="write the fitted models to the DB")
@click.option("--wide", is_flag=True, help="every column, even past the terminal's width")
@catalog_option
def fit(task, device, report, stat, envelope, runs, seed, store, wide, catalog_path) -> None:
    """Fit per-task cost models on the profile database's task rows and store them.

    Prints, per task type and device type, the rows used, the held-out MAPE of the fitted model
    (folds hold out whole shape ranges: the largest/smallest batch, length, layers, or a whole
    model) next to the analytical model's MAPE on the same rows. MoE models' `moe.experts` rows (the
    `moe` suite) give one grouped expert GEMM model per device type and dtype, scored the same way
    against the catalog curve; plans price routed experts with it. The model is fitted on the
    profiler's task rows; with --runs (the default) the phases that `hetprof run` recorded (a
    decode step or a training step as it really ran) calibrate it: the run factor, measured over
    predicted on the runs' shapes, scales every prediction the next plan is made with.

    \b
    Examples:
      hetprof profile --quick --suite tasks --models tiny,tiny-2x && hetprof fit
      hetprof fit --task task.decode --device cpu --report fit.png
      hetprof run plan.json --iterations 5 && hetprof fit      # learn from the run too
      hetprof fit --catalog team-gpus.yaml    # the analytical column with the team's efficiency curves
      hetprof profile --quick --suite moe --models tiny-moe && hetprof fit --task moe.experts
    """
    from rich.console import Console

    from hetprof.costmodels import fitting, moefit
    from hetprof.errors import ProfileDBError
    from hetprof.profiles import ProfileDB
    from hetprof.specs.catalog import load_catalog

    console = Console()
    catalog = load_catalog(catalog_path) if catalog_path else None
    path = db_path()
    if not path.exists():
        raise ProfileDBError(f"{path}: no profile database; run `hetprof profile --suite tasks` first")
    skipped: list[str] = []
    with ProfileDB(path, readonly=not store) as db:  # a dry run writes nothing
        with console.status("fitting…") as status:
            fits = [] if task == EXPERTS else fitting.fit_database(
                db, task=task, device=device, seed=seed, stat=stat, envelope=envelope, runs=runs, skipped=skipped,
                catalog=catalog, progress=lambda m: status.update(f"fitting… {m}"))
            experts = moefit.fit_experts(db, device=device, seed=seed, stat=stat, envelope=envelope,
                                         skipped=skipped, catalog=catalog) if task in (None, EXPERTS) else []
        if not fits and not experts:
            where = f" on {device}" if device else ""
            suite = "moe" if task == EXPERTS else "tasks"
            raise ProfileDBError(f"{path}: no {task or 'task'} rows{where} to fit; "
                                 f"run `hetprof profile --suite {suite}` first")
        ids = fitting.store(db, fits) + moefit.store(db, experts) if store else []
        fits = [*fits, *experts]
    target = f"{stat} of repeats" + (", monotone envelope" if envelope else "")
    print_wide(console, _table(console, fits, ids, shown(f"hetprof fit ({path.name}, target: {target})"), wide), wide)
    for f in fits:
        if f.call is not None:
            where = f"generation calls on {escaped(f.device_type)} ({escaped(f.dtype)}): {f.call.default_s * 1e3:+.2f} ms"
            if f.call.runs:
                console.print(f"{where} beyond their run-calibrated prefill and decode phases (median of "
                              f"{f.call.runs} calls in runs, over {len(f.call.models)} model(s))")
            else:
                console.print(f"{where} beyond their prefill and decode phases (median of {len(f.call.points)} "
                              f"profiled call shapes of {len(f.call.models)} model(s); each profiled shape, and "
                              "each model, keeps its own)")
    for note in skipped:
        console.print(f"[yellow]skipped:[/] {escaped(note)}")
    if report:
        from hetprof.costmodels.report import plot_fits

        console.print(f"wrote {plot_fits(fits, report)}")


# Dropped right to left when the terminal is narrow (the highest `drop` first); what a reader acts on —
# which model, how good, against what, and its id for `hetprof db show` — always stays.
COLUMNS = (Col("task"), Col("device"), Col("dtype", drop=4), Col("shapes", "right", drop=3),
           Col("samples", "right", drop=6), Col("from runs", "right", drop=7), Col("run ×", "right", drop=2),
           Col("family", drop=1), Col("held-out", "right"), Col("folds", "right", drop=8), Col("analytical", "right"),
           Col("train", "right", drop=9), Col("noise", "right", drop=5), Col("id"))
CAPTION = ("MAPE. held-out: fitted on the rest, scored on held-out shape ranges; analytical: roofline on the same "
           "rows; noise: how much the target moves between halves of its repeats; run ×: what runs take over the "
           "profile-fitted time (error on the run shapes before → after, each run predicted from the others)")


def _table(console, fits, ids: list[str], title, wide: bool):
    rows = []
    for i, f in enumerate(fits):
        good = f.heldout.mape <= 0.10
        rows.append([shown(f.task_type), shown(f.device_type), shown(f.dtype), str(f.n_rows), str(f.n_samples),
                     str(f.n_run_rows), _runs(f), f.family, shown(_pct(f.heldout.mape), "green" if good else "yellow"),
                     str(f.heldout.n_folds), _pct(f.analytical_mape), _pct(f.train_mape), _pct(f.noise),
                     ids[i][:8] if ids else "-"])
    return fitted_table(console, COLUMNS, rows, title=title, caption=CAPTION, wide=wide)


def _runs(f) -> str:
    """The run factor and its error on the run shapes before → after (held out by run where it can be)."""
    if f.runs is None:
        return "-"
    r = f.runs
    return f"{r.factor:.2f} ({_pct(r.mape_before)}→{_pct(r.mape_after)}{'' if r.heldout else ' in-sample'})"


def _pct(v: float) -> str:
    return "n/a" if v != v else f"{v:.1%}"
