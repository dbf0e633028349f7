"""Every host pair's α–β link, measured where the profile database has it, the spec otherwise.

Two hosts of one NVLink domain (a GB200 NVL72's trays: `nvlink_domain:` in the cluster spec) are
joined by their GPUs' NVLink, priced exactly as within one host (ClusterSpec.link_between says so, and
`_SpecLinks` keys such a pair as a local one): every collective, TP group, expert all-to-all or weight
sync priced through `LinkTable.between` / `slowest` / `slowest_between` sees NVLink inside a domain and
the network across domains, with nothing else to ask. `LinkTable.nvlink_domain(host)` and
`LinkTable.one_nvlink_domain(hosts)` say where a domain ends, for placement rules.

Built once per simulator: a search asks for the slowest link among a set of hosts many thousand
times, so pairs are resolved up front and set queries are memoised. A pair of hosts with no link
at all (two regions the spec does not join) makes the cluster unplannable, which is reported here
with the hosts and regions named, before any search starts.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

import numpy as np

from hetprof.costmodels import LinkSpec
from hetprof.errors import InfeasibleError
from hetprof.planner.memo import memoised
from hetprof.specs import ClusterSpec

LINK_MEMO = 100_000   # host sets whose slowest link is kept


def measured_device_link(cost_model) -> Callable[[str], LinkSpec | None]:
    """The cost model's link between devices of one type where profile rows give it (measured, else
    reference collectives), else None: within a host that beats the spec's datasheet link, and weight
    sync between colocated devices is priced with what this host's collectives really take."""

    def local(gpu_type: str) -> LinkSpec | None:
        link, source = cost_model.device_link(gpu_type)
        return link if source in ("measured", "reference") else None

    return local


def measured_links(db) -> dict[frozenset[str], LinkSpec]:
    """The newest measured link per unordered host pair; where both directions were measured, the slower."""
    if db is None:
        return {}
    frame = db.links()
    if frame is None or len(frame) == 0:
        return {}
    newest: dict[tuple[str, str], LinkSpec] = {}
    for row in frame.sort_values("created").itertuples(index=False):
        newest[(row.src_host, row.dst_host)] = LinkSpec(float(row.alpha_s), float(row.beta_Bps))
    out: dict[frozenset[str], LinkSpec] = {}
    for (a, b), link in newest.items():
        key = frozenset((a, b))
        out[key] = slower(out[key], link) if key in out else link
    return out


def slower(a: LinkSpec, b: LinkSpec) -> LinkSpec:
    """A link no better than either: the larger latency and the smaller bandwidth."""
    return LinkSpec(max(a.alpha_s, b.alpha_s), min(a.beta_Bps, b.beta_Bps))


class LinkTable:
    """Links between hosts of one cluster (measured > spec), with memoised set queries."""

    def __init__(self, cluster: ClusterSpec, db=None,
                 local_link: Callable[[str], LinkSpec | None] | None = None) -> None:
        """`local_link(gpu_type)` gives a measured link between devices of one host (the profiled
        collectives), or None; a same-host pair falls back to the spec's datasheet link without it."""
        hosts = cluster.expanded_hosts()
        self.region = {h.name: h.region for h in hosts}
        self.domain = {h.name: h.nvlink_domain or h.name for h in hosts}
        measured = measured_links(db)
        self.measured_pairs: set[frozenset[str]] = set()
        self._pair: dict[tuple[str, str], LinkSpec] = {}
        missing: list[tuple[str, str]] = []
        names = [h.name for h in hosts]
        spec = _SpecLinks(cluster, hosts, local_link)
        for a, b in itertools.combinations_with_replacement(names, 2):
            key = frozenset((a, b))
            if key in measured:
                link = measured[key]
                self.measured_pairs.add(key)
            else:
                link = spec.between(a, b)
                if link is None:
                    missing.append((a, b))
                    continue
            self._pair[(a, b)] = self._pair[(b, a)] = link
        if missing:
            raise InfeasibleError(self._missing_message(missing))
        # Dense views for transfers between many hosts at once (seconds per byte, latency).
        self.hosts = names
        self.index = {h: i for i, h in enumerate(names)}
        self.seconds_per_byte = np.array([[1.0 / self._pair[(a, b)].beta_Bps for b in names] for a in names])
        self.latency = np.array([[self._pair[(a, b)].alpha_s for b in names] for a in names])

    def _missing_message(self, missing: list[tuple[str, str]]) -> str:
        regions = sorted({tuple(sorted((self.region[a], self.region[b]))) for a, b in missing})
        a, b = missing[0]
        pairs = ", ".join(f"{x} <-> {y}" for x, y in regions)
        return (f"no network link between regions {pairs} (e.g. host {a} in {self.region[a]} and host {b} "
                f"in {self.region[b]}, {len(missing)} host pair(s) in all): set network.inter_region or add a "
                f"network.links entry between those regions in the cluster spec")

    def between(self, host_a: str, host_b: str) -> LinkSpec:
        try:
            return self._pair[(host_a, host_b)]
        except KeyError:
            unknown = host_a if host_a not in self.region else host_b
            raise InfeasibleError(f"host {unknown!r} is not part of this cluster") from None

    def slowest(self, hosts: Iterable[str]) -> LinkSpec | None:
        """The slowest link joining any two of `hosts` (None for a single host)."""
        return self._slowest(frozenset(hosts))

    @memoised(LINK_MEMO)
    def _slowest(self, key: frozenset[str]) -> LinkSpec | None:
        links = [self.between(a, b) for a, b in itertools.combinations(sorted(key), 2)]
        return _worst(links) if links else None

    def slowest_between(self, hosts_a: Iterable[str], hosts_b: Iterable[str]) -> LinkSpec:
        """The slowest link from any host of one set to any of the other (same host: its local link)."""
        return self._slowest_between(frozenset(hosts_a), frozenset(hosts_b))

    @memoised(LINK_MEMO)
    def _slowest_between(self, hosts_a: frozenset[str], hosts_b: frozenset[str]) -> LinkSpec:
        return _worst([self.between(a, b) for a in hosts_a for b in hosts_b])

    def transfer_profile(self, src: np.ndarray, dst: np.ndarray) -> tuple[float, float]:
        """(latency, seconds per byte of payload) of data spread over hosts by `src` going to `dst`.

        Host pair (a, b) moves payload × src[a] × dst[b] under the α–β model; every host's network
        interface carries its flows one after another, so the busiest sender or receiver decides.
        """
        busy = np.outer(src, dst) * self.seconds_per_byte
        used = np.outer(src > 0, dst > 0)
        latency = float(self.latency[used].max()) if used.any() else 0.0
        return latency, float(max(busy.sum(axis=1).max(), busy.sum(axis=0).max()))

    def spans_regions(self, hosts: Iterable[str]) -> bool:
        return len({self.region[h] for h in hosts}) > 1

    def nvlink_domain(self, host: str) -> str:
        """The NVLink fabric of a host's GPUs: its spec domain, else the host itself."""
        return self.domain[host]

    def one_nvlink_domain(self, hosts: Iterable[str]) -> bool:
        """Whether every GPU of `hosts` reaches every other over NVLink (one host, or one domain)."""
        return len({self.domain[h] for h in hosts}) <= 1


class _SpecLinks:
    """The spec's links, asked once per class of equivalent pairs rather than once per host pair.

    A spec link depends only on the two hosts' regions, on overrides that name either host, and
    (within a host) on its GPU type, so hosts no override names are interchangeable within a region.
    Asking per pair costs O(hosts) each and made 256-host clusters take a minute to load.
    """

    def __init__(self, cluster: ClusterSpec, hosts, local_link: Callable[[str], LinkSpec | None] | None = None
                 ) -> None:
        self.cluster = cluster
        self.local_link = local_link
        self.region = {h.name: h.region for h in hosts}
        self.gpu = {h.name: h.gpus.type for h in hosts}
        self.domain = {h.name: h.nvlink_domain or h.name for h in hosts}
        self.named = {name for link in cluster.network.links for name in link.between}
        self._memo: dict[tuple, LinkSpec | None] = {}
        self.goodput = cluster.catalog.inter_host

    def _priced(self, params, host: str | None) -> LinkSpec:
        """A spec link as planned: its nominal rate × the catalog's efficiency — within `host`, its GPU
        type's collective bus bandwidth at large messages; between hosts, the inter-host goodput."""
        if host is not None:
            beta = params.beta_Bps * self.cluster.catalog.lookup(self.gpu[host]).efficiency.collective.best
        else:
            beta = params.beta_Bps * self.goodput(params.beta_Bps)
        return LinkSpec(params.alpha_s, beta)

    def between(self, a: str, b: str) -> LinkSpec | None:
        # one host or one NVLink domain: the GPU type's NVLink, whichever hosts (a domain has one type)
        local = self.domain[a] == self.domain[b]
        if local:
            key: tuple = ("host", self.gpu[a])
        elif a in self.named or b in self.named:
            key = ("pair", a, b)
        else:
            key = ("regions", *sorted((self.region[a], self.region[b])))
        if key not in self._memo and local and self.local_link is not None:
            measured = self.local_link(self.gpu[a])
            if measured is not None:
                self._memo[key] = measured
        if key not in self._memo:
            params = self.cluster.link_between(a, b)
            self._memo[key] = None if params is None else self._priced(params, a if local else None)
        return self._memo[key]


def _worst(links: list[LinkSpec]) -> LinkSpec:
    return LinkSpec(max(x.alpha_s for x in links), min(x.beta_Bps for x in links))
