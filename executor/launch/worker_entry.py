"""The first code a worker runs: pick its device, join the process group, run, tear down.

Torch's elastic agent starts one process per planned device of the host and sets RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT; local rank i runs the host's i-th planned device.

The launcher imports this module only to name `worker_main`; the runtime (and with it transformers)
is imported by the server workers fork from (`launch.WORKER_PRELOAD`) or inside the worker, never in the
launching process, so it stays light.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import signal
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from hetprof.errors import ExecutionError
from hetprof.executor.launch.checks import check_supported, device_kinds, host_devices, load_plan
from hetprof.executor.launch.peerloss import linger_if_peer_lost
from hetprof.executor.options import RunOptions
from hetprof.executor.parallel.process_groups import ProcessGroups
from hetprof.executor.parallel.topology import Topology
from hetprof.runtime.cpuslots import bind_to_slot
from hetprof.runtime.distributed import leave_process_group
from hetprof.runtime.hostmemory import keep_freed_memory
from hetprof.safety.process_guard import die_with_launcher
from hetprof.safety.processes import die_with_parent, skip_teardown_at_exit
from hetprof.specs import Plan


def worker_main(options: RunOptions, host: str) -> None:
    """Entry point of one worker process.

    A failed worker leaves at once: its error is already in the agent's error file, and the
    interpreter's normal teardown would run gloo's destructors, which can wait forever on a hung peer.
    """
    die_with_parent()  # a launcher killed outright takes its workers with it: directly,
    die_with_launcher()  # or through the forkserver between them (process_guard.py says why)
    try:
        _worker(options, host)
        skip_teardown_at_exit()  # success: nothing left for the interpreter's slow teardown
    except BaseException as exc:
        sys.stdout.flush()
        sys.stderr.flush()
        linger_if_peer_lost(exc)  # so the agent names the peer that died first (peerloss.py)
        os._exit(1)


@record
def _worker(options: RunOptions, host: str) -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID` shows where a worker waits
    keep_freed_memory()  # the allocator the profiler measured under (hostmemory.py says why)
    plan = load_plan(options.plan_path, options.overrides)
    backend = check_supported(plan)
    local, cluster = host_devices(plan, host), plan.cluster_spec()
    device_id = local[int(os.environ["LOCAL_RANK"])]
    kinds = device_kinds(cluster, local)  # one pass over the cluster, however many devices
    if kinds[device_id] == "cpu":
        torch.set_num_threads(1)  # a `cpu` slot is one core, as the profiler measured it
        slots = [d for d in local if kinds[d] == "cpu"]
        bind_to_slot(slots.index(device_id), len(slots))  # before gloo starts its threads (cpuslots.py says why)
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", int(device_id.rsplit(":", 1)[1]))
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=options.timeout_s))
    _run(options, plan, device_id, device)
    # Torn down only on success, once the worker and its groups are out of scope: after a failure a
    # peer may be dead or hung and tearing down could wait on it; the process exits and the agent
    # stops the rest.
    leave_process_group()


def _run(options: RunOptions, plan: Plan, device_id: str, device: torch.device) -> None:
    """Meet the other workers, build the topology and the process groups, and run the loop."""
    from hetprof.executor.loop.worker import Worker  # in the worker only (module docstring)

    ids: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ids, device_id)
    if len(set(ids)) != len(ids):
        raise ExecutionError(f"two workers claim the same device: {sorted(ids)}")
    topo = Topology(plan, {d: r for r, d in enumerate(ids)})
    groups = ProcessGroups.build(topo)
    worker = Worker(options, topo, groups, dist.get_rank(), device)
    try:
        worker.run()
    finally:  # an engine with processes of its own (vLLM) stops them here, not at interpreter exit
        worker.close()
