"""Checking another database's samples in parallel, into private staging files, for `merge`.

A merge checks every row it takes (types, limits, content address), and at 10⁶ samples that
check, not SQLite, is most of the time. So the samples are split into ranges of run_id; each range
is read, checked and written to a staging database of its own by one process (this one takes the
first range, a worker process each other), and the merge copies the staged rows in with one
INSERT … SELECT per file. Only rows that a process checked are ever written to a staging file, and
the files live in a fresh private directory, so a source changed in the meantime cannot slip
unchecked rows in. No rows travel between processes: a worker returns its count and run ids.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hetprof.errors import ImportRefused, ProfileDBError
from hetprof.profiles.bounds import Limits, Watch
from hetprof.profiles.rowchecks import Invalid, check_sample
from hetprof.profiles.schema import TABLES, Table
from hetprof.safety.processes import child_env, python_argv, safe_cwd

WORKERS = 2  # processes in all, this one included; more would only queue on a small machine
MIN_ROWS = 100_000  # fewer rows stay in this process: starting a Python worker costs more than they take
BATCH = 10_000

Bound = str | None  # a range edge on run_id; None: unbounded on that side


def read_only_uri(path: Path) -> str:
    return f"{path.resolve().as_uri()}?mode=ro"


def missing_rows_sql(table: Table) -> str:
    """Rows of `main.<table>` that `mine.<table>` lacks, found by this side's key (an index lookup).

    Rows this database already holds would be ignored by the insert anyway, so they are neither
    fetched nor checked: a repeated merge costs a join, not a re-check.
    """
    same = " AND ".join(f"m.{k} = o.{k}" for k in table.key)
    return f"SELECT * FROM main.{table.name} AS o WHERE NOT EXISTS (SELECT 1 FROM mine.{table.name} AS m WHERE {same})"


def _range_sql(lo: Bound, hi: Bound) -> tuple[str, list[str]]:
    """`o.run_id` in [lo, hi). Consecutive ranges use one edge with < and >=, which complement each
    other under any collation a file declares, and the first takes NULL: together they cover every row."""
    if lo is None:
        return ("1" if hi is None else "(o.run_id IS NULL OR o.run_id < ?)"), ([] if hi is None else [hi])
    if hi is None:
        return "o.run_id >= ?", [lo]
    return "o.run_id >= ? AND o.run_id < ?", [lo, hi]


def plan(src: sqlite3.Connection, workers: int = WORKERS) -> list[tuple[Bound, Bound]] | None:
    """Ranges of run_id holding about equal numbers of samples, or None when one process should do it.

    The runs table's sample counts are untrusted, but they only balance the work: the ranges cover
    every row whatever they say.
    """
    workers = min(workers, os.cpu_count() or 1)
    weights = [(rid, n if type(n) is int and n > 0 else 1)
               for rid, n in src.execute("SELECT id, n_samples FROM main.runs ORDER BY id") if type(rid) is str]
    total = sum(n for _, n in weights)
    if workers < 2 or total < MIN_ROWS:
        return None
    edges: list[Bound] = [None]
    seen = 0
    for rid, n in weights:
        if seen >= total * len(edges) / workers and len(edges) < workers:
            edges.append(rid)
        seen += n
    if len(edges) < 2:  # one run holds most samples: nothing to split
        return None
    edges.append(None)
    return list(zip(edges[:-1], edges[1:], strict=False))


def open_snapshot(snapshot: str | Path, mine: str | Path, watch: Watch) -> sqlite3.Connection:
    """A bounded read-only connection to a merge's private snapshot, with this database attached as `mine`.

    The snapshot is a copy nobody else writes (`immutable` skips locking); `watch` bounds every query.
    """
    src = watch.attach(sqlite3.connect(f"{read_only_uri(Path(snapshot))}&immutable=1", uri=True))
    src.execute("ATTACH DATABASE ? AS mine", (read_only_uri(Path(mine)),))
    return src


def new_samples_sql() -> str:
    """Samples of `main` with, last, the id `mine` holds at the same (run_id, seq): NULL for a new place,
    the same id for a sample already here (skipped), another id for a clash (refused)."""
    cols = ", ".join(f"o.{c}" for c in TABLES["samples"].column_names)
    return (f"SELECT {cols}, m.id FROM main.samples AS o LEFT JOIN mine.samples AS m "
            "ON m.run_id = o.run_id AND m.seq = o.seq WHERE (m.id IS NULL OR m.id <> o.id)")


def run_sizes(src: sqlite3.Connection) -> dict[str, int]:
    """n_samples of every run in the source and this database: a sample's seq must be below it."""
    return {rid: n for rid, n in src.execute("SELECT id, n_samples FROM mine.runs UNION ALL "
                                             "SELECT id, n_samples FROM main.runs") if type(n) is int}


def stage(other: str, mine: str, lo: Bound, hi: Bound, out: str, origin: str = "",
          limits: dict | None = None, parent_pid: int | None = None) -> list[str]:
    """Check the samples of the snapshot `other` in run_id range [lo, hi) that `mine` lacks; write them to `out`.

    Returns the run ids the staged rows reference; raises ImportRefused at the first bad row (named
    after `origin`, the file the user gave) or past a bound of `limits`.
    """
    origin = origin or other
    watch = Watch(Limits(**limits) if limits else Limits(), origin, parent_pid)
    table = TABLES["samples"]
    where, args = _range_sql(lo, hi)
    width = len(table.column_names)
    dst = sqlite3.connect(out, isolation_level=None)
    try:
        with watch.guard():
            src = open_snapshot(other, mine, watch)
            dst.execute("PRAGMA journal_mode=OFF")  # a scratch file: if this fails, the merge fails
            dst.execute("PRAGMA synchronous=OFF")
            dst.execute(f"CREATE TABLE samples ({', '.join(table.column_names)})")
            dst.execute("BEGIN")
            sizes = run_sizes(src)
            runs: set[str] = set()
            for rows in _batches(src.execute(f"{new_samples_sql()} AND {where}", args)):
                checked = [checked_sample(row, width, sizes, origin) for row in rows]
                runs.update(row[1] for row in checked)
                dst.executemany(f"INSERT INTO samples VALUES ({','.join('?' * width)})", checked)
            dst.execute("COMMIT")
            src.close()
        return sorted(runs)
    finally:
        dst.close()


def checked_sample(row: tuple, width: int, sizes: dict[str, int], origin: str) -> tuple:
    """The sample part of a `new_samples_sql` row, checked like an import's; raises ImportRefused."""
    sample, clash = row[:width], row[width]
    try:
        check_sample(sample)
        if clash is not None:
            raise Invalid(f"run {sample[1][:12]}… already holds another sample at seq {sample[2]}")
        n = sizes.get(sample[1])
        if n is not None and sample[2] >= n:
            raise Invalid(f"seq {sample[2]} is outside its run's {n} samples (n_samples)")
    except Invalid as exc:
        raise ImportRefused(f"{origin}: samples row {str(sample[0])[:16]!r}: {exc}") from None
    except UnicodeEncodeError:
        raise ImportRefused(f"{origin}: samples row {str(sample[0])[:16]!r}: text is not valid Unicode "
                            "(a lone surrogate)") from None
    return sample


def _batches(cur: sqlite3.Cursor) -> Iterator[list[tuple]]:
    while rows := cur.fetchmany(BATCH):
        yield rows


def stage_all(other: Path, mine: Path, ranges: list[tuple[Bound, Bound]], folder: Path, origin: str,
              limits: Limits) -> tuple[list[Path], set[str]]:
    """Stage every range, the first in this process and each other one in a worker process.

    Returns the staging files and the run ids their rows reference. A refusal anywhere is raised
    here, and workers still running are stopped.
    """
    files = [folder / f"part{k}.db" for k in range(len(ranges))]
    jobs = [{"other": str(other), "mine": str(mine), "lo": lo, "hi": hi, "out": str(f), "origin": origin,
             "limits": dataclasses.asdict(limits), "parent_pid": os.getpid()}
            for (lo, hi), f in zip(ranges, files, strict=True)]
    workers = [_start(job) for job in jobs[1:]]
    try:
        runs = set(stage(**{**jobs[0], "parent_pid": None}))
        for worker in workers:
            runs.update(_result(worker))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
            worker.wait()
    return files, runs


def _start(job: dict) -> subprocess.Popen:
    """A fresh interpreter running `main`: unlike multiprocessing's spawn it never re-runs the
    caller's script (a merge called from a script without a __main__ guard would fork forever),
    and the job and its answer travel as JSON. It starts isolated from the current folder, and
    stops by itself if this process dies (its progress check watches its parent)."""
    return subprocess.Popen(python_argv("-c", "from hetprof.profiles.staging import main; main()", json.dumps(job)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                            cwd=safe_cwd())


def _result(worker: subprocess.Popen) -> list[str]:
    out, err = worker.communicate()
    try:
        answer = json.loads(out.splitlines()[-1]) if out.strip() else {}
    except ValueError:
        answer = {}
    if "refused" in answer:
        raise ImportRefused(answer["refused"])
    if "unreadable" in answer:
        raise sqlite3.DatabaseError(answer["unreadable"])
    if worker.returncode != 0 or "runs" not in answer:
        raise ProfileDBError(f"a merge worker failed (exit {worker.returncode}): {err.strip()[-500:]}")
    return answer["runs"]


def main() -> None:
    """A worker: stage the job given as JSON in argv[1]; print the outcome as one JSON line."""
    job = json.loads(sys.argv[1])
    try:
        answer: dict[str, object] = {"runs": stage(**job)}
    except ImportRefused as exc:
        answer = {"refused": str(exc)}
    except sqlite3.DatabaseError as exc:
        answer = {"unreadable": str(exc)}
    print(json.dumps(answer))


SCRATCH_PREFIX = ".hetprof-merge-"


@contextmanager
def scratch_folder(db_path: Path) -> Iterator[Path]:
    """A private folder beside the database for a merge's snapshot and staging files, removed on every
    exit (an exception, Ctrl-C, SIGTERM via `exit_on_signals`, interpreter exit). A merge killed
    outright (SIGKILL) leaves its folder; the next merge into the same database removes it, as the
    pid in its name is gone."""
    parent = db_path.resolve().parent
    _sweep_stale(parent)
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=parent) as folder:
        yield Path(folder)


def _sweep_stale(parent: Path) -> None:
    for entry in parent.glob(SCRATCH_PREFIX + "*"):
        pid = entry.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and entry.is_dir() and not entry.is_symlink() and not _alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
