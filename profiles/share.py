"""Moving profiles between teams: export, import and merge.

The portable file is gzip'd JSON lines: a header line (format, schema version), one line per row
(`[table, id, ...values]`), and a trailer line with the row counts and a sha256 over the row lines.
It is plain data: no pickle, nothing that is ever executed. An import reads and checks the whole
file (format, version, checksum, every row's types, limits and content address, references) before
it writes anything, then inserts it in one transaction, so a refused file leaves the database exactly
as it was. Because rows are content-addressed, importing or merging the same data twice adds nothing.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sqlite3
import tempfile
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from hetprof import __version__
from hetprof.errors import ImportRefused
from hetprof.profiles import stage
from hetprof.profiles.db import ProfileDB
from hetprof.profiles.schema import SCHEMA_VERSION, TABLES, read_version
from hetprof.profiles.stage import read_only_uri
from hetprof.profiles.validate import check_row

FORMAT = "hetprof-profile-export"
FORMAT_VERSION = 1
MAX_LINE = 16 * 1024 * 1024
# (table, column) pairs that must name a row present in the file or the database.
REFERENCES = [(t.name, i + 1, c.ref, c.nullable) for t in TABLES.values()
              for i, c in enumerate(t.columns) if c.ref]


# ---- export ---------------------------------------------------------------------------------

def _selected_rows(db: ProfileDB, device: str | None, host: str | None) -> Iterator[tuple[str, tuple]]:
    """Rows to export, parents before children; filters keep every reference inside the file."""
    conn = db.conn
    if device is None and host is None:
        for name, table in TABLES.items():  # key order: the file is deterministic, read without a sort
            for row in conn.execute(f"SELECT * FROM {name} ORDER BY {table.key_sql}"):
                yield name, row
        return
    dev_where, dev_args = [], []
    if device is not None:
        dev_where.append("(id LIKE ? OR catalog_type = ? OR name = ?)")
        dev_args += [device + "%", device, device]
    if host is not None:
        dev_where.append("host = ?")
        dev_args.append(host)
    devices = conn.execute(f"SELECT * FROM devices WHERE {' AND '.join(dev_where)} ORDER BY id",
                           dev_args).fetchall()
    dev_ids = [d[0] for d in devices]
    for d in devices:
        yield "devices", d
    run_rows = []
    for chunk in _chunks(dev_ids):
        run_rows += conn.execute(f"SELECT * FROM runs WHERE device_id IN ({','.join('?' * len(chunk))})",
                                 chunk).fetchall()
    if device is None:  # host-level benchmarks (links) have no device
        run_rows += conn.execute("SELECT * FROM runs WHERE device_id IS NULL AND host = ?", (host,)).fetchall()
    run_rows.sort()
    run_ids = [r[0] for r in run_rows]
    for r in run_rows:
        yield "runs", r
    for chunk in _chunks(run_ids):
        for s in conn.execute(f"SELECT * FROM samples WHERE run_id IN ({','.join('?' * len(chunk))}) "
                              f"ORDER BY {TABLES['samples'].key_sql}", chunk):
            yield "samples", s
    if device is None:
        for link in conn.execute("SELECT * FROM links WHERE src_host = ? OR dst_host = ? ORDER BY id",
                                 (host, host)):
            if link[8] is None or link[8] in set(run_ids):
                yield "links", link
        for rec in conn.execute("SELECT * FROM run_records WHERE host = ? ORDER BY id", (host,)):
            yield "run_records", rec


def _chunks(ids: list[str], size: int = 500) -> Iterator[list[str]]:
    for i in range(0, len(ids), size):
        yield ids[i:i + size]


def export(db: ProfileDB, out: str | Path, device: str | None = None, host: str | None = None) -> dict[str, int]:
    """Write the database (or the rows of one device/host) to a portable file; returns row counts."""
    out = Path(out)
    tmp = out.with_name(out.name + ".partial")
    counts = {name: 0 for name in TABLES}
    body = hashlib.sha256()
    header = {"format": FORMAT, "format_version": FORMAT_VERSION, "schema_version": SCHEMA_VERSION,
              "tool_version": __version__, "exported_at": time.time(),
              "filter": {"device": device, "host": host}}
    with gzip.open(tmp, "wb", compresslevel=6) as f:
        f.write((json.dumps(header, sort_keys=True) + "\n").encode())
        for name, row in _selected_rows(db, device, host):
            line = (json.dumps([name, *row], ensure_ascii=False, separators=(",", ":"), allow_nan=False)
                    + "\n").encode()
            body.update(line)
            f.write(line)
            counts[name] += 1
        f.write((json.dumps({"end": True, "counts": counts, "body_sha256": body.hexdigest()}) + "\n").encode())
    os.replace(tmp, out)
    return counts


# ---- import ---------------------------------------------------------------------------------

def _read_lines(path: Path) -> Iterator[bytes]:
    try:
        with gzip.open(path, "rb") as f:
            while True:
                line = f.readline(MAX_LINE + 1)
                if not line:
                    return
                if len(line) > MAX_LINE:
                    raise ImportRefused(f"{path}: a line is longer than {MAX_LINE // 2**20} MiB")
                yield line
    except (OSError, EOFError, zlib.error) as exc:
        raise ImportRefused(f"{path}: not a readable hetprof export (gzip: {exc})") from None


def _parse(line: bytes, where: str) -> object:
    try:
        return json.loads(line, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ImportRefused(f"{where}: not valid JSON ({str(exc)[:80]})") from None


def read_export(path: str | Path) -> dict[str, list[tuple]]:
    """Parse and check a whole export file; returns its rows per table or raises ImportRefused."""
    path = Path(path)
    if not path.is_file():
        raise ImportRefused(f"{path}: no such file")
    lines = _read_lines(path)
    first = next(lines, None)
    if first is None:
        raise ImportRefused(f"{path}: empty file")
    header = _parse(first, f"{path}: header")
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ImportRefused(f"{path}: not a hetprof profile export (header has no format '{FORMAT}')")
    if header.get("format_version") != FORMAT_VERSION:
        raise ImportRefused(f"{path}: export format version {header.get('format_version')!r} is not "
                            f"{FORMAT_VERSION}")
    schema = header.get("schema_version")
    if not isinstance(schema, int) or not 1 <= schema <= SCHEMA_VERSION:
        raise ImportRefused(f"{path}: schema version {schema!r} is not one this hetprof reads "
                            f"(1..{SCHEMA_VERSION}); upgrade hetprof")
    rows: dict[str, list[tuple]] = {name: [] for name in TABLES}
    body = hashlib.sha256()
    trailer = None
    for n, line in enumerate(lines, start=2):
        where = f"{path}: line {n}"
        if trailer is not None:
            raise ImportRefused(f"{where}: data after the end marker")
        item = _parse(line, where)
        if isinstance(item, dict):
            trailer = item
            continue
        body.update(line)
        if not isinstance(item, list) or not item or item[0] not in TABLES:
            raise ImportRefused(f"{where}: expected [table, id, ...] with a known table")
        table = TABLES[item[0]]
        check_row(table, item[1:], where)
        rows[table.name].append(tuple(item[1:]))
    if trailer is None or trailer.get("end") is not True:
        raise ImportRefused(f"{path}: truncated (no end marker)")
    if trailer.get("body_sha256") != body.hexdigest():
        raise ImportRefused(f"{path}: checksum mismatch — the file was altered or damaged")
    counts = {name: len(r) for name, r in rows.items()}
    if trailer.get("counts") != counts:
        raise ImportRefused(f"{path}: row counts {counts} differ from the declared {trailer.get('counts')}")
    return rows


def _check_references(db: ProfileDB, rows: dict[str, list[tuple]], origin: str,
                      staged_runs: set[str] | None = None) -> None:
    """Every reference names a row in the incoming data or in the database; `staged_runs` are the
    run ids of samples that a merge staged on disk instead of holding in `rows`."""
    ids = {name: {r[0] for r in table_rows} for name, table_rows in rows.items()}
    for table, col, ref, _nullable in REFERENCES:
        wanted = {r[col] for r in rows[table] if r[col] is not None}
        if table == "samples" and staged_runs:
            wanted |= staged_runs
        missing = wanted - ids[ref]
        for chunk in _chunks(sorted(missing)):
            found = {x for (x,) in db.conn.execute(
                f"SELECT id FROM {ref} WHERE id IN ({','.join('?' * len(chunk))})", chunk)}
            absent = set(chunk) - found
            if absent:
                raise ImportRefused(f"{origin}: {table} rows reference {ref} {sorted(absent)[0][:12]}… "
                                    "which is neither in the file nor in the database")


def _insert_all(db: ProfileDB, rows: dict[str, list[tuple]], kind: str, origin: str,
                staged: Sequence[Path] = ()) -> dict[str, int]:
    """Add the rows (and any staged samples) in one transaction, parents first; record the origin."""
    aliases = [f"staged{k}" for k in range(len(staged))]
    cols = ", ".join(TABLES["samples"].column_names)

    def body(conn: sqlite3.Connection) -> dict[str, int]:
        added = {}
        for name in TABLES:  # parents first
            before = conn.total_changes
            conn.executemany(TABLES[name].insert_sql(), rows[name])
            if name == "samples":
                for alias in aliases:
                    conn.execute(f"INSERT OR IGNORE INTO main.samples ({cols}) SELECT {cols} FROM {alias}.samples")
            added[name] = conn.total_changes - before
        conn.execute("INSERT INTO origins (kind, origin, at, added) VALUES (?, ?, ?, ?)",
                     (kind, origin, time.time(), json.dumps(added, sort_keys=True)))
        return added

    for alias, path in zip(aliases, staged, strict=True):  # outside the transaction, as ATTACH must be
        db.conn.execute("ATTACH DATABASE ? AS " + alias, (read_only_uri(path),))
    try:
        return db.write(body)
    finally:
        for alias in aliases:
            db.conn.execute(f"DETACH DATABASE {alias}")


def import_file(db: ProfileDB, path: str | Path) -> dict[str, int]:
    """Validate a whole export, then add it all in one transaction. Returns rows added per table."""
    rows = read_export(path)
    _check_references(db, rows, str(path))
    return _insert_all(db, rows, "import", str(Path(path).resolve()))


# ---- merge ----------------------------------------------------------------------------------

def merge(db: ProfileDB, other: str | Path) -> dict[str, int]:
    """Add every row of another database that this one lacks; idempotent; validated like an import.

    Large samples tables are checked by two processes into staging files (see `stage`); the
    rest, and small databases, are checked here and held in memory until the one transaction.
    """
    other = Path(other)
    if not other.is_file():
        raise ImportRefused(f"{other}: no such file")
    if other.resolve() == db.path.resolve():
        raise ImportRefused(f"{other}: cannot merge a database into itself")
    with tempfile.TemporaryDirectory(prefix="hetprof-merge-") as folder:
        try:
            rows, staged, staged_runs = _read_other(db, other, Path(folder))
        except sqlite3.DatabaseError as exc:
            raise ImportRefused(f"{other}: not a readable profile database ({exc})") from None
        _check_references(db, rows, str(other), staged_runs)
        return _insert_all(db, rows, "merge", str(other.resolve()), staged)


def _read_other(db: ProfileDB, other: Path, folder: Path) -> tuple[dict[str, list[tuple]], list[Path], set[str]]:
    """Every row of `other` that this database lacks, checked: in memory, or staged under `folder`."""
    src = sqlite3.connect(read_only_uri(other), uri=True)
    try:
        version = read_version(src)
        if not 1 <= version <= SCHEMA_VERSION:
            raise ImportRefused(f"{other}: schema version {version} is not one this hetprof reads "
                                f"(1..{SCHEMA_VERSION})")
        src.execute("ATTACH DATABASE ? AS mine", (read_only_uri(db.path),))
        for name, table in TABLES.items():
            cols = [r[1] for r in src.execute(f"PRAGMA main.table_info({name})")]
            if cols != table.column_names:
                raise ImportRefused(f"{other}: table {name} has columns {cols}, expected {table.column_names}")
        ranges = stage.plan(src)
        rows: dict[str, list[tuple]] = {}
        for name, table in TABLES.items():
            if name == "samples" and ranges:
                rows[name] = []
                continue
            rows[name] = src.execute(stage.missing_rows_sql(table)).fetchall()
            for row in rows[name]:
                check_row(table, row, f"{other}: {name} row {str(row[0])[:16]!r}")
    finally:
        src.close()
    if not ranges:
        return rows, [], set()
    staged, runs = stage.stage_all(other, db.path, ranges, folder)
    return rows, staged, runs
