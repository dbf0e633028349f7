"""Reading another team's database for `merge`: a private snapshot, real tables only, every read bounded.

The file may still be written by its owner, or written by an adversary. So it is first copied,
in one read transaction, into a snapshot inside the merge's scratch folder: one consistent state
that nobody else writes, which the checking processes all read (a live database merges). Then only
real tables of the expected columns are read (a view, a virtual table or a generated column named
like ours is refused: reading one runs the writer's SQL), with schema-defined functions off, and
every query runs under the merge's deadline, row cap and row size (see `bounds`).
"""

from __future__ import annotations

import dataclasses
import shutil
import sqlite3
import time
from pathlib import Path

from hetprof.errors import ImportRefused
from hetprof.profiles import staging
from hetprof.profiles.bounds import Watch, regular_companions
from hetprof.profiles.rowchecks import check_row
from hetprof.profiles.schema import TABLES
from hetprof.profiles.structure import check_tables


def take_snapshot(other: Path, folder: Path, watch: Watch) -> Path:
    """Copy `other` as it is now (one read transaction) to `folder`; refuse a file past the byte cap."""
    size = other.stat().st_size
    wal = other.with_name(other.name + "-wal")
    size += sum(c.stat().st_size for c in regular_companions(other) if c == wal)
    if size > watch.limits.max_bytes:
        raise ImportRefused(f"{watch.origin}: {size:,} bytes is more than the {watch.limits.max_bytes:,} "
                            "bytes allowed (--max-bytes)")
    snapshot = folder / "source.db"
    with watch.guard():
        src = watch.attach(sqlite3.connect(staging.read_only_uri(other), uri=True, isolation_level=None))
        try:
            src.execute("BEGIN")
            src.execute("SELECT COUNT(*) FROM main.sqlite_master").fetchone()  # the read transaction starts
            if not wal.exists() or wal.stat().st_size == 0:
                # Nothing in a WAL: while this read transaction lasts no writer can change the file
                # (a checkpoint cannot pass this reader's mark), so a plain copy is the snapshot.
                shutil.copyfile(other, snapshot)
            else:
                src.execute("COMMIT")
                dst = sqlite3.connect(snapshot)
                try:
                    src.backup(dst)  # one step: pages copied from one read transaction
                finally:
                    dst.close()
        finally:
            src.close()
        dst = sqlite3.connect(snapshot)
        try:
            dst.execute("PRAGMA journal_mode=DELETE")  # the copy stands alone, without a -wal beside it
        finally:
            dst.close()
    return snapshot


def count_rows(src: sqlite3.Connection, watch: Watch) -> None:
    """Refuse a source past the row cap before reading any row into memory."""
    total = 0
    for name in TABLES:
        total += src.execute(f"SELECT COUNT(*) FROM main.{name}").fetchone()[0]
        if total > watch.limits.max_rows:
            break
    watch.count(total)


def check_sample_places(src: sqlite3.Connection, origin: str) -> None:
    """No two samples of the source share a run and a seq (a run's samples are numbered once)."""
    twice = src.execute("SELECT run_id, seq FROM main.samples GROUP BY run_id, seq HAVING COUNT(*) > 1 "
                        "LIMIT 1").fetchone()
    if twice:
        raise ImportRefused(f"{origin}: two samples of run {str(twice[0])[:12]}… share seq {twice[1]}")


def read_other(db_path: Path, snapshot: Path, folder: Path,
               watch: Watch) -> tuple[dict[str, list[tuple]], list[Path], set[str]]:
    """Every row of the snapshot that this database lacks, checked: in memory, or staged under `folder`.
    Staging helpers get what is left of `watch`'s deadline."""
    origin = watch.origin
    with watch.guard():
        src = staging.open_snapshot(snapshot, db_path, watch)
        try:
            check_tables(src, origin)
            count_rows(src, watch)
            check_sample_places(src, origin)
            ranges = staging.plan(src)
            rows: dict[str, list[tuple]] = {}
            for name, table in TABLES.items():
                if name == "samples":
                    rows[name] = [] if ranges else _samples_here(src, origin)
                    continue
                rows[name] = src.execute(staging.missing_rows_sql(table)).fetchall()
                for row in rows[name]:
                    check_row(table, row, f"{origin}: {name} row {str(row[0])[:16]!r}")
        finally:
            src.close()
    if not ranges:
        return rows, [], set()
    left = dataclasses.replace(watch.limits, deadline_s=max(1e-3, watch.deadline - time.monotonic()))
    staged, runs = staging.stage_all(snapshot, db_path, ranges, folder, origin, left)
    return rows, staged, runs


def _samples_here(src: sqlite3.Connection, origin: str) -> list[tuple]:
    """The new samples of a small source, checked in this process."""
    width = len(TABLES["samples"].column_names)
    sizes = staging.run_sizes(src)
    return [staging.checked_sample(row, width, sizes, origin) for row in src.execute(staging.new_samples_sql())]
