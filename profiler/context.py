"""What a suite is handed: where to write, what to measure, how hard to try, where to report progress.

Suites never open the database or print: they call `record` and `advance`, so the same suite runs
under the CLI's progress bars, in a test, or in a worker process for `--all-gpus`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from hetprof.profiler.timing import TimingPolicy
from hetprof.profiles import ProfileDB
from hetprof.specs.models import ModelShape

_THIS_DEVICE = object()


@dataclasses.dataclass
class SummaryRow:
    """One line of the end-of-run table: a benchmark run and its headline numbers."""

    suite: str
    benchmark: str
    device: str
    samples: int
    headline: str


@dataclasses.dataclass
class ProfileContext:
    db: ProfileDB
    host: str
    device: str  # "cpu" | "cuda:N" (the device of a "device" suite; the first local device otherwise)
    device_id: str | None
    quick: bool
    threads: int
    models: list[ModelShape] = dataclasses.field(default_factory=list)
    devices: list[str] = dataclasses.field(default_factory=list)  # every local device being profiled
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # suite-specific (link rendezvous, ...)
    advance: Callable[[int], None] = lambda n=1: None
    note: Callable[[str], None] = lambda text: None
    summary: list[SummaryRow] = dataclasses.field(default_factory=list)
    suite: str = ""

    @property
    def policy(self) -> TimingPolicy:
        return TimingPolicy.quick() if self.quick else TimingPolicy()

    def record(self, benchmark: str, params: dict, samples: list[dict], headline: str,
               device_id: str | None | object = _THIS_DEVICE) -> str:
        """Write one benchmark run with its raw samples (one transaction) and remember its headline.

        Rows are filed under this context's device unless `device_id` says otherwise (None: no device,
        as for a link between hosts).
        """
        dev = self.device_id if device_id is _THIS_DEVICE else device_id
        run_id = self.db.add_benchmark(benchmark=benchmark, device_id=dev, host=self.host, params=params,
                                       samples=samples)
        self.summary.append(SummaryRow(self.suite, benchmark, self.device, len(samples), headline))
        return run_id
