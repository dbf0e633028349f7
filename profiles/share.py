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
import itertools
import json
import os
import sqlite3
import stat
import tempfile
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from hetprof import __version__
from hetprof.display import visible
from hetprof.errors import ImportRefused, ProfileDBError
from hetprof.profiles import source, staging
from hetprof.profiles.bounds import EXPANSION_FREE_BYTES, Limits, Watch, open_regular, regular_file
from hetprof.profiles.db import ProfileDB
from hetprof.profiles.rowchecks import check_row
from hetprof.profiles.samplekeys import check_sample_places
from hetprof.profiles.schema import SCHEMA_VERSION, TABLES
from hetprof.profiles.staging import read_only_uri

FORMAT = "hetprof-profile-export"
FORMAT_VERSION = 1
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
        # Records written before the host was stored have none: theirs is the host of their devices.
        for rec in conn.execute(
                "SELECT * FROM run_records WHERE host = ? OR (coalesce(host, '') = '' AND EXISTS "
                "(SELECT 1 FROM json_each(device_ids) WHERE substr(value, 1, ?) = ?)) ORDER BY id",
                (host, len(host) + 1, host + ":")):
            yield "run_records", rec


def _chunks(ids: list[str], size: int = 500) -> Iterator[list[str]]:
    for i in range(0, len(ids), size):
        yield ids[i:i + size]


def export(db: ProfileDB, out: str | Path, device: str | None = None, host: str | None = None) -> dict[str, int]:
    """Write the database (or the rows of one device/host) to a portable file; returns row counts."""
    out = Path(out)
    counts = {name: 0 for name in TABLES}
    body = hashlib.sha256()
    header = {"format": FORMAT, "format_version": FORMAT_VERSION, "schema_version": SCHEMA_VERSION,
              "tool_version": __version__, "exported_at": time.time(),
              "filter": {"device": device, "host": host}}
    with _exclusive_partial(out) as (tmp, raw), gzip.open(raw, "wb", compresslevel=6) as f:
        f.write((json.dumps(header, sort_keys=True) + "\n").encode())
        for name, row in _importable(db, _selected_rows(db, device, host)):
            line = (json.dumps([name, *row], ensure_ascii=False, separators=(",", ":"), allow_nan=False)
                    + "\n").encode()  # a non-finite number never gets here: `_importable` refused it
            body.update(line)
            f.write(line)
            counts[name] += 1
        f.write((json.dumps({"end": True, "counts": counts, "body_sha256": body.hexdigest()}) + "\n").encode())
        f.close()
        _replace_regular(tmp, out)
    return counts


def _importable(db: ProfileDB, rows: Iterator[tuple[str, tuple]]) -> Iterator[tuple[str, tuple]]:
    """The rows, each checked as an import checks it: an export holds only what an import accepts, so
    a database edited outside hetprof (a bad value, a reference to a deleted row) is refused here,
    naming the row, instead of leaving its damage to whoever imports the file. Parents come first."""
    referenced = {ref for _, _, ref, _ in REFERENCES}
    written: dict[str, set[str]] = {name: set() for name in referenced}
    for name, row in rows:
        where = f"{visible(db.path)}: {name} row {visible(row[0])[:16]!r}"
        try:
            check_row(TABLES[name], row, where)
        except ImportRefused as exc:
            raise ProfileDBError(f"{exc} (written outside hetprof; an import would refuse it)") from None
        for table, col, ref, _nullable in REFERENCES:
            if table == name and row[col] is not None and row[col] not in written[ref]:
                raise ProfileDBError(f"{where} references {ref} {visible(row[col])[:12]!r}… which the "
                                     "database does not hold (written outside hetprof; an import would refuse it)")
        if name in written:
            written[name].add(row[0])
        yield name, row


@contextmanager
def _exclusive_partial(out: Path) -> Iterator[tuple[Path, BinaryIO]]:
    """A new file beside `out` that this call created (O_EXCL, never following a link): a planted
    `FILE.partial` symlink or a file someone else holds open cannot receive the export. Removed on
    failure; on success the caller has renamed it over `out`."""
    try:
        fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)  # O_EXCL, 0600
    except OSError as exc:
        raise ProfileDBError(f"{out}: cannot write there ({exc.strerror})") from None
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as raw:
            yield tmp, raw
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _replace_regular(tmp: Path, out: Path) -> None:
    """Rename the finished export over `out`: a rename replaces a link or file at `out`, never writes
    through it. Refuses to replace what is not a plain file (a directory, a FIFO, a device)."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        st = None
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise ProfileDBError(f"{out}: exists and is not a regular file; not replacing it")
    os.chmod(tmp, 0o644 & ~_umask())
    os.replace(tmp, out)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---- import ---------------------------------------------------------------------------------

def _read_lines(path: Path, limits: Limits) -> Iterator[bytes]:
    """The decompressed lines of an export, refusing past the byte, row and line-size caps as it reads."""
    total = 0
    try:
        with open_regular(path) as raw, gzip.open(raw, "rb") as f:
            for n in itertools.count(1):
                line = f.readline(limits.max_row_bytes + 1)
                if not line:
                    return
                total += len(line)
                if total > EXPANSION_FREE_BYTES and total > limits.max_expansion * raw.tell():
                    raise ImportRefused(f"{path}: {total:,} bytes uncompressed from the first {raw.tell():,} bytes "
                                        f"of the file, more than {limits.max_expansion:g} times as many "
                                        "(--max-expansion)")
                if len(line) > limits.max_row_bytes:
                    raise ImportRefused(f"{path}: line {n} is longer than {limits.max_row_bytes:,} bytes "
                                        "(--max-row-bytes)")
                if total > limits.max_bytes:
                    raise ImportRefused(f"{path}: more than {limits.max_bytes:,} bytes uncompressed (--max-bytes)")
                if n > limits.max_rows + 2:  # the header and trailer lines are not rows
                    raise ImportRefused(f"{path}: more than {limits.max_rows:,} rows (--max-rows)")
                yield line
    except (OSError, EOFError, zlib.error) as exc:
        raise ImportRefused(f"{path}: not a readable hetprof export (gzip: {exc})") from None


def _no_constant(name: str) -> None:
    raise ValueError(f"JSON constant {name} is not allowed")


# One decoder for every line: json.loads with a hook builds a new decoder per call.
_LINE_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def _parse(line: bytes, where: str) -> object:
    try:
        return _LINE_DECODER.decode(line.decode())
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ImportRefused(f"{where}: not valid JSON ({str(exc)[:80]})") from None


def _read_header(path: Path, lines: Iterator[bytes]) -> None:
    first = next(lines, None)
    if first is None:
        raise ImportRefused(f"{path}: empty file")
    header = _parse(first, f"{path}: header")
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ImportRefused(f"{path}: not a hetprof profile export (header has no format '{FORMAT}')")
    if header.get("format_version") != FORMAT_VERSION:
        raise ImportRefused(f"{path}: export format version {str(header.get('format_version'))[:20]!r} is not "
                            f"{FORMAT_VERSION}")
    schema = header.get("schema_version")
    if type(schema) is not int or not 1 <= schema <= SCHEMA_VERSION:
        raise ImportRefused(f"{path}: schema version {str(schema)[:20]!r} is not one this hetprof reads "
                            f"(1..{SCHEMA_VERSION}); upgrade hetprof")


def read_export(path: str | Path, limits: Limits | None = None) -> dict[str, list[tuple]]:
    """Parse and check a whole export file; returns its rows per table or raises ImportRefused."""
    path = Path(path)
    limits = limits or Limits()
    watch = Watch(limits, str(path))
    lines = _read_lines(path, limits)
    _read_header(path, lines)
    rows: dict[str, list[tuple]] = {name: [] for name in TABLES}
    seen: set[str] = set()
    body = hashlib.sha256()
    trailer = None
    for n, line in enumerate(lines, start=2):
        where = f"{path}: line {n}"
        if trailer is not None:
            raise ImportRefused(f"{where}: data after the end marker")
        if n % 10_000 == 0:
            watch.count(0)  # the deadline
        item = _parse(line, where)
        if isinstance(item, dict):
            trailer = item
            continue
        body.update(line)
        if not isinstance(item, list) or not item or type(item[0]) is not str or item[0] not in TABLES:
            raise ImportRefused(f"{where}: expected [table, id, ...] with a known table")
        table = TABLES[item[0]]
        check_row(table, item[1:], where)
        if item[1] in seen:  # an export holds each row once; a repeat only inflates the file
            raise ImportRefused(f"{where}: row {item[1][:16]}… appears twice")
        seen.add(item[1])
        rows[table.name].append(tuple(item[1:]))
    if trailer is None or trailer.get("end") is not True:
        raise ImportRefused(f"{path}: truncated (no end marker)")
    if trailer.get("body_sha256") != body.hexdigest():
        raise ImportRefused(f"{path}: checksum mismatch — the file was altered or damaged")
    counts = {name: len(r) for name, r in rows.items()}
    if trailer.get("counts") != counts:
        raise ImportRefused(f"{path}: row counts {counts} differ from the declared {str(trailer.get('counts'))[:200]}")
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


def import_file(db: ProfileDB, path: str | Path, limits: Limits | None = None) -> dict[str, int]:
    """Validate a whole export, then add it all in one transaction. Returns rows added per table."""
    rows = read_export(path, limits)
    _check_references(db, rows, str(path))
    check_sample_places(db, rows, str(path))
    return _insert_all(db, rows, "import", str(Path(path).resolve()))


# ---- merge ----------------------------------------------------------------------------------

def merge(db: ProfileDB, other: str | Path, limits: Limits | None = None) -> dict[str, int]:
    """Add every row of another database that this one lacks; idempotent; validated like an import.

    The source is read from a private snapshot (see `source`); large samples tables are checked by
    two processes into staging files (see `staging`); the rest, and small databases, are checked here
    and held in memory until the one transaction.
    """
    limits = limits or Limits()
    other = Path(other)
    regular_file(other)
    if other.resolve() == db.path.resolve():
        raise ImportRefused(f"{other}: cannot merge a database into itself")
    watch = Watch(limits, str(other))  # one deadline for the snapshot, the checks and the helpers
    with staging.scratch_folder(db.path) as folder:
        snapshot = source.take_snapshot(other, folder, watch)
        rows, staged, staged_runs = source.read_other(db.path, snapshot, folder, watch)
        _check_references(db, rows, str(other), staged_runs)
        return _insert_all(db, rows, "merge", str(other.resolve()), staged)
