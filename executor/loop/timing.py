"""Timing kept out of the dataflow: runners wrapped so each call records its task's times, and the
loop's phases as laps, into the iteration report of the loop step under way.

`StepTiming.wrap(runner)` gives a proxy whose `run` times the call, asks the runner which tasks the
time belongs to (`spans`: a trainer's update may hold the actor's log-prob pass) and, on a replica's
first rank, what the work was in the plan's priced units (`priced`). `@phase(name)` on a loop
method adds the wall time since the previous phase to the report's laps once the method returns.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from hetprof.executor.records.iteration_report import IterationReport, Laps

F = TypeVar("F", bound=Callable[..., Any])


class StepTiming:
    """The report the current loop step's times go into."""

    def __init__(self) -> None:
        self.report: IterationReport | None = None
        self._laps: Laps | None = None

    def begin(self, report: IterationReport) -> None:
        self.report = report
        self._laps = Laps(report.laps)

    def lap(self, name: str) -> None:
        self._laps(name)

    @contextlib.contextmanager
    def span(self, name: str, seconds: bool = True) -> Iterator[None]:
        """Time a block of the step that is no task's run (waiting for rollouts, scoring); without
        `seconds`, only its span on the wall clock (a checkpoint, which no prediction prices)."""
        start = time.perf_counter()
        yield
        if seconds:
            self.report.timed(name, start)
        else:
            self.report.spans[name] = [self.report.wall(start), self.report.wall(time.perf_counter())]

    def wrap(self, runner: Any) -> TimedRunner:
        return TimedRunner(runner, self)


class TimedRunner:
    """A runner whose `run` records its times; everything else is the runner's own."""

    def __init__(self, runner: Any, timing: StepTiming) -> None:
        self.runner = runner
        self.timing = timing

    def run(self, work: Any) -> Any:
        start = time.perf_counter()
        result = self.runner.run(work)
        end = time.perf_counter()
        report = self.timing.report
        seconds = {task: report.timed(task, s, e) for task, (s, e) in self.runner.spans(result, start, end).items()}
        if self.runner.reports:  # a replica reports its work once, by its first rank
            report.work_timings.update(self.runner.priced(work, result, seconds))
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)


def phase(name: str | Callable[..., str]) -> Callable[[F], F]:
    """Decorate a loop method (of an object with `timing`): a lap named `name`, or `name(*args)`,
    once it returns."""

    def decorate(method: F) -> F:
        @functools.wraps(method)
        def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = method(self, *args, **kwargs)
            self.timing.lap(name(*args) if callable(name) else name)
            return result

        return timed  # type: ignore[return-value]

    return decorate
