"""Seconds of the data that crosses between task groups: forward edges and weight syncs.

Forward data goes over the links between the hosts that hold it; the trainer's weights go to their
consumers over the slowest link of the sync set, or are resharded in place when the consumer sits
on the trainer's GPUs. Both are memoised per pair of layouts (planner.memo).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from hetprof.planner.graph import Edge, RLGraph
from hetprof.planner.links import LinkTable
from hetprof.planner.memo import memoised
from hetprof.planner.taskcosts import TaskCosts
from hetprof.specs import Device, WorkloadSpec
from hetprof.specs.layout import TaskLayout
from hetprof.specs.vocabulary import TaskKind

TRANSFER_MEMO = 20_000   # pairs of layouts whose transfer profile or weight sync is kept


class Transfers:
    """Prices cross-group edges of one (cluster, workload, cost model)."""

    def __init__(self, costs: TaskCosts, graph: RLGraph, workload: WorkloadSpec, devices: Mapping[str, Device],
                 links: LinkTable, cost_model, backend: str) -> None:
        self.costs, self.graph, self.workload, self.devices = costs, graph, workload, devices
        self.links, self.cost_model, self.backend = links, cost_model, backend
        self.host_gpus = Counter(dev.host for dev in devices.values())   # GPUs per host share its cards

    def edge_seconds(self, edge: Edge, src: TaskLayout, dst: TaskLayout) -> float:
        """Forward data of one step between two groups, over the links between the hosts holding it.

        Sample r of the producer goes to the consumer replica that processes it, so host pair (a, b)
        moves payload × f_a × f_b; each host's interface carries its flows in turn, so the busiest
        sender or receiver decides (LinkTable.transfer_profile). The profile is linear in the
        payload, so it is computed once per pair of layouts and shared by every edge between them.
        """
        latency, per_byte = self._profile(src, dst)
        basis = self.costs.basis
        total = edge.payload_bytes(self.workload.sequences_per_step, basis.prompt + basis.response)
        return latency + total * per_byte if total > 0 else 0.0

    @memoised(TRANSFER_MEMO)
    def _profile(self, src: TaskLayout, dst: TaskLayout) -> tuple[float, float]:
        return self.links.transfer_profile(self.costs.evaluate(src).host_vector, self.costs.evaluate(dst).host_vector)

    @memoised(TRANSFER_MEMO)
    def weight_sync_seconds(self, edge: Edge, train: TaskLayout, gen: TaskLayout) -> float:
        """Trainer -> consumer weights over the slowest link of the sync set: broadcast, shards in parallel
        from the trainer's tp*pp ranks in one region (across regions the weights cross once); resharded
        in place when the consumer sits on the trainer's GPUs (CostModel.reshard_time)."""
        hosts = {self.devices[d].host for d in train.devices()} | {self.devices[d].host for d in gen.devices()}
        link = self.links.slowest(hosts) or self.links.between(*hosts, *hosts)  # one host: its own link
        shards = 1 if self.links.spans_regions(hosts) else train.tp * train.pp
        model = self.graph.models[edge.model]
        precision = self.workload.weights_dtype  # what the trainer holds and sends
        if set(gen.devices()) <= set(train.devices()):  # colocated: reshard in place on every GPU
            # a layer's width is cut by TP, its experts also by EP, everything by FSDP; layers by PP
            pieces = (train.tp * (train.ep if model.moe is not None else 1)
                      * (train.dp if train.sharding == "fsdp" else 1))
            # across hosts, every generator GPU of a host gathers through that host's network cards at once;
            # the smallest-TP generator gathers the largest shard, so it finishes last
            per_host = Counter(self.devices[d].host for d in gen.devices())
            flows = max(per_host.values()) if not self.links.one_nvlink_domain(hosts) else 1  # NVLink: a link per GPU
            seconds = self.cost_model.reshard_time(model, link, min(gen.tp_degrees()), pieces, precision, flows,
                                                   stages=train.pp)
        else:  # across hosts of a region each stream takes its GPU's share of the cards; a WAN link is its own limit
            lan = not self.links.one_nvlink_domain(hosts) and not self.links.spans_regions(hosts)
            cards = max(self.host_gpus[h] for h in hosts) if lan else 1
            seconds = self.cost_model.weight_sync_time(model, link, receivers=gen.dp, dtype=precision,
                                                       shards=shards, flows=cards)
        if self.graph.kind_of(edge.dst) == TaskKind.GENERATION:  # the engine then takes them in (its slowest kind)
            seconds += max(self.cost_model.engine_reload_time(self.backend, self.devices[d].type, precision,
                                                              model.weight_bytes(precision))
                           for d in gen.devices())
        return seconds
