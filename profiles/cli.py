"""`hetprof db …`: look into a profile database and share it with other teams."""

from __future__ import annotations

import json

import click

from hetprof.cli import db_option
from hetprof.display import Col, fitted_table, print_wide, shown, visible, when
from hetprof.profiles.cli_common import open_db as _open
from hetprof.profiles.cli_common import recorded, wide_option
from hetprof.profiles.cli_show import show
from hetprof.safety.processes import exit_on_signals


def _size(_ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from hetprof.profiles.bounds import parse_size

    try:
        return None if value is None else parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param=param) from None


def limit_options(fn):
    """--max-bytes, --max-rows, --max-row-bytes, --max-expansion and --deadline: the bounds of reading a shared
    file."""
    from hetprof.profiles.bounds import Limits

    d = Limits()
    fn = click.option("--deadline", type=click.FloatRange(min=0, min_open=True), default=d.deadline_s,
                      show_default=True, help="seconds allowed for reading and checking the file")(fn)
    fn = click.option("--max-row-bytes", callback=_size, default=str(d.max_row_bytes), show_default=True,
                      help="largest row accepted (bytes; K/M/G suffixes)")(fn)
    fn = click.option("--max-rows", type=click.IntRange(min=1), default=d.max_rows, show_default=True,
                      help="most rows accepted, all tables together")(fn)
    fn = click.option("--max-expansion", type=click.FloatRange(min=1), default=d.max_expansion, show_default=True,
                      help="most uncompressed bytes of an export per byte of its file")(fn)
    return click.option("--max-bytes", callback=_size, default=str(d.max_bytes), show_default=True,
                        help="most bytes read: an export's uncompressed size, a database's file size")(fn)


def limits_from(options: dict):
    from hetprof.profiles.bounds import Limits

    return Limits(max_bytes=options["max_bytes"], max_rows=options["max_rows"],
                  max_row_bytes=options["max_row_bytes"], deadline_s=options["deadline"],
                  max_expansion=options["max_expansion"])


def _console():
    from rich.console import Console

    return Console()


@click.group()
def db() -> None:
    """Inspect, export, import and merge the profile database."""


@db.command()
@db_option
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@wide_option
def info(as_json: bool, wide: bool) -> None:
    """Counts per kind, schema version, and the devices and hosts covered."""
    with _open(readonly=True) as pdb:
        data = pdb.info()
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    console = _console()
    console.print(shown(data["path"], "bold") + f"  schema v{data['schema_version']}")
    console.print("rows: " + " · ".join(f"{v:,} {k}" for k, v in data["counts"].items()))  # wraps, never cut
    if data["devices"]:
        cols = [Col("id"), Col("name", drop=1), Col("kind", drop=3), Col("catalog_type"), Col("host", drop=2),
                Col("source", drop=4)]
        rows = [[d[c.header] or "" for c in cols] for d in data["devices"]]
        print_wide(console, fitted_table(console, cols, rows, title="devices", wide=wide), wide)
    console.print(shown(f"hosts: {', '.join(data['hosts']) or '(none)'}"))
    if data["benchmarks"]:
        console.print(shown("samples per benchmark: " + ", ".join(f"{k} {v}" for k, v in data["benchmarks"].items())))
    for o in data["origins"]:
        added = sum(o["added"].values())
        console.print(shown(f"{o['kind']} {o['origin']} at {when(o['at'])}: {added} rows added", "dim"))


@db.command("export")
@db_option
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--device", help="only this device (id prefix, catalog type or name)")
@click.option("--host", help="only this host")
def export_cmd(out: str, device: str | None, host: str | None) -> None:
    """Write everything (or one device's / host's rows) to one portable file."""
    from hetprof.profiles import export

    with _open(readonly=True) as pdb, exit_on_signals():
        counts = export(pdb, out, device=device, host=host)
    click.echo(f"exported to {visible(out)}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))


@db.command("import")
@db_option
@click.argument("file", type=click.Path(dir_okay=False))
@limit_options
def import_cmd(file: str, **limits: object) -> None:
    """Validate a shared file, then add all of it (or, if anything is wrong, none of it)."""
    from hetprof.profiles import import_file

    _readable_before_opening(file)
    with _open() as pdb, exit_on_signals():
        added = import_file(pdb, file, limits_from(limits))
    click.echo(f"imported {visible(file)}: added " + ", ".join(f"{v} {k}" for k, v in added.items()))


@db.command("import-reference")
@db_option
@click.argument("names", nargs=-1, required=True, metavar="NAME... | all")
def import_reference_cmd(names: tuple[str, ...]) -> None:
    """Import shipped reference profiles: published figures per GPU type, stored as `reference`.

    Calibration uses them where a GPU type has no measured rows; measured rows always win.
    """
    from hetprof.profiles.references import import_reference, reference_file
    from hetprof.profiles.references import names as shipped

    wanted = shipped() if names == ("all",) else list(names)
    for name in wanted:  # an unknown name is refused before the database is opened (or created)
        reference_file(name)
    with _open() as pdb:
        for name in wanted:
            added = import_reference(pdb, name)
            click.echo(f"imported reference {name}: added " + ", ".join(f"{v} {k}" for k, v in added.items()))


@db.command("merge")
@db_option
@click.argument("other", type=click.Path(dir_okay=False))
@limit_options
def merge_cmd(other: str, **limits: object) -> None:
    """Add every row of another team's database that this one lacks (idempotent)."""
    from hetprof.profiles import merge

    _readable_before_opening(other)
    with _open() as pdb, exit_on_signals():
        added = merge(pdb, other, limits_from(limits))
    click.echo(f"merged {visible(other)}: added " + ", ".join(f"{v} {k}" for k, v in added.items()))


@db.command("list")
@db_option
@click.option("--benchmark", help="a benchmark name, or a family prefix ending in '.' (e.g. task.)")
@click.option("--limit", default=30, show_default=True)
@wide_option
def list_cmd(benchmark: str | None, limit: int, wide: bool) -> None:
    """Benchmark runs (newest first), links, runs of `hetprof run` and fitted models.

    Every name in the first column is what `hetprof db show` (and, for runs, `hetprof validate`) accepts.
    """
    console = _console()
    with _open(readonly=True) as pdb:  # everything is read (and checked) before anything is printed
        runs = pdb.runs(benchmark).sort_values("created", ascending=False).head(limit)
        links, runs_of_run, models = pdb.links(), recorded(pdb, limit), pdb.cost_models()
    cols = [Col("id"), Col("benchmark"), Col("host", drop=2), Col("samples", "right", drop=3),
            Col("params", drop=5), Col("when", drop=4), Col("source", drop=1)]
    rows = [[r["id"][:10], r["benchmark"], r["host"], r["n_samples"], json.dumps(r["params"]),
             when(r["created"], short=True), r["source"]] for _, r in runs.iterrows()]
    print_wide(console, fitted_table(console, cols, rows, title=f"benchmark runs ({len(runs)} shown)",
                                     wide=wide), wide)
    if len(links):
        cols = [Col("id"), Col("src → dst"), Col("α", "right"), Col("β", "right"),
                Col("residual", "right", drop=1)]
        rows = [[r["id"][:12], f"{r['src_host']} → {r['dst_host']}", f"{r['alpha_s'] * 1e3:.3f} ms",
                 f"{r['beta_Bps'] * 8 / 1e6:.1f} Mbit/s", f"{r['residual'] or 0:.3g}"]
                for _, r in links.tail(limit).iterrows()]
        print_wide(console, fitted_table(console, cols, rows, title="links", wide=wide), wide)
    if runs_of_run:
        cols = [Col("run"), Col("iterations", "right"), Col("hosts", drop=2), Col("started", drop=1),
                Col("plan", drop=3)]
        rows = [[r["run"], r["iterations"], r["hosts"] or "", when(r["started"], short=True), r["plan_hash"][:12]]
                for r in runs_of_run]
        print_wide(console, fitted_table(console, cols, rows, title="runs of `hetprof run`", wide=wide), wide)
    if len(models):
        cols = [Col("id"), Col("name", drop=3), Col("task"), Col("family", drop=2),
                Col("held-out MAPE", "right", drop=1), Col("created", drop=4)]
        rows = [[r["id"][:12], r["name"], r["task_type"], r["family"], _pct(r["metrics"].get("heldout_mape")),
                 when(r["created"], short=True)] for _, r in models.tail(limit).iterrows()]
        print_wide(console, fitted_table(console, cols, rows, title="cost models", wide=wide), wide)


def _readable_before_opening(source: str) -> None:
    """A missing or unreadable source is refused before the target database is opened, so a typo
    creates no empty database."""
    from pathlib import Path

    from hetprof.profiles.bounds import regular_file

    regular_file(Path(source))


def _pct(value: object) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) and value == value else "—"


db.add_command(show)
