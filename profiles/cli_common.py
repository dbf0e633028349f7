"""What the `hetprof db …` commands share: opening the chosen database, and the --wide option."""

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
