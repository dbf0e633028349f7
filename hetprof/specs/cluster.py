"""Cluster spec: what hardware exists and where (hosts, GPUs, regions, link overrides).

The spec says what exists; the numbers for devices and links come from the profile database
(DESIGN §2). Defaults for links are given per scope (same host, same region, across regions) so a
64-GPU fleet is a dozen lines; explicit `links` override a region pair or a host pair.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hetprof.errors import SpecError
from hetprof.specs import catalog as gpu_catalog
from hetprof.specs.gpus import GpuTypeSpec
from hetprof.specs.loader import field, from_data, to_data
from hetprof.specs.positions import load_spec
from hetprof.specs.units import parse_duration, parse_rate


def _rate(text: str) -> bool:
    try:
        return parse_rate(text) > 0
    except ValueError:
        return False


def _duration(text: str) -> bool:
    try:
        return parse_duration(text) >= 0
    except ValueError:
        return False


MAX_DEVICES = 1 << 16  # devices in one cluster: hosts and devices are expanded one by one
# Devices one `hetprof plan` searches over: its cost grows with them (4,096 hosts × 16 GPUs planned for
# 210 s, 65,536 hosts ran out of memory), so a bigger cluster (or what-if) is refused before the search.
MAX_PLANNED_DEVICES = 4096


@dataclasses.dataclass
class GpuSlot:
    type: str = field(help="GPU type from the catalog (hetprof/data/gpus.yaml, --catalog, or gpu_types:), "
                           "e.g. A100-40GB, L40S, cpu")
    count: int = field(1, help="GPUs of this type on the host", check=lambda x: 0 < x <= MAX_DEVICES,
                       expect=f"a positive integer at most {MAX_DEVICES:,}")


@dataclasses.dataclass
class Host:
    name: str = field(help="host name; with `count` > 1 it is a prefix and hosts are NAME-0, NAME-1, ...")
    gpus: GpuSlot = field(help="the GPUs on this host")
    region: str = field("default", help="region (e.g. us-east); links across regions use inter_region")
    zone: str | None = field(None, help="zone inside the region (informational)")
    count: int = field(1, help="number of identical hosts this entry stands for",
                       check=lambda x: 0 < x <= MAX_DEVICES, expect=f"a positive integer at most {MAX_DEVICES:,}")
    address: str | None = field(None, help="address the executor reaches this host at (multi-host runs)")
    price_per_hour: float | None = field(None, help="$/GPU-hour override of the catalog default",
                                         check=lambda x: x >= 0, expect="a non-negative number")
    nvlink_domain: str | None = field(None, help="an NVLink fabric this host's GPUs share with the other hosts naming "
                                      "it (GB200 NVL72: 18 trays of 4 GPUs on one fabric): any two of its GPUs are "
                                      "NVLink-connected, and a tensor-parallel group may span its hosts",
                                      check=lambda s: bool(s.strip()), expect="a non-empty name")


@dataclasses.dataclass
class LinkParams:
    latency: str = field("0.1ms", help="one-way latency α, e.g. 10ms", check=_duration, expect="a duration like 10ms")
    bandwidth: str = field("100Gbps", help="bandwidth β, e.g. 5Gbps or 25GB/s", check=_rate,
                           expect="a rate like 5Gbps or 25GB/s")

    @property
    def alpha_s(self) -> float:
        return parse_duration(self.latency)

    @property
    def beta_Bps(self) -> float:
        return parse_rate(self.bandwidth)


@dataclasses.dataclass
class LinkOverride:
    between: list[str] = field(help="two region names or two host names",
                               check=lambda x: len(x) == 2, expect="exactly two names")
    latency: str = field(help="one-way latency α", check=_duration, expect="a duration like 10ms")
    bandwidth: str = field(help="bandwidth β", check=_rate, expect="a rate like 5Gbps")

    @property
    def params(self) -> LinkParams:
        return LinkParams(self.latency, self.bandwidth)


@dataclasses.dataclass
class NetworkSpec:
    intra_region: LinkParams = field(default_factory=lambda: LinkParams("0.1ms", "100Gbps"),
                                     help="default link between two hosts of one region")
    inter_region: LinkParams | None = field(None, help="default link between regions; none = only explicit links")
    links: list[LinkOverride] = field(default_factory=list, help="links overriding the defaults")


@dataclasses.dataclass(frozen=True)
class Device:
    """One concrete accelerator (or CPU slot) of the expanded cluster."""

    host: str
    index: int
    type: str
    region: str
    domain: str | None = None  # the NVLink domain the spec joined its host into (None: the host alone)

    @property
    def id(self) -> str:
        return f"{self.host}:{self.index}"

    @property
    def nvlink_domain(self) -> str:
        """The NVLink fabric this device is on: its spec domain, else its own host (NVLink ends there)."""
        return self.domain or self.host


@dataclasses.dataclass
class ClusterSpec:
    hosts: list[Host] = field(help="the hosts and their GPUs")
    name: str = field("cluster", help="a name for reports")
    network: NetworkSpec = field(default_factory=NetworkSpec, help="link defaults and overrides")
    gpu_types: dict[str, GpuTypeSpec] = field(
        default_factory=dict, help="GPU types this cluster adds to the catalog or overrides (same format as "
                                   "the catalog's `gpus:`)")

    def __post_init__(self) -> None:
        self._base: gpu_catalog.Catalog | None = None
        self._catalog: gpu_catalog.Catalog | None = None

    def using(self, base: gpu_catalog.Catalog | None) -> ClusterSpec:
        """This spec priced over `base` (a --catalog file's catalog) instead of the built-in one."""
        self._base, self._catalog = base, None
        return self

    @property
    def base_catalog(self) -> gpu_catalog.Catalog | None:
        return self._base

    @property
    def catalog(self) -> gpu_catalog.Catalog:
        """The base catalog (built-in unless `using` one) extended by `gpu_types`: what the devices are priced with."""
        if self._catalog is None:
            base = self._base or gpu_catalog.builtin()
            self._catalog = base.extended(gpu_catalog.CatalogSpec(gpus=self.gpu_types), where="gpu_types")
        return self._catalog

    def validate(self) -> None:
        devices = sum(h.count * h.gpus.count for h in self.hosts)
        if devices > MAX_DEVICES:  # before anything is expanded per host or per device
            raise SpecError(None, "hosts", f"at most {MAX_DEVICES:,} devices in all (count × gpus.count)", devices)
        try:
            known = self.catalog
        except SpecError as exc:  # a gpu_types entry the catalog refuses: its path is relative here
            raise SpecError(None, exc.field, exc.expected, exc.got) from None
        for i, entry in enumerate(self.hosts):
            if known.canonical_name(entry.gpus.type) is None:
                raise SpecError(None, f"hosts[{i}].gpus.type",
                                "a known GPU type (" + ", ".join(known.known_types()) + ") or one in gpu_types",
                                entry.gpus.type)
        seen: set[str] = set()
        for i, entry in enumerate(self.hosts):
            expanded = [entry.name] if entry.count == 1 else [f"{entry.name}-{k}" for k in range(entry.count)]
            for name in expanded:
                if name in seen:
                    raise SpecError(None, f"hosts[{i}].name", "unique host names", name)
                seen.add(name)
        names = sorted(seen)
        known = set(names) | {h.region for h in self.hosts}
        for i, link in enumerate(self.network.links):
            for name in link.between:
                if name not in known:
                    raise SpecError(None, f"network.links[{i}].between", "host or region names of this cluster", name)
        self._check_nvlink_domains()

    def _check_nvlink_domains(self) -> None:
        """A domain joins hosts of one GPU type whose catalog entry says how many GPUs its fabric joins
        (nvlink_domain_gpus), at most that many: an NVLink domain is hardware, not a wish."""
        first: dict[str, int] = {}
        gpus: dict[str, int] = {}
        for i, entry in enumerate(self.hosts):
            name = entry.nvlink_domain
            if name is None:
                continue
            where = f"hosts[{i}].nvlink_domain"
            gpu = self.catalog.lookup(entry.gpus.type)
            j = first.setdefault(name, i)
            if self.catalog.lookup(self.hosts[j].gpus.type).name != gpu.name:
                raise SpecError(None, where, f"hosts of one GPU type in domain {name!r} (hosts[{j}] has "
                                f"{self.hosts[j].gpus.type})", entry.gpus.type)
            if gpu.nvlink_domain_gpus is None:
                raise SpecError(None, where, f"no NVLink domain across hosts for {gpu.name}: its catalog entry "
                                f"gives no gpus.{gpu.name}.nvlink_domain_gpus (its NVLink ends at the host)", name)
            gpus[name] = gpus.get(name, 0) + entry.count * entry.gpus.count
            if gpus[name] > gpu.nvlink_domain_gpus:
                raise SpecError(None, where, f"at most {gpu.nvlink_domain_gpus} GPUs in one {gpu.name} NVLink domain "
                                f"(gpus.{gpu.name}.nvlink_domain_gpus)", f"{gpus[name]} in {name!r}")

    # ---- expansion --------------------------------------------------------------------------
    def expanded_hosts(self) -> list[Host]:
        """Hosts with `count` > 1 expanded to NAME-0..NAME-(count-1), each with count 1."""
        out = []
        for h in self.hosts:
            if h.count == 1:
                out.append(h)
            else:
                out.extend(dataclasses.replace(h, name=f"{h.name}-{i}", count=1) for i in range(h.count))
        return out

    def host_names(self) -> list[str]:
        return [h.name for h in self.expanded_hosts()]

    def host(self, name: str) -> Host:
        for h in self.expanded_hosts():
            if h.name == name:
                return h
        raise KeyError(name)

    def devices(self) -> list[Device]:
        return [Device(h.name, i, self.catalog.lookup(h.gpus.type).name, h.region, h.nvlink_domain)
                for h in self.expanded_hosts() for i in range(h.gpus.count)]

    def gpu_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for d in self.devices():
            counts[d.type] = counts.get(d.type, 0) + 1
        return counts

    def regions(self) -> list[str]:
        return sorted({h.region for h in self.hosts})

    def price_per_hour(self, host: str) -> float:
        h = self.host(host)
        return h.price_per_hour if h.price_per_hour is not None else self.catalog.lookup(h.gpus.type).price_per_hour

    # ---- links ------------------------------------------------------------------------------
    def nvlink_domain(self, host: str) -> str:
        """The NVLink fabric a host's GPUs are on: the domain the spec names, else the host itself."""
        return self.host(host).nvlink_domain or host

    def same_nvlink_domain(self, host_a: str, host_b: str) -> bool:
        """Whether two hosts' GPUs reach each other over NVLink (one host, or one spec domain)."""
        return host_a == host_b or self.nvlink_domain(host_a) == self.nvlink_domain(host_b)

    def link_between(self, host_a: str, host_b: str) -> LinkParams | None:
        """The spec's link between two hosts (host pair > region pair > defaults), None if none.

        Same-host links, and links between hosts of one NVLink domain, are the GPU's NVLink from the
        catalog: the domain's switches give every GPU pair the GPU's full NVLink rate.
        """
        a, b = self.host(host_a), self.host(host_b)
        if self.same_nvlink_domain(host_a, host_b):
            gpu = self.catalog.lookup(a.gpus.type)
            return LinkParams("5us", f"{gpu.intra_node_GBps / 2}GB/s")
        pair = {host_a, host_b}
        for link in self.network.links:
            if set(link.between) == pair:
                return link.params
        regions = {a.region, b.region}
        for link in self.network.links:
            if set(link.between) == regions and len(regions) == len(set(link.between)):
                return link.params
        if a.region == b.region:
            return self.network.intra_region
        return self.network.inter_region

    # ---- files ------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path, catalog: gpu_catalog.Catalog | None = None) -> ClusterSpec:
        """Read a cluster spec; with `catalog` (from --catalog), the types it defines that the spec uses
        are copied into the spec's gpu_types, so the spec and plans made from it stand alone."""
        def with_types(data: Any) -> Any:
            return with_catalog_types(data, catalog) if catalog is not None and isinstance(data, dict) else data

        return load_spec(cls, path, with_types).using(catalog)

    @classmethod
    def from_dict(cls, data: dict, file: str | None = None) -> ClusterSpec:
        return from_data(cls, data, file=file)

    def to_dict(self) -> dict:
        return to_data(self)


def with_catalog_types(data: dict, catalog: gpu_catalog.Catalog) -> dict:
    """Cluster data with the `catalog` entries of the GPU types its hosts name added to `gpu_types`
    (entries the spec writes itself win). Types the built-in catalog has unchanged are not copied."""
    hosts = data.get("hosts")
    if not isinstance(hosts, list):
        return data
    own = data.get("gpu_types") or {}
    if not isinstance(own, dict):
        return data  # the typed loader reports it with its path
    own = dict(own)
    builtin = gpu_catalog.builtin()
    for h in hosts:
        name = h.get("gpus", {}).get("type") if isinstance(h, dict) and isinstance(h.get("gpus"), dict) else None
        canon = catalog.canonical_name(name) if isinstance(name, str) else None
        if canon is None or canon in own or _same(builtin.types.get(canon), catalog.types[canon]):
            continue
        own[canon] = catalog.entry_data(canon)
    return {**data, "gpu_types": own} if own else data


def _same(a: gpu_catalog.GpuType | None, b: gpu_catalog.GpuType) -> bool:
    return a is not None and a == b and a.efficiency == b.efficiency


def check_plannable(cluster: ClusterSpec, where: str) -> None:
    """Refuse a cluster (or a what-if's) with more devices than the planner searches over."""
    devices = sum(h.count * h.gpus.count for h in cluster.hosts)
    if devices > MAX_PLANNED_DEVICES:
        raise SpecError(where, "hosts", f"at most {MAX_PLANNED_DEVICES:,} devices for `hetprof plan` "
                        "(count × gpus.count over hosts)", devices)
