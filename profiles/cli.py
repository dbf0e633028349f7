"""`hetprof db …`: look into a profile database and share it with other teams."""

from __future__ import annotations

import json
import time

import click

from hetprof.cli import db_option, db_path


def _open(readonly: bool = False):
    from hetprof.profiles import ProfileDB

    return ProfileDB(db_path(), readonly=readonly)


def _console():
    from rich.console import Console

    return Console()


@click.group()
def db() -> None:
    """Inspect, export, import and merge the profile database."""


@db.command()
@db_option
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def info(as_json: bool) -> None:
    """Counts per kind, schema version, and the devices and hosts covered."""
    from rich.table import Table

    with _open() as pdb:
        data = pdb.info()
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    console = _console()
    console.print(f"[bold]{data['path']}[/]  schema v{data['schema_version']}")
    counts = Table(title="rows")
    for name in data["counts"]:
        counts.add_column(name, justify="right")
    counts.add_row(*(str(v) for v in data["counts"].values()))
    console.print(counts)
    if data["devices"]:
        devs = Table(title="devices")
        for col in ("id", "name", "kind", "catalog_type", "host", "source"):
            devs.add_column(col)
        for d in data["devices"]:
            devs.add_row(*(str(d[c] or "") for c in ("id", "name", "kind", "catalog_type", "host", "source")))
        console.print(devs)
    console.print(f"hosts: {', '.join(data['hosts']) or '(none)'}")
    if data["benchmarks"]:
        console.print("samples per benchmark: " + ", ".join(f"{k} {v}" for k, v in data["benchmarks"].items()))
    for o in data["origins"]:
        added = sum(o["added"].values())
        console.print(f"[dim]{o['kind']} {o['origin']} at {time.ctime(o['at'])}: {added} rows added")


@db.command("export")
@db_option
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--device", help="only this device (id prefix, catalog type or name)")
@click.option("--host", help="only this host")
def export_cmd(out: str, device: str | None, host: str | None) -> None:
    """Write everything (or one device's / host's rows) to one portable file."""
    from hetprof.profiles import export

    with _open(readonly=True) as pdb:
        counts = export(pdb, out, device=device, host=host)
    click.echo(f"exported to {out}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))


@db.command("import")
@db_option
@click.argument("file", type=click.Path(dir_okay=False))
def import_cmd(file: str) -> None:
    """Validate a shared file, then add all of it (or, if anything is wrong, none of it)."""
    from hetprof.profiles import import_file

    with _open() as pdb:
        added = import_file(pdb, file)
    click.echo(f"imported {file}: added " + ", ".join(f"{v} {k}" for k, v in added.items()))


@db.command("import-reference")
@db_option
@click.argument("names", nargs=-1, required=True, metavar="NAME... | all")
def import_reference_cmd(names: tuple[str, ...]) -> None:
    """Import shipped reference profiles: published figures per GPU type, stored as `reference`.

    Calibration uses them where a GPU type has no measured rows; measured rows always win.
    """
    from hetprof.profiles.references import import_reference
    from hetprof.profiles.references import names as shipped

    wanted = shipped() if names == ("all",) else list(names)
    with _open() as pdb:
        for name in wanted:
            added = import_reference(pdb, name)
            click.echo(f"imported reference {name}: added " + ", ".join(f"{v} {k}" for k, v in added.items()))


@db.command("merge")
@db_option
@click.argument("other", type=click.Path(dir_okay=False))
def merge_cmd(other: str) -> None:
    """Add every row of another team's database that this one lacks (idempotent)."""
    from hetprof.profiles import merge

    with _open() as pdb:
        added = merge(pdb, other)
    click.echo(f"merged {other}: added " + ", ".join(f"{v} {k}" for k, v in added.items()))


@db.command("list")
@db_option
@click.option("--benchmark", help="a benchmark name, or a family prefix ending in '.' (e.g. task.)")
@click.option("--limit", default=30, show_default=True)
def list_cmd(benchmark: str | None, limit: int) -> None:
    """Benchmark runs (newest first), links, run records and fitted models."""
    from rich.table import Table

    console = _console()
    with _open(readonly=True) as pdb:
        runs = pdb.runs(benchmark).sort_values("created", ascending=False).head(limit)
        t = Table(title=f"benchmark runs ({len(runs)} shown)")
        t.add_column("id", no_wrap=True)
        t.add_column("benchmark", no_wrap=True, min_width=14)
        for col in ("host", "samples", "params", "when"):
            t.add_column(col)
        t.add_column("source", no_wrap=True, min_width=9)  # measured or reference: never cut
        for _, r in runs.iterrows():
            t.add_row(r["id"][:10], r["benchmark"], r["host"], str(r["n_samples"]),
                      json.dumps(r["params"])[:60], time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"])),
                      r["source"])
        console.print(t)
        links = pdb.links()
        if len(links):
            lt = Table(title="links")
            for col in ("id", "src → dst", "α", "β", "residual"):
                lt.add_column(col)
            for _, r in links.tail(limit).iterrows():
                lt.add_row(r["id"][:12], f"{r['src_host']} → {r['dst_host']}", f"{r['alpha_s'] * 1e3:.3f} ms",
                           f"{r['beta_Bps'] * 8 / 1e6:.1f} Mbit/s", f"{r['residual'] or 0:.3g}")
            console.print(lt)
        models = pdb.cost_models()
        if len(models):
            mt = Table(title="cost models")
            for col in ("id", "name", "task", "family", "metrics"):
                mt.add_column(col)
            for _, r in models.tail(limit).iterrows():
                mt.add_row(r["id"][:12], r["name"], r["task_type"], r["family"], json.dumps(r["metrics"])[:60])
            console.print(mt)
        records = pdb.run_records()
        if len(records):
            console.print(f"run records: {len(records)} rows from runs {', '.join(sorted(set(records['run'])))}")


@db.command()
@db_option
@click.argument("id_prefix", metavar="ID")
@click.option("--limit", default=50, show_default=True, help="samples shown")
def show(id_prefix: str, limit: int) -> None:
    """One row by id (a unique prefix): a run with its samples, a device, a link or a model."""
    from rich.table import Table

    from hetprof.errors import ProfileDBError

    console = _console()
    with _open(readonly=True) as pdb:
        hits = []
        for table in ("runs", "devices", "links", "cost_models", "run_records"):
            for row in pdb.conn.execute(f"SELECT id FROM {table} WHERE id LIKE ?", (id_prefix + "%",)):
                hits.append((table, row[0]))
        if len(hits) != 1:
            what = "nothing" if not hits else f"{len(hits)} rows"
            raise ProfileDBError(f"id {id_prefix!r} matches {what}; give a longer unique prefix")
        table, rid = hits[0]
        if table == "cost_models":
            console.print_json(json.dumps(pdb.get_cost_model(rid)))
            return
        cur = pdb.conn.execute(f"SELECT * FROM {table} WHERE id = ?", (rid,))
        names = [d[0] for d in cur.description]
        row = dict(zip(names, cur.fetchone(), strict=True))
        console.print(f"[bold]{table[:-1]} {rid}")
        for k, v in row.items():
            console.print(f"  {k}: {v}")
        if table == "runs":
            df = pdb.samples(row["benchmark"])
            df = df[df["run_id"] == rid].drop(columns=["sample_id", "run_id", "benchmark", "device_id",
                                                       "device_name", "catalog_type", "host", "run_source"])
            df = df.dropna(axis=1, how="all")
            t = Table(title=f"samples ({min(limit, len(df))} of {len(df)})")
            for col in df.columns:
                t.add_column(str(col), justify="right")
            for _, r in df.head(limit).iterrows():
                t.add_row(*(f"{v:.4g}" if isinstance(v, float) else str(v) for v in r))
            console.print(t)


