"""`hetprof db show NAME`: one stored thing, summarised for a reader; `--json` gives its raw stored form.

NAME is anything `hetprof db list`, `hetprof fit`, `hetprof run` or `hetprof validate` prints (a row id or
a run name, whole or a unique prefix; profiles/names.py). The summary shows dates as local times and
a cost model as its scores and shape ranges rather than its thousands of fitted numbers.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

import click

from hetprof.cli import db_option
from hetprof.display import Col, fitted_table, print_wide, shown, when
from hetprof.profiles.cli_common import open_db, recorded, wide_option
from hetprof.profiles.names import RUN, resolve


@click.command()
@db_option
@click.argument("name", metavar="NAME")
@click.option("--limit", default=50, show_default=True, help="samples (or iterations) shown")
@click.option("--json", "as_json", is_flag=True, help="the raw stored form (every field, JSON parsed), for scripts")
@wide_option
def show(name: str, limit: int, as_json: bool, wide: bool) -> None:
    """One stored thing by NAME: a benchmark run and its samples, a device, a link, a cost model, or a run
    of `hetprof run` — NAME as `hetprof db list` prints it (an id or run name, or a unique prefix)."""
    from rich.console import Console

    with open_db(readonly=True) as pdb:
        found = resolve(pdb.conn, name)
        if as_json:
            click.echo(json.dumps(raw(pdb, found.kind, found.key), indent=2, sort_keys=True, default=str))
            return
        console = Console()
        if found.kind == RUN:
            _show_recorded_run(console, pdb, found.key, limit, wide)
            return
        row = raw(pdb, found.kind, found.key)
        console.print(shown(f"{_KIND_TITLES[found.kind]} {found.key}", "bold"))
        for label, value in _SUMMARIES[found.kind](row):
            console.print(shown(f"  {label}: ") + shown(value))
        if found.kind == "runs":
            _show_samples(console, row, limit, wide)
        if found.kind == "cost_models":
            console.print(shown("  (`--json` prints every fitted number)", "dim"))


def raw(pdb: Any, kind: str, key: str) -> dict[str, Any] | list[dict[str, Any]]:
    """The stored form: a row with its JSON columns parsed (a benchmark run with its samples, in order),
    or a run's records, iteration by iteration."""
    if kind == RUN:
        return sorted(_rows(pdb, "run_records", "run", key), key=lambda r: (r["iteration"], r["task"]))
    row = _rows(pdb, kind, "id", key)[0]
    if kind == "runs":
        row["samples"] = sorted(_rows(pdb, "samples", "run_id", key), key=lambda r: r["seq"])
    return row


def _rows(pdb: Any, table: str, column: str, key: str) -> list[dict[str, Any]]:
    cur = pdb.conn.execute(f"SELECT * FROM {table} WHERE {column} = ?", (key,))
    names = [d[0] for d in cur.description]
    return [{k: pdb.stored(table, k, v, values[0]) for k, v in zip(names, values, strict=True)}
            for values in cur.fetchall()]


def _compact(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": ")) if isinstance(value, (dict, list)) else str(value)


def _run_summary(row: dict) -> list[tuple[str, object]]:
    return [("benchmark", row["benchmark"]), ("host", row["host"]), ("device", row["device_id"] or "—"),
            ("samples", row["n_samples"]), ("params", _compact(row["params"])), ("created", when(row["created"])),
            ("source", row["source"]), ("tool version", row["tool_version"])]


def _device_summary(row: dict) -> list[tuple[str, object]]:
    from hetprof.specs.units import fmt_bytes

    memory = fmt_bytes(row["memory_bytes"]) if row["memory_bytes"] else "—"
    return [("name", row["name"]), ("kind", row["kind"]), ("catalog type", row["catalog_type"] or "—"),
            ("host", row["host"]), ("memory", memory),
            *((k, row[k]) for k in ("driver", "cuda", "torch", "uuid") if row[k]),
            *(("extra", _compact(row["extra"])) for _ in [0] if row["extra"]), ("source", row["source"])]


def _link_summary(row: dict) -> list[tuple[str, object]]:
    regions = f" ({row['src_region'] or '?'} → {row['dst_region'] or '?'})" if row["src_region"] or row["dst_region"] else ""
    return [("hosts", f"{row['src_host']} → {row['dst_host']}{regions}"),
            ("latency α", f"{row['alpha_s'] * 1e3:.3f} ms"), ("bandwidth β", f"{row['beta_Bps'] * 8 / 1e6:.1f} Mbit/s"),
            ("fit residual", f"{row['residual']:.3g}" if row["residual"] is not None else "—"),
            ("benchmark run", row["run_id"] or "—"), ("created", when(row["created"])), ("source", row["source"])]


def _model_summary(row: dict) -> list[tuple[str, object]]:
    params, metrics = row["params"], row["metrics"]
    out: list[tuple[str, object]] = [("name", row["name"]), ("task", row["task_type"]), ("family", row["family"])]
    for key in ("device_type", "dtype", "phase", "target", "run_factor"):
        if key in params:
            out.append((key.replace("_", " "), params[key]))
    if isinstance(params.get("features"), list):
        out.append(("features", ", ".join(map(str, params["features"]))))
    if isinstance(params.get("points"), list):
        out.append(("point corrections", f"{len(params['points'])} profiled shapes"))
    if isinstance(params.get("range"), dict):
        out.append(("fitted on", ", ".join(f"{k} {_compact(v)}" for k, v in sorted(params["range"].items()))))
    for key, value in sorted(metrics.items()):
        out.append((key.replace("_", " "), _metric(key, value)))
    out += [("profile snapshot", (row["snapshot"] or "—")[:16]), ("created", when(row["created"])),
            ("source", row["source"])]
    return out


def _metric(key: str, value: object) -> str:
    if not isinstance(value, (int, float)):
        return str(value)
    if "mape" in key or "noise" in key:
        return f"{value:.1%}"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.4g}"


_SUMMARIES = {"runs": _run_summary, "devices": _device_summary, "links": _link_summary, "cost_models": _model_summary}
_KIND_TITLES = {"runs": "benchmark run", "devices": "device", "links": "link", "cost_models": "cost model"}


def _show_samples(console: Any, row: dict, limit: int, wide: bool) -> None:
    """The run's samples: what every sample shares on one line, then a column per field that varies —
    its number and measurements always, the parameters that vary leaving from the last when narrow."""
    import pandas as pd

    samples = row["samples"]
    if not samples:
        console.print(shown("  no samples"))
        return
    metrics = {k for s in samples for k in s["metrics"]}
    df = pd.DataFrame([{"seq": s["seq"], **s["params"], **s["metrics"]} for s in samples]).dropna(axis=1, how="all")
    same = [c for c in df.columns if c != "seq" and len(df) > 1 and df[c].astype(str).nunique() == 1]
    if same:
        console.print(shown("  every sample: " + ", ".join(f"{c}={_fmt(df[c].iloc[0])}" for c in same)))
    params = [c for c in df.columns if c not in same and c != "seq" and c not in metrics]
    measured = [c for c in df.columns if c not in same and c in metrics]
    cols = [Col("seq", "right"), *(Col(c, "right", drop=0 if i == 0 else len(params) - i) for i, c in enumerate(params)),
            *(Col(c, "right") for c in measured)]
    rows = [[_fmt(v) for v in r] for r in df[["seq", *params, *measured]].head(limit).itertuples(index=False)]
    table = fitted_table(console, cols, rows, title=f"samples ({min(limit, len(df))} of {len(df)})", wide=wide)
    print_wide(console, table, wide)


def _fmt(value: object) -> object:
    return f"{value:.4g}" if isinstance(value, float) else value


def _show_recorded_run(console: Any, pdb: Any, run: str, limit: int, wide: bool) -> None:
    """A run of `hetprof run`: when and where it ran, and each task's median measured time against the plan's."""
    head = recorded(pdb, run=run)[0]
    records = raw(pdb, RUN, run)  # read (and checked) before anything is printed
    console.print(shown(f"run {run}", "bold"))
    for label, value in (("plan", head["plan_hash"]), ("hosts", head["hosts"] or "—"),
                         ("iterations", f"{head['iterations']} recorded ({head['first_iteration']}…{head['last_iteration']})"),
                         ("started", when(head["started"])), ("last record", when(head["last"])),
                         ("source", head["source"])):
        console.print(shown(f"  {label}: ") + shown(value))
    per_task: dict[str, list[dict]] = {}
    for rec in records:
        per_task.setdefault(rec["task"], []).append(rec)
    cols = [Col("task"), Col("iterations", "right", drop=2), Col("median s", "right"), Col("predicted s", "right"),
            Col("measured / predicted", "right", drop=1)]
    rows = []
    for task, recs in list(per_task.items())[:limit]:
        measured = statistics.median(r["seconds"] for r in recs)
        predicted = next((r["predicted_s"] for r in recs if r["predicted_s"]), None)
        rows.append([task, len(recs), f"{measured:.3f}", f"{predicted:.3f}" if predicted else "—",
                     f"{measured / predicted:.2f}" if predicted else "—"])
    print_wide(console, fitted_table(console, cols, rows, title="per task (all iterations)", wide=wide), wide)
    console.print(shown(f"  `hetprof validate {run}` compares them iteration by iteration", "dim"))
