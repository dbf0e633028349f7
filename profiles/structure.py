"""Which objects a profile database may hold: hetprof's tables and indexes, as its migrations make them.

A database given with `--db` may come from someone else, and SQLite runs SQL stored in the file: a
trigger fires on our next write (an import then deletes rows), a view runs its query (endlessly, if
recursive) on our next read, and a CHECK, a UNIQUE constraint or an expression index runs on, or
silently drops, every row we insert. So before anything reads or writes a database it is opened
on, its schema is compared with the one hetprof's migrations build for its version. That costs a
few dozen rows of sqlite_master and a PRAGMA per table, whatever the size of the data.

A merge source is only read, from a private snapshot with schema-defined functions off, so it needs
less: `check_tables`, the tables it reads are real tables of our columns.
"""

from __future__ import annotations

import functools
import sqlite3

from hetprof.display import visible
from hetprof.errors import ImportRefused
from hetprof.profiles.schema import SCHEMA_VERSION, TABLES, migrate, read_version

Key = tuple[str, str]  # (type, name) of a sqlite_master row


def check_tables(src: sqlite3.Connection, origin: str) -> None:
    """Every table is a real table with exactly our columns, none of them computed."""
    version = read_version(src)
    if not 1 <= version <= SCHEMA_VERSION:
        raise ImportRefused(f"{origin}: schema version {version} is not one this hetprof reads (1..{SCHEMA_VERSION})")
    for name, table in TABLES.items():
        found = src.execute("SELECT type, sql FROM main.sqlite_master WHERE name = ?", (name,)).fetchone()
        if found is None or found[0] != "table" or not str(found[1]).upper().startswith("CREATE TABLE"):
            what = "missing" if found is None else f"a {found[0]}" if found[0] != "table" else "a virtual table"
            raise ImportRefused(f"{origin}: {name} is {what}, not a table")
        info = src.execute(f"PRAGMA main.table_xinfo({name})").fetchall()
        cols = [r[1] for r in info]
        if cols != table.column_names:
            raise ImportRefused(f"{origin}: table {name} has columns {cols}, expected {table.column_names}")
        if any(r[6] for r in info):
            raise ImportRefused(f"{origin}: table {name} has computed (generated) columns")


@functools.lru_cache(maxsize=SCHEMA_VERSION)
def expected_objects(version: int) -> tuple[dict[Key, tuple[str, str | None]], frozenset[Key]]:
    """The objects (their table and SQL) that the migrations up to `version` create, and those that
    `ANALYZE` may add (its statistics tables: a user may run it, and they hold no SQL)."""
    conn = sqlite3.connect(":memory:")
    try:
        migrate(conn, 0, version)
        made = _objects(conn)
        conn.execute("ANALYZE")
        analysed = _objects(conn)
    finally:
        conn.close()
    return analysed, frozenset(analysed.keys() - made.keys())


def _objects(conn: sqlite3.Connection) -> dict[Key, tuple[str, str | None]]:
    return {(kind, name): (table, sql)
            for kind, name, table, sql in conn.execute("SELECT type, name, tbl_name, sql FROM main.sqlite_master")}


def _runs_sql(kind: str, sql: object) -> str | None:
    """What an object is, if reading or writing its table runs SQL stored in the file."""
    if kind in ("trigger", "view"):
        return kind
    if kind == "table" and str(sql or "").lstrip().upper().startswith("CREATE VIRTUAL TABLE"):
        return "virtual table"
    return None


def check_database(conn: sqlite3.Connection, origin: str) -> int:
    """Refuse a database holding anything but hetprof's schema for its version; returns the version.

    An empty file (version 0, no objects) passes: the migrations make it. A version this hetprof does
    not know is returned unchecked, for the caller to refuse with its own advice.
    """
    found = _objects(conn)
    for (kind, name), (table, sql) in found.items():
        what = _runs_sql(kind, sql)
        if what:
            raise ImportRefused(f"{origin}: {what} {visible(name)[:64]!r} on {visible(table)[:64]!r}: a profile "
                                "database holds no triggers, views or virtual tables; refused before any use")
    meta = ("table", "meta")  # checked before it is read: a meta without its key would be scanned whole
    if meta in found and found[meta] != expected_objects(1)[0][meta]:
        _differs(origin, meta, "")
    version = read_version(conn)
    if version == 0 and found:
        kind, name = next(iter(found))
        raise ImportRefused(f"{origin}: holds {kind} {visible(name)[:64]!r} but no schema version: "
                            "not a hetprof profile database")
    if not 1 <= version <= SCHEMA_VERSION:
        return version
    check_tables(conn, origin)
    expected, optional = expected_objects(version)
    for key, (table, sql) in found.items():
        if key not in expected:
            raise ImportRefused(f"{origin}: {key[0]} {visible(key[1])[:64]!r} on {visible(table)[:64]!r} is not part "
                                f"of a hetprof profile database (schema v{version})")
        if expected[key] != (table, sql):
            _differs(origin, key, f" v{version}")
    missing = sorted(expected.keys() - found.keys() - optional)
    if missing:
        raise ImportRefused(f"{origin}: {missing[0][0]} {missing[0][1]!r} of hetprof's schema v{version} is missing")
    return version


def _differs(origin: str, key: Key, version: str) -> None:
    raise ImportRefused(f"{origin}: {key[0]} {visible(key[1])[:64]!r} is not defined as hetprof's schema{version} "
                        "defines it (a constraint, collation, default or expression differs)")
