"""What the `hetprof db …` commands share: opening the chosen database, its runs checked, the --wide option."""

from __future__ import annotations

import click

from hetprof.cli import db_path, existing_db_path


def open_db(readonly: bool = False):
    """The chosen database; read-only opens refuse a missing file rather than create it."""
    from hetprof.profiles import ProfileDB

    return ProfileDB(existing_db_path() if readonly else db_path(), readonly=readonly)


def wide_option(fn):
    """--wide: every column, printed past the terminal's width instead of leaving columns out."""
    return click.option("--wide", is_flag=True, help="every column, even past the terminal's width")(fn)


# recorded_runs' fields and the run_records column each is taken from
_RECORDED_COLUMNS = (("run", "run"), ("plan_hash", "plan_hash"), ("first_iteration", "iteration"),
                     ("last_iteration", "iteration"), ("started", "created"), ("last", "created"), ("source", "source"))


def recorded(pdb, limit: int | None = None, run: str | None = None) -> list[dict]:
    """`names.recorded_runs`, each field checked as `ProfileDB.stored` checks the column it comes from."""
    from hetprof.profiles.names import recorded_runs

    found = recorded_runs(pdb.conn, limit, run)
    for r in found:
        for key, column in _RECORDED_COLUMNS:
            pdb.stored("run_records", column, r[key], r["run"])
    return found
