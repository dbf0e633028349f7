"""The sub-pools a user tries by hand — one region, one GPU type — as clusters of their own.

A cost objective often prefers part of a cluster (the cheap GPUs of one region) to all of it. A
search of the whole cluster reaches such a plan only through its sub-pool arms, with a share of
its budget; a search of the sub-pool alone spends all of it there. The cost search therefore
also runs on each of these clusters (hetrl `sub_pools`), so its answer is never worse than its
own answer on any of them, and the planner bench's `--cost-check` compares against the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetprof.specs import ClusterSpec

if TYPE_CHECKING:
    from hetprof.planner.simulator import Simulator


def restricted_cluster(cluster: ClusterSpec, region: str | None = None,
                       gpu_type: str | None = None) -> ClusterSpec | None:
    """The cluster cut to the whole hosts of one region and/or one GPU type, host names kept (so
    a plan on it is a plan on the cluster); links naming hosts or regions that are gone are
    dropped. None if no host is left."""
    data = cluster.to_dict()
    keep = [h for h in data["hosts"] if (region is None or h["region"] == region)
            and (gpu_type is None or cluster.catalog.lookup(h["gpus"]["type"]).name == gpu_type)]
    if not keep:
        return None
    names = {h["region"] for h in keep}
    for h in keep:
        count = h.get("count", 1)
        names |= {h["name"]} if count == 1 else {f"{h['name']}-{k}" for k in range(count)}
    network = dict(data.get("network") or {})
    network["links"] = [lk for lk in network.get("links", []) if all(n in names for n in lk["between"])]
    label = "-".join(x for x in (region, gpu_type) if x)
    return ClusterSpec.from_dict({**data, "name": f"{cluster.name}-{label}", "hosts": keep, "network": network})


def sub_clusters(cluster: ClusterSpec) -> list[tuple[str, ClusterSpec]]:
    """Each region and each GPU type of the cluster on its own, where there are several."""
    out: list[tuple[str, ClusterSpec | None]] = []
    regions = cluster.regions()
    types = sorted(cluster.gpu_counts())
    if len(regions) > 1:
        out += [(f"region {r}", restricted_cluster(cluster, region=r)) for r in regions]
    if len(types) > 1:
        out += [(f"type {t}", restricted_cluster(cluster, gpu_type=t)) for t in types]
    return [(name, c) for name, c in out if c is not None]


def sub_simulator(sim: Simulator, cluster: ClusterSpec) -> Simulator:
    """A simulator of the same problem on a sub-cluster (the same lengths seed and settings)."""
    from hetprof.planner.simulator import Simulator

    return Simulator(cluster, sim.workload, sim.cost_model, seed=sim.seed, streaming=sim.streaming,
                     executable=sim.executable, backend=sim.backend)
