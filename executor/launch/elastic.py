"""Starting a plan's workers through torch's elastic launcher, and turning their failures into one message.

`hetprof run` on each host calls `launch`: it starts one worker process per planned device of that
host through `torch.distributed.launcher.api.elastic_launch` with the c10d rendezvous (the engine
behind torchrun), so several hosts meet without a protocol of our own. With `max_restarts=0` the
agent stops every local worker as soon as one dies; the survivors on other hosts fail on their next
collective (or at the process-group timeout when a peer hangs), so a run always ends in bounded time.
The agent's report names only local ranks; this module maps them back to the plan's devices.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import tempfile
from collections.abc import Collection, Iterator

from hetprof.errors import ExecutionError, HetprofError
from hetprof.executor.launch.checks import (
    check_backend,
    check_host_capacity,
    check_inputs,
    check_resumable,
    check_supported,
    host_devices,
    load_plan,
    plan_is_cpu,
    planned_hosts,
    warn_streaming,
)
from hetprof.executor.launch.sizebounds import check_run_sizes
from hetprof.executor.options import RunOptions
from hetprof.executor.records.run_log import plan_hash
from hetprof.executor.records.wandb_log import check_wandb
from hetprof.safety.process_guard import stopped_descendants_killed, workers_die_with_me
from hetprof.safety.processes import isolated_children
from hetprof.specs import Plan

# what the worker server imports before it forks workers (the runtime pulls in transformers)
WORKER_PRELOAD = ("hetprof.executor.launch.worker_entry", "hetprof.executor.loop.worker")


@contextlib.contextmanager
def worker_server(cpu: bool) -> Iterator[None]:
    """Inside, processes started through multiprocessing's forkserver fork from a server that holds
    what workers need: the runtime imported (WORKER_PRELOAD), no import from the current folder, the
    launcher's pid to die with, and one thread per core on a `cpu` plan. The server keeps what it
    was started with for the life of this process, so every later start finds the same."""
    env_before = os.environ.get("OMP_NUM_THREADS")
    if cpu:
        os.environ["OMP_NUM_THREADS"] = "1"  # one core per `cpu` slot, inherited by the worker server and its workers
    # Workers fork from one server that imported torch and the runtime once: spawned, each worker
    # imported them itself, seconds of CPU apiece, and a host with fewer cores than workers waited.
    multiprocessing.set_forkserver_preload(list(WORKER_PRELOAD))
    try:
        with isolated_children(), workers_die_with_me():
            yield
    finally:
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env_before


def node_host(plan: Plan, nnodes: int, node_rank: int) -> str:
    """The plan's host that node `node_rank` runs; refuses a node count the plan does not have."""
    hosts = planned_hosts(plan)
    if nnodes != len(hosts):
        hint = "" if len(hosts) == 1 else (f"; start `hetprof run` once per host with --nnodes {len(hosts)} "
                                          f"--node-rank R --rdzv HOST:PORT (R = 0 for {hosts[0]}, …)")
        raise HetprofError(f"the plan places tasks on {len(hosts)} host(s) ({', '.join(hosts)}) but "
                           f"--nnodes is {nnodes}{hint}")
    if not 0 <= node_rank < nnodes:
        raise HetprofError(f"--node-rank must be in [0, {nnodes}), got {node_rank}")
    return hosts[node_rank]


def describe_failures(exc: Exception, plan: Plan, host: str, log_dir: str | None = None,
                      stopped: Collection[int] = (), timeout_s: float | None = None) -> str:
    """One sentence per failed worker, naming its device and tasks; killed ones first (the cause).
    `stopped`: pids the launcher killed for staying stopped past --timeout (`timeout_s`)."""
    failures = getattr(exc, "failures", {}) or {}
    devices = host_devices(plan, host)
    tasks_of = {d: [t.task for t in plan.tasks if d in t.devices()] for d in devices}
    lines = []
    ordered = sorted(failures.items(), key=lambda kv: (kv[1].exitcode >= 0, kv[1].timestamp, kv[0]))
    for local_rank, failure in ordered:
        dev = devices[local_rank] if local_rank < len(devices) else f"local rank {local_rank}"
        how = (f"stayed stopped (not running) past --timeout {timeout_s:g} s and was killed"
               if failure.pid in stopped and timeout_s is not None
               else f"killed by signal {-failure.exitcode} ({failure.signal_name()})" if failure.exitcode < 0
               else f"exited with code {failure.exitcode}")
        message = failure.message
        if isinstance(message, dict):  # the error file's structured form: {"message": "...", "extraInfo": ...}
            message = message.get("message", "")
        message = str(message).strip().removeprefix("ExecutionError: ")
        first = message.splitlines()[0] if message and failure.exitcode >= 0 else ""
        lines.append(f"worker {dev} (tasks {', '.join(tasks_of.get(dev, [])) or '-'}; pid {failure.pid}) {how}"
                     + (f": {first}" if first and "To enable traceback" not in first else ""))
    if not lines:
        return f"the run on host {host} failed: {exc}"
    where = f" (worker logs and tracebacks: {log_dir})" if log_dir else ""
    return "the run failed — " + "; ".join(lines) + where


def launch(options: RunOptions, nnodes: int = 1, node_rank: int = 0, rdzv: str | None = None,
           local_addr: str | None = None) -> None:
    """Run the plan's workers of this host to completion; raises ExecutionError naming failed workers."""
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from hetprof.executor.launch.worker_entry import worker_main

    options.validate()
    plan = load_plan(options.plan_path, options.overrides)
    check_run_sizes(plan.workload_spec(), options.iterations)
    options = dataclasses.replace(options, backend=check_backend(plan, options.backend, options.plan_path))
    check_inputs(plan, options.plan_path, options.backend, options.reward, options.prompts, options.seed,
                 {"--log": (options.log, "file"), "--checkpoint-dir": (options.checkpoint_dir, "folder"),
                  "--db": (options.db, "file"), "--tensorboard-dir": (options.tensorboard_dir, "folder"),
                  "--trace": (options.trace_dir, "folder")},
                 options.overrides, options.allow_prompts_outside)
    check_wandb(options.wandb_project)
    check_supported(plan)
    if node_rank == 0:  # one line per run, not one per host
        warn_streaming(plan, options.plan_path)
    host = node_host(plan, nnodes, node_rank)
    if options.resume and node_rank == 0:
        check_resumable(options.checkpoint_dir, plan)
    nproc = len(host_devices(plan, host))
    check_host_capacity(plan, host)
    if nnodes > 1 and not rdzv:
        raise HetprofError("a multi-host run needs --rdzv HOST:PORT (node 0's address, reachable from all)")
    # One host: the agent's store binds port 0 itself (no other process needs to find it, and a
    # port picked beforehand could be taken before the store binds it).
    endpoint = rdzv or "127.0.0.1:0"
    if local_addr is None and nnodes > 1:
        # The cluster spec's address for this host is how the others reach it; torch would
        # otherwise advertise the host name, which need not resolve there (namespaces, NAT).
        local_addr = plan.cluster_spec().host(host).address
    log_dir = tempfile.mkdtemp(prefix="hetprof-run-")
    config = LaunchConfig(
        min_nodes=nnodes, max_nodes=nnodes, nproc_per_node=nproc,
        run_id=f"hetprof-{plan_hash(plan)}", role="hetprof-worker",
        rdzv_backend="c10d", rdzv_endpoint=endpoint,
        # Node 0 hosts the rendezvous store: in a network namespace the host name does not resolve
        # to the address the other nodes use, so torch's own "is this me?" guess would fail.
        rdzv_configs={"is_host": node_rank == 0, "join_timeout": max(60, int(options.timeout_s))},
        max_restarts=0, monitor_interval=0.2, start_method="forkserver",
        logs_specs=DefaultLogsSpecs(log_dir=log_dir), local_addr=local_addr,
        # seconds between SIGTERM and SIGKILL when the agent itself is signalled; after a worker
        # failure torch waits its own 30 s for a survivor that ignores SIGTERM
        shutdown_timeout=5,
    )
    # The agent logs each failure with its traceback at ERROR; the summary below says it once, in
    # the plan's words, and points at the files that keep the tracebacks.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        # a worker stopped past --timeout is killed, so the run ends naming it instead of its peers
        # waiting in a collective
        with worker_server(cpu=plan_is_cpu(plan)), stopped_descendants_killed(options.timeout_s) as stopped:
            elastic_launch(config, worker_main)(options, host)
    except ChildFailedError as exc:
        raise ExecutionError(describe_failures(exc, plan, host, log_dir, stopped, options.timeout_s)) from None
    except Exception as exc:  # rendezvous/agent failures: name the host and the endpoint
        if isinstance(exc, ExecutionError):
            raise
        raise ExecutionError(f"the run on host {host} (node {node_rank} of {nnodes}, rendezvous {endpoint}) "
                             f"failed: {type(exc).__name__}: {exc}") from None
