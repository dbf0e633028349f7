"""The vocabulary and the files users write and share: cluster spec, workload spec, plan (DESIGN §2),
and each task's parallel layout (layout.py: the one type the planner, the plan and the executor share).

The GPU catalog (catalog.py), model shapes (models.py) and units (units.py) live here too: a
cluster spec names its GPU types from the catalog, so the catalog sits beside the specs, not above.
"""

from hetprof.specs.cluster import ClusterSpec, Device, GpuSlot, Host, LinkOverride, LinkParams, NetworkSpec
from hetprof.specs.layout import SHARDING, TaskLayout
from hetprof.specs.plan import (
    FOLLOWS,
    GENERATION_BACKENDS,
    RUNNABLE_BACKENDS,
    TASKS,
    Group,
    Plan,
    Prediction,
    TaskPlacement,
    workload_tasks,
)
from hetprof.specs.training_setup import DataParams, OptimizerParams
from hetprof.specs.vocabulary import Role, SyncEdge, Task, TaskKind
from hetprof.specs.workload import GenerationParams, LengthDist, ModelRoles, TrainingParams, WorkloadSpec

__all__ = [
    "ClusterSpec", "Device", "GpuSlot", "Host", "LinkOverride", "LinkParams", "NetworkSpec",
    "FOLLOWS", "GENERATION_BACKENDS", "RUNNABLE_BACKENDS", "SHARDING", "TASKS", "Group", "Plan", "Prediction", "TaskLayout",
    "TaskPlacement", "workload_tasks",
    "DataParams", "OptimizerParams", "GenerationParams", "LengthDist", "ModelRoles", "TrainingParams", "WorkloadSpec",
    "Role", "SyncEdge", "Task", "TaskKind",
]
