"""Errors a user can act on.

Every error that reaches the CLI is a HetprofError: it is printed as one clear message with no
traceback and a non-zero exit code. The subclasses say which stage refused and why, so scripts
can tell a bad spec from an infeasible plan.
"""

from __future__ import annotations


class HetprofError(Exception):
    """Base of all errors meant for the user rather than for a debugger."""

    exit_code = 2


class SpecError(HetprofError):
    """A spec file (cluster, workload, plan) is malformed: names the file, the field and what was expected."""

    def __init__(self, file: str | None, field: str, expected: str, got: object = None,
                 position: tuple[int, int] | None = None):
        self.file = file
        self.field = field
        self.expected = expected
        self.got = got
        self.position = position  # (line, column), 1-based, where the file has the field (editors jump there)
        where = f"{file}:{position[0]}:{position[1]}: " if file and position else (f"{file}: " if file else "")
        shown = "" if got is None else f", got {_short(got)}"
        super().__init__(f"{where}field '{field or '<root>'}': expected {expected}{shown}")


class InfeasibleError(HetprofError):
    """No plan can satisfy a constraint; the message names the constraint."""

    exit_code = 3


class ExportRefused(HetprofError):
    """A plan the target framework cannot express (`hetprof export`); the message names the feature."""


class ProfileDBError(HetprofError):
    """The profile database cannot be read or written as asked."""


class ImportRefused(ProfileDBError):
    """A shared file was refused before anything was written; the database is unchanged."""


class ExecutionError(HetprofError):
    """A run failed or was refused up front (a plan the executor cannot carry out, a dead worker)."""

    exit_code = 4


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
