"""One naming of stored things across commands: every name a command prints, `db show` and `validate` accept.

Rows are keyed by hex ids and commands print their first 8–12 characters; runs of `hetprof run` are
named `run-<plan hash>-<UTC start>` (run_records' `run` column). A name resolves to exactly one
stored thing: a run name or a row id, whole or as a unique prefix. A run record's own row id stands
for its run, since a run, not one of its rows, is what a reader asks about.
"""

from __future__ import annotations

import dataclasses
import sqlite3

from hetprof.display import visible
from hetprof.errors import ProfileDBError

ROW_TABLES = ("runs", "devices", "links", "cost_models")
RUN = "run"  # kind of a `hetprof run` run: the rows of run_records sharing one `run` name
_ABOVE = "\U0010ffff"  # sorts after every character: [prefix, prefix + _ABOVE) holds every name starting with prefix


@dataclasses.dataclass(frozen=True)
class Named:
    """What a name stands for: `kind` is a table of ROW_TABLES (key: the row id) or RUN (key: the run name)."""

    kind: str
    key: str


def _starting(conn: sqlite3.Connection, sql: str, prefix: str) -> set[str]:
    return {r[0] for r in conn.execute(sql, (prefix, prefix + _ABOVE))}


def candidates(conn: sqlite3.Connection, name: str, kinds: tuple[str, ...] = (*ROW_TABLES, RUN)) -> set[Named]:
    """Everything `name` may stand for: exact matches alone if there are any, else every prefix match."""
    found: set[Named] = set()
    for table in (k for k in kinds if k in ROW_TABLES):
        found |= {Named(table, i) for i in _starting(conn, f"SELECT id FROM {table} WHERE id >= ? AND id < ?", name)}
    if RUN in kinds:
        found |= {Named(RUN, r) for r in _starting(
            conn, "SELECT DISTINCT run FROM run_records WHERE run >= ? AND run < ?", name)}
        found |= {Named(RUN, r) for r in _starting(
            conn, "SELECT DISTINCT run FROM run_records WHERE id >= ? AND id < ?", name)}
    exact = {n for n in found if n.key == name}
    return exact or found


def resolve(conn: sqlite3.Connection, name: str, kinds: tuple[str, ...] = (*ROW_TABLES, RUN)) -> Named:
    """The one stored thing `name` stands for; a name matching nothing or several things is refused."""
    if not name:
        raise ProfileDBError("an empty name matches everything; give an id or run name as `hetprof db list` prints it")
    found = candidates(conn, name, kinds)
    if len(found) == 1:
        return next(iter(found))
    what = " or ".join(_KIND_WORDS[k] for k in kinds)
    if not found:
        raise ProfileDBError(f"{visible(name)!r} names no {what} in the profile database "
                             "(`hetprof db list` shows the names)")
    shown = ", ".join(sorted(f"{_KIND_WORDS[n.kind]} {visible(n.key)[:24]}" for n in found)[:5])
    raise ProfileDBError(f"{visible(name)!r} matches {len(found)} things ({shown}{', …' if len(found) > 5 else ''}); "
                         "give more of the name")


_KIND_WORDS = {"runs": "benchmark run", "devices": "device", "links": "link", "cost_models": "cost model",
               RUN: "run of `hetprof run`"}


def recorded_runs(conn: sqlite3.Connection, limit: int | None = None, run: str | None = None) -> list[dict]:
    """Runs of `hetprof run` with records here, newest first: name, plan hash, iterations, hosts, first and last time."""
    where, args = ("WHERE run = ?", [run]) if run is not None else ("", [])
    sql = (f"SELECT run, MIN(plan_hash), COUNT(DISTINCT iteration), MIN(iteration), MAX(iteration), "
           f"group_concat(DISTINCT host), MIN(created), MAX(created), MIN(source) FROM run_records {where} "
           "GROUP BY run ORDER BY MIN(created) DESC")
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit)
    keys = ("run", "plan_hash", "iterations", "first_iteration", "last_iteration", "hosts", "started", "last",
            "source")
    return [dict(zip(keys, row, strict=True)) for row in conn.execute(sql, args)]
