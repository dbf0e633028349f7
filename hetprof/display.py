"""Showing text that came from a file or a database: as text, never as console markup or escapes.

A device name, a host, a run id or a file name written by someone else may hold `[link=…]`, an
unclosed `[bold` or terminal escape sequences. Printed through rich's markup it would crash the
command or restyle the terminal for every later reader; so such text goes through `shown` (control
characters made visible, one line) and reaches rich as `Text` (never parsed as markup).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
