"""The files users write and share: cluster spec, workload spec, plan (DESIGN §2)."""

from hetprof.specs.cluster import ClusterSpec, Device, GpuSlot, Host, LinkOverride, LinkParams, NetworkSpec
from hetprof.specs.plan import TASKS, Group, Layout, Plan, Prediction, Tasklet, TaskPlacement, workload_tasks
from hetprof.specs.vocabulary import Role, SyncEdge, Task, TaskKind
from hetprof.specs.workload import LengthDist, ModelRoles, TrainingParams, WorkloadSpec

__all__ = [
    "ClusterSpec", "Device", "GpuSlot", "Host", "LinkOverride", "LinkParams", "NetworkSpec",
    "TASKS", "Group", "Layout", "Plan", "Prediction", "TaskPlacement", "Tasklet", "workload_tasks",
    "LengthDist", "ModelRoles", "TrainingParams", "WorkloadSpec",
    "Role", "SyncEdge", "Task", "TaskKind",
]
