"""Up-front feasibility: does every task of a workload fit on some GPU type of the cluster?

Checked once before a search, so a model too large for the cluster fails with the closest fit named
instead of a search that finds no plan.
"""

from __future__ import annotations

from typing import Protocol

from hetprof.errors import InfeasibleError
from hetprof.planner.graph import RLGraph
from hetprof.planner.taskcosts import TaskCosts
from hetprof.specs import ClusterSpec, executable
from hetprof.specs.catalog import Catalog
from hetprof.specs.vocabulary import TaskKind

GB = 1e9


class FitsView(Protocol):
    """What the check reads of a simulator; a protocol so this module need not import the simulator."""

    cluster: ClusterSpec
    catalog: Catalog
    graph: RLGraph
    tasks: list[str]
    costs: TaskCosts
    executable: bool


def check_fits(sim: FitsView, max_tp: int = 8, max_pp: int = 4) -> None:
    """Raise InfeasibleError if some task fits on no GPU type of the cluster at any allowed TP × PP.

    TP stays within one host (as every RL system shards it); PP may span hosts.
    """
    per_host: dict[str, int] = {}
    for h in sim.cluster.expanded_hosts():
        t = sim.catalog.lookup(h.gpus.type).name
        per_host[t] = max(per_host.get(t, 0), h.gpus.count)
    counts = sim.cluster.gpu_counts()
    for task in sim.tasks:
        model = sim.graph.model_of(task)
        best: tuple[float, str] | None = None
        fits = False
        stages = min(max_pp, model.layers)
        if sim.executable and not executable.may_pipeline(task):
            stages = 1
        for t, host_gpus in per_host.items():
            tps = [x for x in (1, 2, 4, 8, 16) if x <= min(max_tp, host_gpus)
                   and (not sim.executable or executable.tp_divides(model, x))]
            for tp in tps:
                for pp in range(1, stages + 1):
                    if tp * pp > counts[t]:
                        break
                    layers = -(-model.layers // pp)
                    est = sim.costs.memory(task, t, tp, layers, 1)
                    need = est.total if sim.graph.kind_of(task) != TaskKind.GENERATION else est.weights + est.activations
                    if need <= sim.catalog.lookup(t).memory_bytes:
                        fits = True
                        break
                    if best is None or need / sim.catalog.lookup(t).memory_bytes < best[0]:
                        best = (need / sim.catalog.lookup(t).memory_bytes,
                                f"{need / GB:.1f} GB per GPU on {t} ({sim.catalog.lookup(t).memory_GB:.0f} GB) at TP{tp}×PP{pp}")
                if fits:
                    break
            if fits:
                break
        if not fits:
            limit = (f"no pipeline stages (`hetprof run` runs none for {task}; --any-layout plans without "
                     f"its limits)" if stages == 1 and max_pp > 1 else f"PP ≤ {max_pp}")
            raise InfeasibleError(
                f"{task} ({model.name}) fits on no GPU of cluster {sim.cluster.name!r} with TP ≤ {max_tp} "
                f"(within a host) and {limit}: the closest needs {best[1] if best else 'more memory'}; "
                f"allow more --max-tp/--max-pp, add larger GPUs, or use a smaller model")
