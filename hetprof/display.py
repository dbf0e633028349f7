"""Showing text that came from a file or a database: as text, never as console markup or escapes.

A device name, a host, a run id or a file name written by someone else may hold `[link=…]`, an
unclosed `[bold` or terminal escape sequences. Printed through rich's markup it would crash the
command or restyle the terminal for every later reader; so such text goes through `shown` (control
characters made visible, one line) and reaches rich as `Text` (never parsed as markup).

Tables fit the terminal: a table wider than the console loses its least needed columns, and the caption
says which (`--wide` keeps them all and prints past the terminal's width, so a pipe or `less -S` sees
every cell whole). Stored times are shown as local dates with how long ago, never as raw epochs.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]|[\ud800-\udfff]")


def visible(value: object) -> str:
    """`value` as one line of plain characters: controls and lone surrogates spelled out (`\\x1b`, `\\n`)."""
    text = str(value)
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), text)


def shown(value: object, style: str = "") -> Text:
    """`value` for a rich console or table cell: visible characters, never interpreted as markup."""
    from rich.text import Text  # here: `hetprof --help` does not pay for rich

    return Text(visible(value), style=style)


def escaped(value: object) -> str:
    """`value` made visible and escaped, for splicing into a string that also holds console markup."""
    from rich.markup import escape

    return escape(visible(value))


def when(epoch: float | None, now: float | None = None, short: bool = False) -> str:
    """A stored Unix time for people: local date and time with its zone, and how long ago (`short`: to the
    minute, for a table cell)."""
    if epoch is None or epoch != epoch:
        return "—"
    if short:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(epoch))
    return f"{stamp} ({_ago((now if now is not None else time.time()) - epoch)})"


def _ago(seconds: float) -> str:
    if seconds < 0:
        return "in the future"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return "just now"


@dataclasses.dataclass(frozen=True)
class Col:
    """A table column. `drop` orders what goes when the table is wider than the terminal: the highest
    first, 0 never (a column a reader needs to act on, such as an id, keeps 0)."""

    header: str
    justify: str = "left"
    drop: int = 0


def fitted_table(console: Console, columns: Sequence[Col], rows: Sequence[Sequence[object]], *, title: object = None,
                 caption: str | None = None, wide: bool = False, hint: str = "--wide shows every column") -> Table:
    """A table that fits `console`: the droppable columns go (highest `drop` first) until it does, and the
    caption names them and how to see them (`hint`). What still does not fit wraps, folding a long word
    rather than cutting it. With `wide` every column stays; print it with `print_wide` so nothing wraps."""
    keep = list(range(len(columns)))
    order = sorted((i for i, c in enumerate(columns) if c.drop), key=lambda i: (-columns[i].drop, -i))
    table = _table(columns, rows, keep, title, caption)
    while not wide and order and natural_width(console, table) > console.width:
        keep.remove(order.pop(0))
        table = _table(columns, rows, keep, title, caption)
    hidden = [columns[i].header for i in range(len(columns)) if i not in keep]
    if hidden:
        note = f"not shown at this width: {', '.join(hidden)} ({hint})"
        table.caption = f"{caption}\n{note}" if caption else note
    return table


def _table(columns: Sequence[Col], rows: Sequence[Sequence[object]], keep: list[int], title: object,
           caption: str | None) -> Table:
    from rich.table import Table

    table = Table(title=title, caption=caption)
    for i in keep:
        table.add_column(columns[i].header, justify=columns[i].justify, overflow="fold")  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*(_cell(row[i]) for i in keep))
    return table


def _cell(value: object) -> object:
    """A rich Text as given (a coloured figure); anything else, strings included, as plain text, never markup."""
    from rich.text import Text

    return value if isinstance(value, Text) else shown(value)


def natural_width(console: Console, renderable: object) -> int:
    """Columns `renderable` takes when nothing is wrapped or cut."""
    from rich.measure import Measurement

    return Measurement.get(console, console.options.update(width=1 << 16), renderable).maximum


def print_wide(console: Console, table: Table, wide: bool) -> None:
    """Print `table`; with `wide`, at its natural width even past the terminal's, so no cell is cut."""
    if not wide:
        console.print(table)
        return
    before = console.width
    console.width = max(before, natural_width(console, table))
    try:
        console.print(table)
    finally:
        console.width = before
