"""The profile database: one SQLite file, WAL, content-addressed rows, pandas views.

Why SQLite: a team's profile is a single file that can be copied, mailed and merged, and WAL lets
several profiler processes write while a planner reads. Every write is one IMMEDIATE transaction
retried with backoff, so a busy database makes a writer wait instead of failing ("database is
locked" never reaches the user), and a writer killed mid-batch leaves nothing half-written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import socket
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from hetprof import __version__
from hetprof.display import visible
from hetprof.errors import ProfileDBError
from hetprof.paths import default_db_path
from hetprof.profiles.bounds import regular_database
from hetprof.profiles.content import canonical_json, content_id, flat_json, sample_id
from hetprof.profiles.rowchecks import VALIDATORS, Invalid, check_flat, check_values
from hetprof.profiles.schema import SCHEMA_VERSION, TABLES, migrate, read_version
from hetprof.profiles.structure import check_database

T = TypeVar("T")
BUSY_TIMEOUT_MS = 5_000
RETRY_FOR_S = 120.0
CACHE_KIB = 256 * 1024
WAL_CHECKPOINT_PAGES = 16384


@dataclasses.dataclass
class DeviceInfo:
    """A device's fingerprint: what makes two measurements comparable."""

    name: str
    kind: str  # "cuda" | "cpu" | "rocm"
    host: str = dataclasses.field(default_factory=socket.gethostname)
    catalog_type: str | None = None
    memory_bytes: int | None = None
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    uuid: str | None = None
    extra: dict = dataclasses.field(default_factory=dict)
    source: str = "measured"


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


class ProfileDB:
    """Read and write one profile database. Use as a context manager; one instance per process."""

    def __init__(self, path: str | Path | None = None, *, readonly: bool = False):
        self.path = Path(path) if path is not None else default_db_path()
        if readonly and not self.path.exists():
            raise ProfileDBError(f"{self.path}: no such profile database")
        regular_database(self.path)  # a FIFO would hang SQLite, /dev/null would end in a traceback
        if not readonly:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if readonly:
                uri = f"{self.path.resolve().as_uri()}?mode=ro"
                self.conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
            else:
                self.conn = sqlite3.connect(self.path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
        except sqlite3.DatabaseError as exc:
            raise ProfileDBError(f"{self.path}: not a readable profile database ({exc})") from None
        except UnicodeDecodeError:  # SQLite's own message quoted a corrupt schema's bytes
            raise ProfileDBError(f"{self.path}: not a readable profile database (malformed schema)") from None
        try:
            self._open(readonly)
        except BaseException:
            self.conn.close()
            raise

    def _open(self, readonly: bool) -> None:
        """Settings, the schema check (before anything else reads or writes the file), migrations."""
        try:
            self.conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            self.conn.execute("PRAGMA trusted_schema=OFF")  # SQL stored in the file calls no function with side effects
            # Row ids are random hashes, so every insert lands at a random place in the id index;
            # with SQLite's default 2 MB page cache a 10⁶-sample database thrashes. The cache grows
            # only as pages are touched, so a small database pays nothing for the larger bound.
            self.conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            # The file may come from someone else: only hetprof's own tables and indexes, checked before
            # the first write (a trigger would fire on it) and the first read (a view would run).
            version = self._retry(lambda: check_database(self.conn, visible(self.path)))
            if not readonly:
                self._retry(lambda: self.conn.execute("PRAGMA journal_mode=WAL"))
                self.conn.execute("PRAGMA synchronous=NORMAL")
                # Random-hash ids dirty pages all over the indexes; checkpointing the WAL every 64 MB
                # instead of every 4 MB copies each hot page back once instead of many times.
                self.conn.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
            self.conn.execute("PRAGMA foreign_keys=ON")
        except sqlite3.DatabaseError as exc:
            raise ProfileDBError(f"{self.path}: not a readable profile database ({exc})") from None
        except UnicodeDecodeError:  # SQLite's own message quoted a corrupt schema's bytes
            raise ProfileDBError(f"{self.path}: not a readable profile database (malformed schema)") from None
        if version < 0 or version > SCHEMA_VERSION:
            raise ProfileDBError(
                f"{self.path}: schema version {version} is newer than this hetprof understands "
                f"({SCHEMA_VERSION}); upgrade hetprof to read it")
        if version < SCHEMA_VERSION:
            if readonly:
                raise ProfileDBError(f"{self.path}: schema version {version} needs migrating to {SCHEMA_VERSION}, which "
                                     "commands that only read never do; a command that writes to it (`hetprof fit`, "
                                     "`hetprof db import`) migrates it")
            self.write(lambda c: migrate(c, read_version(c)))

    # ---- plumbing --------------------------------------------------------------------------

    def __enter__(self) -> ProfileDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()

    def _retry(self, fn: Callable[[], T]) -> T:
        deadline = time.monotonic() + RETRY_FOR_S
        delay = 0.005
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() > deadline:
                    if _is_busy(exc):
                        raise ProfileDBError(f"{self.path}: busy for {RETRY_FOR_S:.0f} s; "
                                             "another process holds it") from None
                    raise
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.5)

    def write(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """Run `body` in one IMMEDIATE transaction: all of it lands, or none of it."""

        def attempt() -> T:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                result = body(self.conn)
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")
            return result

        return self._retry(attempt)

    @staticmethod
    def row(table: str, values: list | tuple) -> tuple:
        """A validated row with its content address first."""
        t = TABLES[table]
        try:
            check_values(t, values)
            return (content_id(table, values, t.json_flags), *values)
        except Invalid as exc:
            raise ProfileDBError(str(exc)) from None
        except UnicodeEncodeError:
            raise ProfileDBError(f"{table}: text is not valid Unicode (a lone surrogate)") from None

    @staticmethod
    def _sample_row(benchmark: str, run_id: str, seq: int, params: dict, metrics: dict) -> tuple:
        """The hot path of a profiler: checks the dicts directly instead of re-parsing their JSON."""
        for column, value, numbers_only in (("params", params, False), ("metrics", metrics, True)):
            try:
                check_flat(value, numbers_only)
            except Invalid as exc:
                raise ProfileDBError(f"samples.{column} (sample {seq}): {exc}") from None
        if not params.keys().isdisjoint(metrics):
            clash = sorted(params.keys() & metrics.keys())
            raise ProfileDBError(f"{benchmark}: keys {clash} are both a param and a metric")
        values = (run_id, seq, flat_json(params), flat_json(metrics))
        return (sample_id(*values), *values)

    def _insert(self, conn: sqlite3.Connection, table: str, rows: Iterable[tuple]) -> None:
        conn.executemany(TABLES[table].insert_sql(), rows)

    # ---- writes ----------------------------------------------------------------------------

    def add_device(self, info: DeviceInfo) -> str:
        row = self.row("devices", [info.name, info.kind, info.catalog_type, info.memory_bytes, info.host,
                                   info.driver, info.cuda, info.torch, info.uuid,
                                   canonical_json(info.extra), info.source])
        self.write(lambda c: self._insert(c, "devices", [row]))
        return row[0]

    def add_benchmark(self, benchmark: str, device_id: str | None, host: str, params: dict,
                      samples: Iterable[dict], *, source: str = "measured") -> str:
        """One benchmark run and its raw samples, in one transaction. Returns the run id."""
        if not isinstance(samples, list):
            samples = list(samples)
        run = self.row("runs", [benchmark, device_id, host, canonical_json(params), len(samples),
                                __version__, time.time(), source])
        run_id = run[0]

        def sample_rows() -> Iterator[tuple]:
            for seq, s in enumerate(samples):
                yield self._sample_row(benchmark, run_id, seq, s.get("params", {}), s.get("metrics", {}))

        def body(c: sqlite3.Connection) -> None:
            self._insert(c, "runs", [run])
            self._insert(c, "samples", sample_rows())

        self.write(body)
        return run_id

    def add_link(self, src_host: str, dst_host: str, alpha_s: float, beta_Bps: float, *,
                 src_region: str | None = None, dst_region: str | None = None,
                 residual: float | None = None, run_id: str | None = None, source: str = "measured") -> str:
        row = self.row("links", [src_host, dst_host, src_region, dst_region, float(alpha_s), float(beta_Bps),
                                 None if residual is None else float(residual), run_id,
                                 __version__, time.time(), source])
        self.write(lambda c: self._insert(c, "links", [row]))
        return row[0]

    def add_run_records(self, records: Iterable[dict]) -> list[str]:
        """Run records; a record without a host is this host's (the run's leader writes them), so
        `db export --host` finds them."""
        rows = [self.row("run_records", [
            r["run"], r.get("plan_hash", ""), int(r["iteration"]), r["task"], float(r["seconds"]),
            None if r.get("predicted_s") is None else float(r["predicted_s"]),
            canonical_json(list(r.get("device_ids", []))), r.get("host") or socket.gethostname(),
            canonical_json(r.get("extra", {})), __version__, time.time(), "run"]) for r in records]
        self.write(lambda c: self._insert(c, "run_records", rows))
        return [r[0] for r in rows]

    def add_cost_model(self, name: str, task_type: str, family: str, params: dict, metrics: dict,
                       snapshot: str = "") -> str:
        row = self.row("cost_models", [name, task_type, family, canonical_json(params),
                                       canonical_json(metrics), snapshot, __version__, time.time(), "fitted"])
        self.write(lambda c: self._insert(c, "cost_models", [row]))
        return row[0]

    # ---- reads -----------------------------------------------------------------------------

    def stored(self, table: str, column: str, value: object, row_id: object) -> object:
        """A stored value as its readers take it: JSON parsed, a number of its column's range.

        Rows that came through hetprof were checked on the way in; a database written with other tools
        may hold anything, and is refused here in one line instead of a traceback in a reader (a
        `created` of 1e308 is no date). Text needs no check: the schema's TEXT columns hold text, and
        readers print it as text. Stages that judge rows themselves (fitted models) still can.
        """
        col = _COLUMNS[table].get(column)  # None for the id
        if col is None or value is None and col.nullable:
            return value
        try:
            if col.is_json:
                parsed = json.loads(value) if isinstance(value, str) else None
                if not isinstance(parsed, list if col.kind == "json_str_list" else dict):
                    raise Invalid(f"expected {'a JSON list' if col.kind == 'json_str_list' else 'a JSON object'}")
                return parsed
            check = _READ_CHECKS.get(col.kind)
            if check is not None:
                check(value)
            return value
        except (Invalid, ValueError, RecursionError) as exc:
            raise ProfileDBError(f"{visible(self.path)}: {table} row {visible(row_id)[:16]!r}: {table}.{column}: "
                                 f"{str(exc)[:120]} (written outside hetprof)") from None

    def _frame(self, sql: str, args: tuple = (), *, table: str):
        """The rows of `sql` (columns of `table`, its id first) as a DataFrame, each value `stored`-checked."""
        import pandas as pd

        cur = self.conn.execute(sql, args)
        cols = [d[0] for d in cur.description]
        rows = cur.fetchall()
        df = pd.DataFrame(rows, columns=cols)
        for i, name in enumerate(cols):
            col = _COLUMNS[table].get(name)
            if col is not None and (col.is_json or col.kind in _READ_CHECKS):  # text is taken as it is
                df[name] = [self.stored(table, name, row[i], row[0]) for row in rows]
        return df

    def devices(self):
        return self._frame("SELECT * FROM devices ORDER BY host, name", table="devices")

    def links(self):
        return self._frame("SELECT * FROM links ORDER BY created", table="links")

    def runs(self, benchmark: str | None = None):
        where, args = _prefix_filter("benchmark", benchmark)
        return self._frame(f"SELECT * FROM runs {where} ORDER BY created", args, table="runs")

    def run_records(self, run: str | None = None):
        where, args = ("WHERE run = ?", (run,)) if run else ("", ())
        return self._frame(f"SELECT * FROM run_records {where} ORDER BY run, iteration, task", args,
                           table="run_records")

    def cost_models(self, task_type: str | None = None):
        where, args = ("WHERE task_type = ?", (task_type,)) if task_type else ("", ())
        return self._frame(f"SELECT id, name, task_type, family, metrics, snapshot, created FROM cost_models "
                           f"{where} ORDER BY created", args, table="cost_models")

    def get_cost_model(self, model_id: str) -> dict:
        row = self.conn.execute("SELECT id, name, task_type, family, params, metrics, snapshot, created "
                                "FROM cost_models WHERE id LIKE ?", (model_id + "%",)).fetchall()
        if len(row) != 1:
            raise ProfileDBError(f"cost model {model_id!r}: {'no' if not row else 'several'} matching models")
        keys = ("id", "name", "task_type", "family", "params", "metrics", "snapshot", "created")
        return {k: self.stored("cost_models", k, v, row[0][0]) for k, v in zip(keys, row[0], strict=True)}

    def samples(self, benchmark: str | None = None):
        """Raw samples flattened: one row per sample, its params and metrics as columns."""
        import pandas as pd

        where, args = _prefix_filter("r.benchmark", benchmark)
        cur = self.conn.execute(
            "SELECT s.id, s.run_id, r.benchmark, r.device_id, d.name, d.catalog_type, r.host, r.source, s.seq, "
            "s.params, s.metrics FROM samples s JOIN runs r ON r.id = s.run_id "
            f"LEFT JOIN devices d ON d.id = r.device_id {where} ORDER BY r.created, s.seq", args)
        rows = []
        sid = None
        try:
            for sid, rid, bench, dev, dname, ctype, host, source, seq, p, m in cur:
                rows.append({"sample_id": sid, "run_id": rid, "benchmark": bench, "device_id": dev,
                             "device_name": dname, "catalog_type": ctype, "host": host, "run_source": source,
                             "seq": seq, **json.loads(p), **json.loads(m)})
        except (ValueError, TypeError, RecursionError):  # a database written with other tools: checked on this path only
            for column, value in zip(("params", "metrics"), (p, m), strict=True):
                self.stored("samples", column, value, sid)
            raise
        base = ["sample_id", "run_id", "benchmark", "device_id", "device_name", "catalog_type", "host", "run_source",
                "seq"]
        return pd.DataFrame(rows, columns=None if rows else base)

    def snapshot_hash(self) -> str:
        """What a fitted model was trained on: a hash over every sample and link id, in order."""
        h = hashlib.sha256()
        for table in ("samples", "links", "run_records"):
            for (rid,) in self.conn.execute(f"SELECT id FROM {table} ORDER BY id"):
                h.update(rid.encode())
        return h.hexdigest()

    def counts(self) -> dict[str, int]:
        return {name: self.conn.execute(f"SELECT COUNT(*) FROM {name}").fetchone()[0] for name in TABLES}

    def info(self) -> dict[str, Any]:
        counts = self.counts()
        devices = [{"id": i[:12], "name": n, "kind": k, "catalog_type": c, "host": h, "source": s}
                   for i, n, k, c, h, s in self.conn.execute(
                       "SELECT id, name, kind, catalog_type, host, source FROM devices ORDER BY host, name")]
        hosts = sorted({r[0] for r in self.conn.execute(
            "SELECT host FROM devices UNION SELECT host FROM runs UNION SELECT src_host FROM links "
            "UNION SELECT dst_host FROM links")})
        benchmarks = dict(self.conn.execute(
            "SELECT r.benchmark, COUNT(s.id) FROM runs r LEFT JOIN samples s ON s.run_id = r.id "
            "GROUP BY r.benchmark ORDER BY r.benchmark").fetchall())
        origins = [self._origin(*row) for row in
                   self.conn.execute("SELECT seq, kind, origin, at, added FROM origins ORDER BY seq")]
        return {"path": str(self.path), "schema_version": read_version(self.conn), "counts": counts,
                "devices": devices, "hosts": hosts, "benchmarks": benchmarks, "origins": origins}

    def _origin(self, seq: object, kind: object, origin: object, at: object, added: object) -> dict[str, Any]:
        """One row of `origins` (never content-checked: this copy's own history), refused unless readable."""
        try:
            if kind not in ("import", "merge") or not isinstance(origin, str):
                raise Invalid(f"expected kind import or merge and a path, got {visible(kind)[:20]!r}")
            VALIDATORS["time"](at)
            counts = json.loads(added) if isinstance(added, str) else None
            if not isinstance(counts, dict) or not all(type(v) is int for v in counts.values()):
                raise Invalid("added: expected a JSON object of row counts")
        except (Invalid, ValueError, RecursionError) as exc:
            raise ProfileDBError(f"{visible(self.path)}: origins row {visible(seq)[:12]}: {str(exc)[:120]} "
                                 "(written outside hetprof)") from None
        return {"kind": kind, "origin": origin, "at": at, "added": counts}

    def dump(self) -> dict[str, list[tuple]]:
        """Every content row, sorted: what two databases must share to be 'the same'."""
        return {name: sorted(self.conn.execute(f"SELECT * FROM {name}").fetchall()) for name in TABLES}


_COLUMNS = {t.name: {c.name: c for c in t.columns} for t in TABLES.values()}
# What a reader needs of a stored number: its type, and for a time, a date (rowchecks' rules for the kind).
_READ_CHECKS = {"count": VALIDATORS["int"], "int": VALIDATORS["int"], "real": VALIDATORS["real"],
                "seconds": VALIDATORS["real"], "duration": VALIDATORS["real"], "rate": VALIDATORS["real"],
                "time": VALIDATORS["time"]}


def _prefix_filter(column: str, prefix: str | None) -> tuple[str, tuple]:
    if not prefix:
        return "", ()
    if prefix.endswith("."):
        return f"WHERE substr({column}, 1, ?) = ?", (len(prefix), prefix)
    return f"WHERE {column} = ?", (prefix,)
