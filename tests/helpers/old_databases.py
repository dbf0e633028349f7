"""Profile databases as older schema versions wrote them, for the migration tests."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from hetprof.profiles import ProfileDB
from hetprof.profiles.content import canonical_json, sample_id
from hetprof.profiles.schema import TABLES, migrate


def sample(i: int, writer: int = 0) -> dict:
    """The i-th sample of a `memory.copy` run by `writer`."""
    return {"params": {"size_bytes": 1024 * (i + 1), "writer": writer}, "metrics": {"seconds": 1e-4 * (i + 1)}}


def v3_database(path: Path) -> None:
    """A database as schema v3 wrote it (samples keyed by id, indexed by run), holding two runs."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    migrate(conn, 0, target=3)
    for r in range(2):
        run = ProfileDB.row("runs", ["memory.copy", None, "h", "{}", 3, "0", float(r), "measured"])
        conn.execute(TABLES["runs"].insert_sql(), run)
        for i in reversed(range(3)):  # stored out of seq order: the migration's key sorts them
            values = (run[0], i, canonical_json(sample(i)["params"]), canonical_json(sample(i)["metrics"]))
            conn.execute(TABLES["samples"].insert_sql(), (sample_id(*values), *values))
    conn.execute("COMMIT")
    conn.close()
