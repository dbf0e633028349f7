"""Bounds on what reading a shared file may cost: bytes, rows, row size, time; and which files are files.

A teammate's export or database is read before anything is known about it, so every read is
bounded up front and refused with one line past a bound, instead of finding out by running out of
memory or patience. The defaults fit a million-sample profile several times over; the CLI options
`--max-bytes`, `--max-rows`, `--max-row-bytes`, `--max-expansion` and `--deadline` change them per call.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from hetprof.errors import ImportRefused
from hetprof.safety import safefiles
from hetprof.safety.processes import Terminated

EXPANSION_FREE_BYTES = 64 * 2**20  # decompressed bytes read before the expansion bound applies: a small file
# may compress well (one repetitive model) and costs little whatever its ratio
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C, kill, a closed terminal
PROGRESS_STEPS = 50_000  # SQLite VM steps between deadline checks: a deadline is met promptly, the check stays cheap


@dataclasses.dataclass(frozen=True)
class Limits:
    """How much one import or merge may read; past any of them it is refused, the database unchanged."""

    max_bytes: int = 4 * 2**30  # decompressed bytes of an export; file bytes of a merge source
    max_rows: int = 10_000_000  # rows of all tables together
    max_row_bytes: int = 16 * 2**20  # one row (a fitted model's parameters are the largest)
    deadline_s: float = 900.0  # wall seconds for reading and checking everything
    # Decompressed bytes of an export per byte of its file. Real exports expand 2-5 fold (their row
    # ids do not compress); a file of repeated text expands up to 1000 fold, into memory, as rows.
    max_expansion: float = 32.0

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_rows", "max_row_bytes", "deadline_s", "max_expansion"):
            if not getattr(self, name) > 0:
                raise ImportRefused(f"limit {name} must be positive, got {getattr(self, name)!r}")


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text: str) -> int:
    """Bytes from '512', '64M', '2GiB' (binary units); raises ValueError naming the text."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size like 512, 64M or 2GiB")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def regular_file(path: Path) -> None:
    """Refuse what is not a regular file (a FIFO would hang the reader, /dev/zero never ends) with the
    reason, not a misleading 'no such file'."""
    open_regular(path).close()


def regular_companions(path: Path) -> list[Path]:
    """The -wal, -shm and -journal files beside a database, each refused unless a regular file: SQLite
    opens them too, and a FIFO there would hang it."""
    found = [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal")]
    found = [c for c in found if os.path.lexists(c)]
    for companion in found:
        regular_file(companion)
    return found


def regular_database(path: Path) -> None:
    """Refuse a database path (if anything is there) or a companion of it that is not a regular file
    (a symlink to /dev/null, a FIFO, a device), before SQLite opens it."""
    if os.path.lexists(path):
        regular_file(path)
    regular_companions(path)


def open_regular(path: Path) -> BinaryIO:
    """`safefiles.open_regular`, refusing as an import does."""
    try:
        return safefiles.open_regular(path)
    except safefiles.NotReadable as exc:
        raise ImportRefused(f"{path}: {exc}") from None


class Watch:
    """Bounds SQLite reads on a connection: a deadline, Ctrl-C, and (in a helper) a parent still alive.

    SQLite runs a query in C, where Python's signal handlers and deadline checks cannot run; a
    progress handler calls back every PROGRESS_STEPS steps and stops the query when a bound is past,
    so a recursive view or a huge table ends within a second of its deadline or of Ctrl-C.
    """

    def __init__(self, limits: Limits, origin: str, parent_pid: int | None = None):
        self.limits = limits
        self.origin = origin
        self.deadline = time.monotonic() + limits.deadline_s
        self.parent_pid = parent_pid
        self.stopped: str | None = None
        self.signal = signal.SIGINT
        self.rows = 0

    def attach(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        """Bound `conn`: no schema-defined functions, no value longer than a row may be, the progress check."""
        conn.execute("PRAGMA trusted_schema=OFF")
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self.limits.max_row_bytes)
        conn.set_progress_handler(self._tick, PROGRESS_STEPS)
        return conn

    def _tick(self) -> int:
        if self.stopped:
            return 1
        if time.monotonic() > self.deadline:
            self.stopped = "deadline"
        elif self.parent_pid is not None and os.getppid() != self.parent_pid:
            self.stopped = "orphaned"
        return 1 if self.stopped else 0

    def _interrupt(self, signum: int, _frame: object) -> None:
        self.stopped = "interrupted"  # the next progress check stops the query, then the signal's exception
        self.signal = signum

    def count(self, n: int) -> None:
        """Add `n` rows read; refuse past the row cap, and past the deadline between queries too."""
        self.rows += n
        if self.rows > self.limits.max_rows:
            raise ImportRefused(f"{self.origin}: more than {self.limits.max_rows:,} rows (--max-rows)")
        if time.monotonic() > self.deadline:
            self.stopped = "deadline"
            self.raise_stopped()

    def raise_stopped(self) -> None:
        if self.stopped == "interrupted":
            if self.signal == signal.SIGINT:
                raise KeyboardInterrupt
            raise Terminated(128 + self.signal)
        if self.stopped == "orphaned":
            raise ImportRefused(f"{self.origin}: the merge that started this helper is gone")
        raise ImportRefused(f"{self.origin}: reading took longer than the {self.limits.deadline_s:g} s "
                            "deadline (--deadline)")

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Turn a query stopped by the progress handler, or a value past the row size, into its one-line reason.

        Ctrl-C (or SIGTERM, SIGHUP) inside marks the watch stopped instead of raising at once: an
        exception raised inside SQLite's callback would be swallowed by it; marked, the query stops and
        KeyboardInterrupt (or `Terminated`, exit 128 + signal) follows, so cleanup runs on the way out.
        """
        main = threading.current_thread() is threading.main_thread()
        previous = {s: signal.signal(s, self._interrupt) for s in STOP_SIGNALS} if main else {}
        try:
            yield
            if self.stopped == "interrupted":
                self.raise_stopped()
        except sqlite3.OperationalError as exc:
            if self.stopped:
                self.raise_stopped()
            raise ImportRefused(f"{self.origin}: not a readable profile database ({exc})") from None
        except sqlite3.DataError as exc:
            raise ImportRefused(f"{self.origin}: a value is longer than {self.limits.max_row_bytes:,} bytes "
                                f"(--max-row-bytes) ({exc})") from None
        except sqlite3.DatabaseError as exc:
            raise ImportRefused(f"{self.origin}: not a readable profile database ({exc})") from None
        except UnicodeDecodeError:  # SQLite's own message quoted a corrupt schema's bytes
            raise ImportRefused(f"{self.origin}: not a readable profile database (malformed schema)") from None
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
