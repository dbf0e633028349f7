"""What every export target shares: refusing what it cannot express, and files whose numbers trace to the plan.

A target turns a Plan into named files. Every number it writes is a `Setting`: the framework's key,
the value and where in the plan (or its embedded workload and cluster) the value comes from; the
settings are written once more as `trace.tsv`, so each override can be followed back to the plan.
"""

from __future__ import annotations

import abc
import dataclasses
from collections import Counter
from pathlib import Path

from hetprof.errors import ExportRefused
from hetprof.specs import expressible
from hetprof.specs.plan import Plan


@dataclasses.dataclass(frozen=True)
class Setting:
    """One framework setting: its key, value, and the plan field it comes from."""

    key: str
    value: object
    source: str

    def override(self) -> str:
        """Hydra's `key=value` (Python's True/False/None spelt as YAML)."""
        v = self.value
        text = {True: "true", False: "false", None: "null"}.get(v, v) if isinstance(v, bool | None) else v
        return f"{self.key}={text}"


@dataclasses.dataclass(frozen=True)
class PoolShape:
    """A plan group as a framework pool: nodes × GPUs per node (of one GPU type per node)."""

    name: str
    hosts: tuple[str, ...]
    gpus_per_node: int
    gpu_types: tuple[str, ...]
    regions: tuple[str, ...]

    @property
    def nnodes(self) -> int:
        return len(self.hosts)

    @property
    def gpus(self) -> int:
        return self.nnodes * self.gpus_per_node


class Target(abc.ABC):
    """An export target: `name` (set by the registry), its rules (hetprof/specs/expressible.py) and files."""

    name = ""

    def check(self, plan: Plan) -> None:
        """Raise ExportRefused naming the first feature the plan needs that this target cannot express."""
        found = expressible.problems(self.name, expressible.plan_arrangement(plan))
        if found:
            raise ExportRefused(expressible.refusal(self.name, *found[0]))
        share = plan.workload_spec().training.optimizer_offload
        if share > 0:  # never export a plan whose memory needs a setting the files would leave out
            raise ExportRefused(f"{self.name}: workload.training.optimizer_offload {share:g}: the exported files "
                                f"do not set a host-held optimizer; the plan's memory needs it")

    @abc.abstractmethod
    def files(self, plan: Plan, plan_path: str) -> dict[str, str]:
        """File name → text of everything the framework needs to run the plan (plan already checked)."""

    def export(self, plan: Plan, plan_path: str, out: Path) -> list[Path]:
        self.check(plan)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for name, text in self.files(plan, plan_path).items():
            (out / name).write_text(text)
            written.append(out / name)
        return written


def pool_shapes(plan: Plan) -> dict[str, PoolShape]:
    """Each group of the plan as nodes × GPUs per node (the plan has passed the whole-nodes and GPU-type rules)."""
    devices = {d.id: d for d in plan.cluster_spec().devices()}
    out = {}
    for g in plan.groups:
        per = Counter(devices[d].host for d in g.devices)
        out[g.name] = PoolShape(g.name, tuple(per), next(iter(per.values())),
                                tuple(sorted({devices[d].type for d in g.devices})),
                                tuple(sorted({devices[d].region for d in g.devices})))
    return out


def trace_table(settings: list[Setting]) -> str:
    """`trace.tsv`: one row per setting: key, value, the plan field it comes from."""
    rows = ["key\tvalue\tfrom the plan"] + [f"{s.key}\t{s.value}\t{s.source}" for s in settings]
    return "\n".join(rows) + "\n"


def task_index(plan: Plan, task: str) -> int:
    return next(i for i, t in enumerate(plan.tasks) if t.task == task)


def group_index(plan: Plan, name: str) -> int:
    return next(i for i, g in enumerate(plan.groups) if g.name == name)


def resource_name(text: str) -> str:
    """A Ray custom resource name: letters, digits, '_' and '-'."""
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in text)


def ray_node_lines(plan: Plan, shapes: dict[str, PoolShape]) -> list[str]:
    """One `ray start` per host: its GPUs as resources named for the pool, the host's GPU type and its
    region, so a placement group asking for them lands on that pool's hosts only."""
    device = {d.host: d for d in plan.cluster_spec().devices()}
    lines = []
    for shape in shapes.values():
        for host in shape.hosts:
            n = shape.gpus_per_node
            res = {f"pool_{resource_name(shape.name)}": n, resource_name(device[host].type): n,
                   f"region_{resource_name(device[host].region)}": n}
            body = ", ".join(f'"{k}": {v}' for k, v in res.items())
            lines.append(f"  {host}) ray start $RAY_ARGS --num-gpus {shape.gpus_per_node} --resources '{{{body}}}' ;;")
    return lines
