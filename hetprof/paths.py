"""Where things live by default; every default can be overridden per call."""

from __future__ import annotations

import os
from pathlib import Path

DB_ENV = "HETPROF_DB"


def default_db_path() -> Path:
    """HETPROF_DB if set, else ~/.hetprof/profiles.db."""
    env = os.environ.get(DB_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".hetprof" / "profiles.db"
