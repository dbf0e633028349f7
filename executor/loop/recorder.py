"""The leader's bookkeeping: every rank's iteration report in, the run record out to log, database and console.

Ranks hand their report to the leader without waiting for anyone: a blocking gather at the end of
each iteration would make the loop wait for the slowest rank. The other ranks send theirs without
blocking on a group of its own; the leader's record thread receives them in iteration order, builds
the record (run_record.py) and writes it while the next iteration runs, so bookkeeping adds no
latency to the RL work. That thread runs at the lowest CPU priority (`cpuslots.yield_to_work`): on
a `cpu` slot it shares the worker's core, and at normal priority it ran through the next
generation's prefill, making generation replica 0 the stage's slowest in nearly every step.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
from rich.console import Console

from hetprof.executor.algorithms import AlgorithmConfig, get_algorithm
from hetprof.executor.checkpoints import checkpoint
from hetprof.executor.loop.dispatch import receive_or_explain
from hetprof.executor.loop.messages import MessageKind, Outbox, message_tag
from hetprof.executor.options import RunOptions
from hetprof.executor.parallel.topology import Topology
from hetprof.executor.records.iteration_report import IterationReport
from hetprof.executor.records.mfu import training_peaks
from hetprof.executor.records.progress import RunProgress, wanted
from hetprof.executor.records.run_log import DBWriter, RunLog, console_line
from hetprof.executor.records.run_record import RecordContext, build_record, predicted_seconds
from hetprof.executor.records.tensorboard_log import TensorBoardLog
from hetprof.executor.records.wandb_log import WandbLog
from hetprof.runtime.cpuslots import yield_to_work
from hetprof.specs import Plan
from hetprof.specs.vocabulary import SyncEdge


def record_context(plan: Plan, topo: Topology, run: str, plan_hash: str, work: dict[str, dict[str, Any]],
                   verify_sync: bool) -> RecordContext:
    """What every record of this run says about the run itself: the plan's facts as this run's ranks hold them."""
    workload = plan.workload_spec()
    edges = [e for e in SyncEdge if topo.sync_members(e)]
    return RecordContext(
        run=run, plan_hash=plan_hash, mode=workload.mode,
        staleness_bound=workload.staleness if workload.mode == "async" else 0, algorithm=workload.algorithm,
        replica_leads={t: tr.ranks for t, tr in topo.tasks.items()},
        layouts={t: str(tr.layout) for t, tr in topo.tasks.items()},
        devices={t: list(tr.lead_devices) for t, tr in topo.tasks.items()},
        sync_sources={str(e): topo.sync_source(e) for e in edges},
        sync_receivers={str(e): len(topo.sync_receivers(e)) for e in edges},
        predicted=predicted_seconds(plan), predicted_iteration_s=plan.predicted.iteration_s or None,
        work=work, verify_sync=verify_sync, train_peaks=training_peaks(plan),
        device_count=len({d for t in plan.tasks for d in t.devices()}),
        kl_in_reward=not get_algorithm(workload.algorithm)(AlgorithmConfig()).kl_in_loss())


class Recorder:
    """One rank's end of the reports: the leader records, every other rank only sends."""

    def __init__(self, options: RunOptions, topo: Topology, rank: int, group: dist.ProcessGroup | None,
                 console: Console) -> None:
        self.opts = options
        self.topo = topo
        self.rank = rank
        self.is_leader = rank == topo.leader
        self.group = group
        self.console = console
        self.outbox = Outbox(options.timeout_s, group)
        self.context: RecordContext | None = None  # set by `start` (the run's name is known after resume)
        self.log = RunLog(options.log) if self.is_leader else None
        if self.log is not None and self.log.torn_bytes:
            console.print(f"[yellow]run log {options.log}: dropped its last {self.log.torn_bytes:,} bytes, a record "
                          "a stopped run did not finish writing[/yellow]")
        self.db_writer = DBWriter(options.db) if self.is_leader and options.db else None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hetprof-records",
                                          initializer=yield_to_work)  # the worker's core is the work's
        self._pending: list[Future] = []
        self.sinks: list[TensorBoardLog | WandbLog] = []  # where each record also goes (each: write, close)
        self.progress: RunProgress | None = None

    def start(self, context: RecordContext, first: int) -> None:
        """Begin recording at iteration `first` (0, or where a resumed run starts); the leader opens
        the run's TensorBoard folder and W&B run (named by the run, so a resumed run continues its curves)."""
        self.context = context
        if not self.is_leader:
            return
        if self.opts.tensorboard_dir:
            self.sinks.append(TensorBoardLog(self.opts.tensorboard_dir, context.run, first))
        if self.opts.wandb_project:
            self.sinks.append(WandbLog(self.opts.wandb_project, context.run, self.opts.wandb_dir or "."))
        if wanted(self.console, self.opts.quiet):
            self.progress = RunProgress(self.console, first, self.opts.iterations)

    def submit(self, iteration: int, seconds: float, report: IterationReport) -> None:
        """Hand this rank's report of `iteration` on: the leader's thread records it, others send it."""
        if not self.is_leader:
            body = torch.frombuffer(bytearray(report.to_json()), dtype=torch.uint8)
            self.outbox.send({"report": body}, self.topo.leader, message_tag(iteration, MessageKind.REPORT),
                             torch.device("cpu"))
            return
        self._pending = [f for f in self._pending if not f.done() or f.result()]
        self._pending.append(self._thread.submit(self._record, iteration, seconds, report))

    def _receive(self, src: int, iteration: int) -> IterationReport:
        got = receive_or_explain(self.topo, self.rank, src, message_tag(iteration, MessageKind.REPORT),
                                 torch.device("cpu"), self.group, f"report of iteration {iteration}")
        return IterationReport.from_json(got["report"].numpy().tobytes())

    def _record(self, iteration: int, seconds: float, mine: IterationReport) -> None:
        assert self.context is not None, "Recorder.start was not called"
        reports = [mine if r == self.rank else self._receive(r, iteration) for r in range(dist.get_world_size())]
        record = build_record(self.context, iteration, seconds, reports, self.rank, now=time.time())
        commit = bool(self.opts.checkpoint_dir and any(r.checkpoint_saved for r in reports))
        self._publish(record, commit)

    def _publish(self, record: dict[str, Any], commit: bool) -> None:
        if self.log is not None:
            self.log.write(record)
        if self.db_writer is not None:
            self.db_writer.write([record])
        if commit:
            checkpoint.commit(self.opts.checkpoint_dir, record["iteration"] + 1,
                              {"plan_hash": record["plan_hash"], "run": record["run"]})
        for sink in self.sinks:
            sink.write(record)
        if not self.opts.quiet:
            self.console.print(console_line(record))
        if self.progress is not None:
            self.progress.advance(record)

    def close(self) -> None:
        """Deliver this rank's reports, finish every record, and surface a failed write."""
        self.outbox.flush()
        if self.db_writer is not None:
            self._pending.append(self._thread.submit(self.db_writer.close))
        self._pending += [self._thread.submit(sink.close) for sink in self.sinks]
        self._thread.shutdown(wait=True)
        if self.progress is not None:
            self.progress.close()
        for f in self._pending:
            f.result()  # a failed write (disk full, locked database) fails the run visibly
