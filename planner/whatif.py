"""What-if edits of a cluster: "add 8xH100@us-east", "remove 4xL4", "link us-east:eu-west 10ms 5Gbps".

Each edit returns a new, validated ClusterSpec (the input is never changed), so `hetprof plan
--what-if` can re-plan the changed fleet and show both answers side by side.
"""

from __future__ import annotations

import copy
import re

from hetprof.errors import SpecError
from hetprof.specs import ClusterSpec
from hetprof.specs.cluster import with_catalog_types
from hetprof.specs.loader import to_data
from hetprof.specs.units import parse_duration, parse_rate

GPUS_PER_HOST = 8
_ADD = re.compile(r"^add\s+(\d+)\s*[x×]\s*([\w.\-]+?)\s*@\s*([\w.\-]+)(?:\s+per-host\s+(\d+))?$", re.I)
_REMOVE = re.compile(r"^remove\s+(\d+)\s*[x×]\s*([\w.\-]+?)(?:\s*@\s*([\w.\-]+))?$", re.I)
_LINK = re.compile(r"^link\s+([\w.\-]+)\s*[:<\->]+\s*([\w.\-]+)\s+(\S+)\s+(\S+)$", re.I)

GRAMMAR = ('"add N×TYPE@REGION [per-host K]", "remove N×TYPE[@REGION]", '
           '"link A:B LATENCY BANDWIDTH" (A, B: regions or hosts); several edits separated by ";"')


def apply_what_if(cluster: ClusterSpec, text: str) -> ClusterSpec:
    """The cluster after every ";"-separated edit in `text`, applied in order."""
    edits = [e.strip() for e in text.split(";") if e.strip()]
    if not edits:
        raise SpecError("--what-if", "", GRAMMAR, text)
    for edit in edits:
        cluster = apply_edit(cluster, edit)
    return cluster


def apply_edit(cluster: ClusterSpec, edit: str) -> ClusterSpec:
    data = copy.deepcopy(cluster.to_dict())
    if m := _ADD.match(edit):
        count, gpu, region, per_host = int(m.group(1)), _gpu(cluster, m.group(2), edit), m.group(3), m.group(4)
        _add(data, count, gpu, region, int(per_host) if per_host else GPUS_PER_HOST, edit)
    elif m := _REMOVE.match(edit):
        _remove(data, int(m.group(1)), _gpu(cluster, m.group(2), edit), m.group(3), edit)
    elif m := _LINK.match(edit):
        _link(data, cluster, m.group(1), m.group(2), m.group(3), m.group(4), edit)
    else:
        raise SpecError("--what-if", "", GRAMMAR, edit)
    data = with_catalog_types(data, cluster.catalog)  # an added type the spec did not list yet travels with it
    try:
        return ClusterSpec.from_dict(data, file="<what-if>").using(cluster.base_catalog)
    except SpecError as exc:
        raise SpecError("--what-if", exc.field, exc.expected, f"{exc.got} after {edit!r}") from None


def _gpu(cluster: ClusterSpec, name: str, edit: str) -> str:
    """The catalog name of a GPU type: the built-in catalog's or one the spec's gpu_types define."""
    canon = cluster.catalog.canonical_name(name)
    if canon is None:
        raise SpecError("--what-if", "", "a known GPU type (" + ", ".join(cluster.catalog.known_types()) + ")",
                        f"{name} in {edit!r}")
    return canon


def _add(data: dict, count: int, gpu: str, region: str, per_host: int, edit: str) -> None:
    if count < 1 or per_host < 1:
        raise SpecError("--what-if", "", "a positive GPU count", edit)
    taken = {h["name"] for h in data["hosts"]} | set(ClusterSpec.from_dict(data).host_names())
    base = f"{gpu.lower()}-{region}-added"
    i = 0
    while count > 0:
        while f"{base}-{i}" in taken:
            i += 1
        n = min(per_host, count)
        data["hosts"].append({"name": f"{base}-{i}", "gpus": {"type": gpu, "count": n}, "region": region})
        taken.add(f"{base}-{i}")
        count -= n


def _remove(data: dict, count: int, gpu: str, region: str | None, edit: str) -> None:
    """Take GPUs away from the last matching hosts first; hosts left with none disappear."""
    spec = ClusterSpec.from_dict(data)
    expanded = spec.expanded_hosts()
    hosts = [to_data(h) for h in expanded]
    match = [i for i, h in enumerate(expanded)
             if spec.catalog.canonical_name(h.gpus.type) == gpu and (region is None or h.region == region)]
    have = sum(expanded[i].gpus.count for i in match)
    if have < count:
        where = f" in region {region}" if region else ""
        raise SpecError("--what-if", "", f"at most {have} {gpu} GPU(s) to remove{where}", edit)
    for i in reversed(match):
        if count == 0:
            break
        take = min(count, hosts[i]["gpus"]["count"])
        hosts[i]["gpus"]["count"] -= take
        count -= take
    data["hosts"] = [h for h in hosts if h["gpus"]["count"] > 0]
    if not data["hosts"]:
        raise SpecError("--what-if", "", "a cluster with at least one GPU left", edit)
    # Links that named a host or region which is now gone describe nothing; drop them.
    left = {h["name"] for h in data["hosts"]} | {h.get("region", "default") for h in data["hosts"]}
    network = data.get("network", {})
    if network.get("links"):
        network["links"] = [x for x in network["links"] if set(x["between"]) <= left]


def _link(data: dict, cluster: ClusterSpec, a: str, b: str, latency: str, bandwidth: str, edit: str) -> None:
    known = set(cluster.host_names()) | set(cluster.regions())
    for name in (a, b):
        if name not in known:
            raise SpecError("--what-if", "", "region or host names of the cluster (" + ", ".join(sorted(known)) + ")",
                            f"{name} in {edit!r}")
    try:
        parse_duration(latency)
        parse_rate(bandwidth)
    except ValueError as exc:
        raise SpecError("--what-if", "", "a latency like 10ms and a bandwidth like 5Gbps", f"{exc} in {edit!r}") from None
    network = data.setdefault("network", {})
    links = [x for x in network.get("links", []) if set(x["between"]) != {a, b}]
    links.append({"between": [a, b], "latency": latency, "bandwidth": bandwidth})
    network["links"] = links
