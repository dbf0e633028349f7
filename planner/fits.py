"""Up-front feasibility: does every task of a workload fit on some GPU type of the cluster?

Checked once before a search, so a model too large for the cluster fails with the closest fit named
instead of a search that finds no plan.
"""

from __future__ import annotations

from hetprof.errors import InfeasibleError
from hetprof.planner.planning import PlanningContext
from hetprof.specs import executable
from hetprof.specs.vocabulary import TaskKind

GB = 1e9


def check_fits(planning: PlanningContext, max_tp: int = 8, max_pp: int = 4) -> None:
    """Raise InfeasibleError if some task fits on no GPU type of the cluster at any allowed TP × PP.

    TP stays within one host (as every RL system shards it); PP may span hosts.
    """
    per_host: dict[str, int] = {}
    for h in planning.cluster.expanded_hosts():
        t = planning.catalog.lookup(h.gpus.type).name
        per_host[t] = max(per_host.get(t, 0), h.gpus.count)
    counts = planning.cluster.gpu_counts()
    for task in planning.tasks:
        model = planning.model_of(task)
        best: tuple[float, str] | None = None
        fits = False
        stages = min(max_pp, model.layers)
        if planning.executable and not executable.may_pipeline(task):
            stages = 1
        for t, host_gpus in per_host.items():
            tps = [x for x in (1, 2, 4, 8, 16) if x <= min(max_tp, host_gpus)
                   and (not planning.executable or executable.tp_divides(model, x))]
            for tp in tps:
                for pp in range(1, stages + 1):
                    if tp * pp > counts[t]:
                        break
                    layers = -(-model.layers // pp)
                    est = planning.replica_memory(task, t, tp, layers, 1)
                    need = est.total if planning.kind_of(task) != TaskKind.GENERATION else est.weights + est.activations
                    if need <= planning.catalog.lookup(t).memory_bytes:
                        fits = True
                        break
                    if best is None or need / planning.catalog.lookup(t).memory_bytes < best[0]:
                        best = (need / planning.catalog.lookup(t).memory_bytes,
                                f"{need / GB:.1f} GB per GPU on {t} ({planning.catalog.lookup(t).memory_GB:.0f} GB) at TP{tp}×PP{pp}")
                if fits:
                    break
            if fits:
                break
        if not fits:
            limit = (f"no pipeline stages (`hetprof run` runs none for {task}; --any-layout plans without "
                     f"its limits)" if stages == 1 and max_pp > 1 else f"PP ≤ {max_pp}")
            raise InfeasibleError(
                f"{task} ({model.name}) fits on no GPU of cluster {planning.cluster.name!r} with TP ≤ {max_tp} "
                f"(within a host) and {limit}: the closest needs {best[1] if best else 'more memory'}; "
                f"allow more --max-tp/--max-pp, add larger GPUs, or use a smaller model")
