"""Before any worker starts: which devices and hosts a plan uses, and whether this executor can carry it out.

The plan names devices (`host:index`); the launcher on each host starts one worker per planned device
of that host, local rank i running the host's i-th device. Anything the runtime cannot carry out
(see `check_supported`: pipelined generation, a GPU plan on a machine without CUDA, ...) is refused
here, naming the task and its layout, so a run fails in the launcher rather than in a collective.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hetprof.errors import ExecutionError, HetprofError
from hetprof.specs import RUNNABLE_BACKENDS, ClusterSpec, Plan
from hetprof.specs.executable import layout_problems


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file (what every worker and the launcher start from)."""
    plan = Plan.load(path)
    plan.validate()
    return plan


def planned_devices(plan: Plan) -> list[str]:
    """The devices the plan's tasks use, in cluster order (hosts as listed, then index)."""
    used = {d for t in plan.tasks for d in t.devices()}
    return [d.id for d in plan.cluster_spec().devices() if d.id in used]


def planned_hosts(plan: Plan) -> list[str]:
    """Hosts holding at least one planned device, in cluster order: node rank R runs host R."""
    hosts: list[str] = []
    for dev in planned_devices(plan):
        host = dev.rsplit(":", 1)[0]
        if host not in hosts:
            hosts.append(host)
    return hosts


def host_devices(plan: Plan, host: str) -> list[str]:
    """Planned devices of one host: local rank i of that host's launcher runs the i-th."""
    return [d for d in planned_devices(plan) if d.rsplit(":", 1)[0] == host]


def device_kind(cluster: ClusterSpec, device_id: str) -> str:
    """'cpu' for CPU worker slots, 'cuda' for GPUs."""
    for d in cluster.devices():
        if d.id == device_id:
            return "cpu" if d.type == "cpu" else "cuda"
    raise ExecutionError(f"device {device_id} is not in the plan's cluster")


def check_supported(plan: Plan, cuda_available: bool | None = None) -> str:
    """Refuse what this executor cannot carry out; returns the torch.distributed backend to use.

    Carried out: data parallelism everywhere (uneven shares); tensor parallelism (torch's
    tensor-parallel API over each stage's devices) for every task; pipeline stages
    (torch.distributed.pipelining, the plan's layer split) for training tasks and for the reference
    and reward models, combined with TP and DP. Refused, naming the task and its layout, what
    `hetprof.specs.executable` lists (the planner plans within the same rules): pipeline stages for
    actor_gen and critic_infer, a pipelined training task whose replicas split the layers
    differently, a TP degree that does not divide the heads, KV heads and FFN width; and here two
    replicas of one task on one device, and a GPU plan on a machine without CUDA.
    """
    roles = plan.workload_spec().roles()
    for t in plan.tasks:
        splits = [tuple(k.layer_end - k.layer_start for k in sorted(t.tasklets, key=lambda k: k.stage) if k.replica == r)
                  for r in sorted({k.replica for k in t.tasklets})]
        problems = layout_problems(t.task, t.kind, roles[t.role], t.layout.tp, t.layout.pp, splits, str(t.layout),
                                   t.layout.sharding)
        if problems:
            raise ExecutionError(f"{problems[0]}; it is refused rather than changed — replan with `hetprof plan` "
                                 f"(it plans within what `hetprof run` carries out unless given --any-layout) "
                                 f"or edit the plan")
        devices = t.devices()
        if len(set(devices)) != len(devices):
            raise ExecutionError(f"task {t.task} places two replicas on one device ({devices}); "
                                 f"one device runs one replica of a task")
    cluster = plan.cluster_spec()
    kinds = {device_kind(cluster, d) for d in planned_devices(plan)}
    if kinds == {"cpu"}:
        return "gloo"
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if not cuda_available:
        raise ExecutionError("the plan places tasks on GPUs but this machine has no CUDA device; "
                             "plan for a cluster of `type: cpu` slots to run without a GPU")
    if kinds == {"cuda"}:
        return "nccl"
    return "gloo"  # mixed CPU slots and GPUs: gloo reaches both


def check_backend(plan: Plan, backend: str | None, path: str | Path = "the plan") -> str:
    """The generation backend to run: the plan's own, or `backend` if it is the same one.

    A plan's generation times were priced for one engine (continuous batching or the padded loop),
    so running it with another would measure something the plan did not predict: refused (exit 2).
    """
    if plan.backend not in RUNNABLE_BACKENDS:
        raise HetprofError(f"{path} was planned for the {plan.backend} generation backend, which `hetprof run` "
                           f"cannot run (it runs {', '.join(RUNNABLE_BACKENDS)}): replan with `hetprof plan --backend "
                           f"{RUNNABLE_BACKENDS[0]}` or `--backend {RUNNABLE_BACKENDS[1]}`")
    if backend is None or backend == plan.backend:
        return plan.backend
    raise HetprofError(f"{path} was planned for the {plan.backend} generation backend, not {backend} (--backend): "
                       f"run it with --backend {plan.backend} or replan with `hetprof plan --backend {backend}`")


def plan_is_cpu(plan: Plan) -> bool:
    """Whether every planned device is a `cpu` worker slot (one core each)."""
    cluster = plan.cluster_spec()
    used = {d for t in plan.tasks for d in t.devices()}
    return all(d.type == "cpu" for d in cluster.devices() if d.id in used)


def check_resumable(checkpoint_dir: str | Path, plan: Plan) -> int:
    """Refuse --resume before any worker starts when there is nothing (or another plan's) to resume."""
    from hetprof.executor.checkpoint import committed
    from hetprof.executor.records import plan_hash

    meta = committed(checkpoint_dir)
    if meta is None:
        raise ExecutionError(f"--resume: no complete checkpoint under {checkpoint_dir}")
    if meta.get("plan_hash") != plan_hash(plan):
        raise ExecutionError(f"--resume: the checkpoint under {checkpoint_dir} was made for plan "
                             f"{meta.get('plan_hash')}, not this plan ({plan_hash(plan)})")
    return int(meta["iteration"])
