"""Device orders that differ only by interchangeable hosts, and layouts carried between them.

A balanced layout depends on its devices only through their GPU types, their hosts' links and
which devices share a host: the spec prices a link by the two hosts' regions (and a host's own
link by its GPU type), so hosts of one region with the same GPUs and price, named by no link
override and measured by no profile, are interchangeable. Two orders whose positions hold the
same kind of host, with the same pattern of which positions share a host, therefore balance to
the same layout up to renaming devices. A search meets such orders all the time (swapping two
A100s of one region between groups changes the ids, not the structure), so the assembler
balances one order per structure and renames the result for the others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hetprof.planner.candidate import TaskLayout
    from hetprof.planner.simulator import Simulator

Signature = tuple[tuple[int, int], ...]


class HostClasses:
    """Each host's class of interchangeable hosts, and orders reduced to their structure."""

    def __init__(self, sim: Simulator) -> None:
        cluster = sim.cluster
        named = {name for link in cluster.network.links for name in link.between}
        measured = {host for pair in sim.links.measured_pairs for host in pair}
        kinds: dict[tuple, int] = {}
        self._class: dict[str, int] = {}
        for host in cluster.expanded_hosts():
            unique = host.name in named or host.name in measured
            kind = ("host", host.name) if unique else (host.region, repr(host.gpus), host.price_per_hour)
            self._class[host.name] = kinds.setdefault(kind, len(kinds))
        self._host = {d: dev.host for d, dev in sim.devices.items()}

    def signature(self, order: Sequence[str]) -> Signature:
        """Per position, (host class, rank of its host by first appearance): equal signatures mean
        one order maps onto the other by a class-preserving renaming of hosts."""
        rank: dict[str, int] = {}
        out = []
        for d in order:
            host = self._host[d]
            out.append((self._class[host], rank.setdefault(host, len(rank))))
        return tuple(out)


@dataclasses.dataclass(frozen=True)
class PositionalLayout:
    """A layout with its devices replaced by their positions in the order it was built from."""

    layout: TaskLayout
    positions: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, layout: TaskLayout, order: Sequence[str]) -> PositionalLayout:
        where = {d: p for p, d in enumerate(order)}
        return cls(layout, tuple(tuple(where[d] for d in r) for r in layout.replicas))

    def on(self, order: Sequence[str]) -> TaskLayout:
        """The same layout on another order of the same signature."""
        replicas = tuple(tuple(order[p] for p in r) for r in self.positions)
        if replicas == self.layout.replicas:
            return self.layout
        return dataclasses.replace(self.layout, replicas=replicas)
