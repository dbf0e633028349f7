"""Memory of colocated tasks: per device, the peak bytes of a group's tasks and what they offload.

Tasks that share a device keep their weights/optimizer state resident when everything fits (only
one task's activations or KV cache live at a time); otherwise — or when the group offloads by
configuration, as verl's hybrid engine does every step whatever fits — each task reloads its state
before it runs and offloads it after, over the host link. A follower (the log-prob pass) reads its
leader's weights: it adds only its working set.
"""

from __future__ import annotations

from collections.abc import Mapping

from hetprof.planner.memo import memoised
from hetprof.planner.taskcosts import TaskCosts
from hetprof.specs import FOLLOWS, Device
from hetprof.specs.layout import TaskLayout

RESIDENCY_MEMO = 20_000   # (group layouts, offload) answers kept

# per device peak bytes; per task (reload s, offload s); problems
Residency = tuple[dict[str, float], dict[str, tuple[float, float]], list[str]]


class GroupMemory:
    """Residency of task groups on one cluster, priced by one TaskCosts; memoised per group."""

    def __init__(self, costs: TaskCosts, devices: Mapping[str, Device], capacity: Mapping[str, float],
                 cost_model) -> None:
        self.costs, self.devices, self.capacity, self.cost_model = costs, devices, capacity, cost_model

    @memoised(RESIDENCY_MEMO)
    def residency(self, layouts: tuple[TaskLayout, ...], offload: bool = False) -> Residency:
        """Per device: peak bytes, and whether the group's tasks must offload between phases."""
        per_device: dict[str, list[tuple[str, object]]] = {}
        for lay in layouts:
            for d, est in self.costs.evaluate(lay).memory.items():
                per_device.setdefault(d, []).append((lay.task, est))
        peaks: dict[str, float] = {}
        swap: dict[str, float] = {}
        problems: list[str] = []
        for d, items in per_device.items():
            cap = self.capacity[d]
            here = {t for t, _ in items}
            own = [(t, e) for t, e in items if FOLLOWS.get(t) not in here]
            resident = sum(e.offloadable for _, e in own) + max(e.total - e.offloadable for _, e in items)
            if len(items) == 1 or (resident <= cap and not offload):
                peaks[d] = resident if len(items) > 1 else items[0][1].total
                continue
            peaks[d] = max(e.total for _, e in items)
            dtype_ = self.devices[d].type
            held = dict(items)
            for task, e in items:  # a follower reloads the weights its leader holds (shards, if sharded)
                moved = held[FOLLOWS[task]].weights if FOLLOWS.get(task) in held else e.offloadable
                swap[task] = max(swap.get(task, 0.0), self.cost_model.host_transfer_time(moved, dtype_))
        return peaks, {t: (s, s) for t, s in swap.items()}, problems
