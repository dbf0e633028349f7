"""The `hetprof` command.

Subcommands are click commands registered under the entry-point group `hetprof.commands`
(pyproject.toml): each stage owns its command and this module imports none of them until asked,
which keeps `hetprof --help` fast and lets third parties add commands without editing a dispatcher.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import click

from hetprof import __version__
from hetprof.display import visible
from hetprof.errors import HetprofError
from hetprof.paths import DB_ENV, default_db_path

COMMAND_GROUP = "hetprof.commands"


class LazyGroup(click.Group):
    """A click group whose commands are entry points, loaded on first use."""

    def _entries(self) -> dict:
        return {ep.name: ep for ep in entry_points(group=COMMAND_GROUP)}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._entries()))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        cmd = super().get_command(ctx, name)
        if cmd is not None:
            return cmd
        ep = self._entries().get(name)
        if ep is None:
            return None
        try:
            return ep.load()
        except Exception as exc:  # a broken plugin must not take `hetprof --help` down with it
            return _unavailable(name, ep.value, exc)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except HetprofError as exc:
            click.secho(f"error: {visible(exc)}", fg="red", err=True)
            ctx.exit(exc.exit_code)
        except sqlite3.DatabaseError as exc:
            # Damage the open-time checks cannot see (a torn or overwritten page) surfaces only when a
            # read reaches it; a read changes nothing and a write rolls back, so the file is as it was.
            from hetprof.errors import ProfileDBError

            error = ProfileDBError(f"{visible(db_path(ctx))}: the profile database could not be read ({exc}); "
                                   "`sqlite3 FILE 'PRAGMA integrity_check'` names any damage — restore the file "
                                   "from a copy or from a `hetprof db export`")
            click.secho(f"error: {error}", fg="red", err=True)
            ctx.exit(error.exit_code)


def _unavailable(name: str, target: str, exc: Exception) -> click.Command:
    """A stand-in for a command whose module failed to import: listed, and explains itself when run."""
    reason = f"{type(exc).__name__}: {exc}"

    def explain() -> None:
        raise HetprofError(f"command '{name}' is unavailable: loading {target} failed ({reason})")

    return click.Command(name, callback=explain, help=f"(unavailable: {reason})",
                         short_help=f"(unavailable: {reason})"[:80])


def db_path(ctx: click.Context | None = None) -> Path:
    """The database path chosen by `hetprof --db`, HETPROF_DB, or the default, in that order."""
    ctx = ctx or click.get_current_context()
    root = ctx.find_root()
    chosen = (root.obj or {}).get("db") if isinstance(root.obj, dict) else None
    return Path(chosen) if chosen else default_db_path()


def existing_db_path(ctx: click.Context | None = None) -> Path:
    """`db_path()` for a command that only reads: a missing file is refused (exit 2), never created empty."""
    from hetprof.errors import ProfileDBError

    path = db_path(ctx)
    if not path.is_file():
        raise ProfileDBError(f"{visible(path)}: no such profile database (commands that only read never create one; "
                             "`hetprof profile` or `hetprof db import` makes one)")
    return path



class RegistryOption(click.Option):
    """An option whose help ends with the names a registry offers, read when the help is shown, so
    listing commands imports no stage and a plugin's name appears once it is installed."""

    def __init__(self, *args: Any, names: Callable[[], list[str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._names = names
        self._base_help = self.help or ""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        try:
            names = ", ".join(self._names())
        except Exception as exc:  # a broken plugin must not hide the help
            names = f"(registry unavailable: {exc})"
        self.help = f"{self._base_help} — one of: {names}" if self._base_help else f"one of: {names}"
        return super().get_help_record(ctx)


def db_option(fn):
    """A `--db PATH` option for a subcommand; it overrides `hetprof --db` and HETPROF_DB."""

    def remember(ctx: click.Context, _param, value):
        if value:
            ctx.find_root().ensure_object(dict)["db"] = value
        return value

    return click.option("--db", "db", type=click.Path(dir_okay=False), expose_value=False, callback=remember,
                        is_eager=True, help=f"profile database (default: ${DB_ENV} or ~/.hetprof/profiles.db)")(fn)


def catalog_option(fn):
    """A `--catalog FILE` option: a GPU catalog file (hetprof/data/gpus.yaml's format) extending the built-in one."""
    return click.option("--catalog", "catalog_path", type=click.Path(dir_okay=False), default=None,
                        help="GPU catalog file extending the built-in one: new GPU types, efficiency curves, "
                             "sources (format of hetprof/data/gpus.yaml)")(fn)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hetprof")
@click.option("--db", type=click.Path(dir_okay=False), envvar=DB_ENV,
              help=f"profile database (default: ${DB_ENV} or ~/.hetprof/profiles.db)")
@click.pass_context
def cli(ctx: click.Context, db: str | None) -> None:
    """Profile, model, plan and run RL post-training on heterogeneous GPUs and networks.

    \b
    The pipeline: profile -> db -> fit -> plan -> run (-> validate), each a subcommand.
    """
    ctx.ensure_object(dict)
    if db:
        ctx.obj["db"] = db


def main() -> None:
    try:
        cli(standalone_mode=True)
    except HetprofError as exc:  # raised outside a subcommand's invoke (e.g. while loading)
        click.secho(f"error: {visible(exc)}", fg="red", err=True)
        sys.exit(exc.exit_code)
