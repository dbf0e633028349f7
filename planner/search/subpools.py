"""The sub-pools a user tries by hand — one region, one GPU type — as clusters of their own.

A cost objective often prefers part of a cluster (the cheap GPUs of one region) to all of it. A
search of the whole cluster reaches such a plan only through its sub-pool arms, with a share of
its budget; a search of the sub-pool alone spends all of it there. The cost search therefore
also runs on each of these clusters and on each GPU type within a region (hetrl `sub_pools`):
a cost search of a region or a type tries its own sub-pools, so these are what it would reach,
and the whole cluster's answer is never worse than the same search's answer on any of them. The
planner bench's `--cost-check` compares against that.
"""

from __future__ import annotations

from hetprof.specs import ClusterSpec


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


def sub_clusters(cluster: ClusterSpec, within: bool = False) -> list[tuple[str, ClusterSpec]]:
    """Each region and each GPU type of the cluster on its own, where there are several; with
    `within` also each GPU type within a region (what the same search of a region or of a type
    would itself try). One entry per distinct set of hosts."""
    out: list[tuple[str, ClusterSpec | None]] = []
    regions = cluster.regions()
    types = sorted(cluster.gpu_counts())
    if len(regions) > 1:
        out += [(f"region {r}", restricted_cluster(cluster, region=r)) for r in regions]
    if len(types) > 1:
        out += [(f"type {t}", restricted_cluster(cluster, gpu_type=t)) for t in types]
    if within and len(regions) > 1 and len(types) > 1:
        out += [(f"{t} in {r}", restricted_cluster(cluster, region=r, gpu_type=t)) for r in regions for t in types]
    seen: set[frozenset[str]] = {frozenset(cluster.host_names())}
    kept = []
    for name, sub in out:
        if sub is not None and frozenset(sub.host_names()) not in seen:
            seen.add(frozenset(sub.host_names()))
            kept.append((name, sub))
    return kept
