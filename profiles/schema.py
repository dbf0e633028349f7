"""The tables, their columns, and the migrations that build them.

One table description drives everything that touches rows: the DDL, the content hash, the insert
statements, import/merge validation and the export format. Adding a column is a new migration step
plus a column here; a database written by newer code (higher schema_version) is refused, never
guessed at.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable

SCHEMA_VERSION = 4


@dataclasses.dataclass(frozen=True)
class Column:
    """One column: its SQL type and the validator kind that import and the API both apply."""

    name: str
    kind: str  # a key of validate.VALIDATORS
    nullable: bool = False
    ref: str | None = None  # table whose id this column references

    @property
    def is_json(self) -> bool:
        return self.kind.startswith("json")

    @property
    def sql_type(self) -> str:
        if self.kind in ("int", "count"):
            return "INTEGER"
        if self.kind in ("real", "seconds", "duration", "rate", "time"):
            return "REAL"
        return "TEXT"


@dataclasses.dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]  # content columns; the id column comes first in SQL and is not listed
    key: tuple[str, ...] = ("id",)  # the primary key as the current schema lays the table out

    @property
    def column_names(self) -> list[str]:
        return ["id", *(c.name for c in self.columns)]

    @property
    def key_sql(self) -> str:
        """The key columns, comma-separated: what lookups join on and scans order by."""
        return ", ".join(self.key)

    @property
    def json_flags(self) -> list[bool]:
        return [c.is_json for c in self.columns]

    def insert_sql(self, schema: str = "main") -> str:
        cols = ",".join(self.column_names)
        marks = ",".join("?" * len(self.column_names))
        return f"INSERT OR IGNORE INTO {schema}.{self.name} ({cols}) VALUES ({marks})"


_C = Column
_PROVENANCE = (_C("tool_version", "short"), _C("created", "time"), _C("source", "source"))

# Order matters: a table only references tables listed before it (inserts and merges follow it).
TABLES: dict[str, Table] = {t.name: t for t in [
    Table("devices", (
        _C("name", "short"), _C("kind", "ident"), _C("catalog_type", "short", nullable=True),
        _C("memory_bytes", "count", nullable=True), _C("host", "short"),
        _C("driver", "short", nullable=True), _C("cuda", "short", nullable=True),
        _C("torch", "short", nullable=True), _C("uuid", "short", nullable=True),
        _C("extra", "json_object"), _C("source", "source"),
    )),
    Table("runs", (
        _C("benchmark", "benchmark"), _C("device_id", "id", nullable=True, ref="devices"), _C("host", "short"),
        _C("params", "json_object"), _C("n_samples", "count"), *_PROVENANCE,
    )),
    Table("samples", (
        _C("run_id", "id", ref="runs"), _C("seq", "count"),
        _C("params", "json_flat_params"), _C("metrics", "json_flat_metrics"),
    ), key=("run_id", "seq", "id")),
    Table("links", (
        _C("src_host", "short"), _C("dst_host", "short"),
        _C("src_region", "short", nullable=True), _C("dst_region", "short", nullable=True),
        _C("alpha_s", "seconds"), _C("beta_Bps", "rate"), _C("residual", "real", nullable=True),
        _C("run_id", "id", nullable=True, ref="runs"), *_PROVENANCE,
    )),
    Table("run_records", (
        _C("run", "short"), _C("plan_hash", "short"), _C("iteration", "count"), _C("task", "short"),
        _C("seconds", "duration"), _C("predicted_s", "seconds", nullable=True),
        _C("device_ids", "json_str_list"), _C("host", "short", nullable=True), _C("extra", "json_object"),
        *_PROVENANCE,
    )),
    Table("cost_models", (
        _C("name", "short"), _C("task_type", "short"), _C("family", "ident"),
        _C("params", "json_model"), _C("metrics", "json_flat_metrics"), _C("snapshot", "id_or_empty"),
        *_PROVENANCE,
    )),
]}


def _ddl(table: Table, name: str | None = None, clustered: bool = False) -> str:
    """CREATE TABLE for `table`: keyed by its id (the first schema), or `clustered` by `table.key`."""
    cols = ["id TEXT NOT NULL" if clustered else "id TEXT PRIMARY KEY NOT NULL"]
    for c in table.columns:
        null = "" if c.nullable else " NOT NULL"
        ref = f" REFERENCES {c.ref}(id)" if c.ref else ""
        cols.append(f"{c.name} {c.sql_type}{null}{ref}")
    if clustered:
        return f"CREATE TABLE {name or table.name} ({', '.join(cols)}, PRIMARY KEY ({table.key_sql})) WITHOUT ROWID"
    return f"CREATE TABLE {name or table.name} ({', '.join(cols)})"


def _v1_tables(conn: sqlite3.Connection) -> None:
    """The first schema: the tables, and a meta table recording which migrations ran."""
    conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL)")
    for table in TABLES.values():
        conn.execute(_ddl(table))


def _v2_read_indexes(conn: sqlite3.Connection) -> None:
    """Indexes for the reads every stage makes: a benchmark family, a run's samples, a task's models."""
    conn.execute("CREATE INDEX IF NOT EXISTS runs_by_benchmark ON runs (benchmark, created)")
    conn.execute("CREATE INDEX IF NOT EXISTS samples_by_run ON samples (run_id, seq)")
    conn.execute("CREATE INDEX IF NOT EXISTS links_by_hosts ON links (src_host, dst_host)")
    conn.execute("CREATE INDEX IF NOT EXISTS records_by_run ON run_records (run, iteration)")
    conn.execute("CREATE INDEX IF NOT EXISTS models_by_task ON cost_models (task_type, created)")


def _v3_origins(conn: sqlite3.Connection) -> None:
    """Provenance of shared data: every import and merge, what it came from and what it added.

    Not content-addressed and never exported: it describes this copy's history, not the data.
    """
    conn.execute("CREATE TABLE IF NOT EXISTS origins (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
                 "kind TEXT NOT NULL, origin TEXT NOT NULL, at REAL NOT NULL, added TEXT NOT NULL)")


def _v4_samples_clustered_by_run(conn: sqlite3.Connection) -> None:
    """Store samples in one B-tree keyed (run_id, seq, id) instead of a rowid table plus two indexes.

    A sample's id is the hash of its content, which includes run_id and seq, so two samples share
    an id only if they share the whole key: the key is as unique as the id alone, and INSERT OR
    IGNORE still drops exactly the rows already present. What changes is where rows land. Under an
    index on the random id every batch dirtied pages all over it (each commit rewrote tens of MB
    and bulk insert slowed as the database grew); keyed by run, a batch appends to one place, the
    rows are stored once instead of three times, and a run's samples come back in seq order.
    """
    table = TABLES["samples"]
    cols = ", ".join(table.column_names)
    conn.execute(_ddl(table, name="samples_v4", clustered=True))
    conn.execute(f"INSERT INTO samples_v4 ({cols}) SELECT {cols} FROM samples ORDER BY {table.key_sql}")
    conn.execute("DROP TABLE samples")  # and its index samples_by_run, which the key now serves
    conn.execute("ALTER TABLE samples_v4 RENAME TO samples")


# Migration i (1-based) brings a database from schema_version i-1 to i. Append; never edit a step.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _v1_tables, _v2_read_indexes, _v3_origins, _v4_samples_clustered_by_run]
assert len(MIGRATIONS) == SCHEMA_VERSION


def read_version(conn: sqlite3.Connection, schema: str = "main") -> int:
    """The schema_version recorded in a database; 0 for an empty file."""
    has_meta = conn.execute(
        f"SELECT 1 FROM {schema}.sqlite_master WHERE type='table' AND name='meta'").fetchone()
    if not has_meta:
        return 0
    row = conn.execute(f"SELECT value FROM {schema}.meta WHERE key='schema_version'").fetchone()
    try:
        return int(row[0]) if row else 0
    except (TypeError, ValueError):
        return -1


def migrate(conn: sqlite3.Connection, current: int, target: int = SCHEMA_VERSION) -> None:
    """Apply the steps after `current` up to `target`; the caller holds the write transaction."""
    for version in range(current + 1, target + 1):
        MIGRATIONS[version - 1](conn)
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (str(version),))
