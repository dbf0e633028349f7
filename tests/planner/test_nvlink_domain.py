"""An NVLink domain across hosts (GB200 NVL72): its collectives priced over NVLink, by hand, and TP across trays."""

from __future__ import annotations

import pytest

from hetprof.costmodels import get_cost_model
from hetprof.planner.links import LinkTable
from hetprof.planner.search import layouts
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.specs.catalog import builtin

MB = 1 << 20


def _racks(racks: int = 1, per_host: int = 4, domain: bool = True) -> ClusterSpec:
    hosts = [{"name": f"r{k}", "count": 72 // per_host, "gpus": {"type": "GB200", "count": per_host}, "region": "dc",
              **({"nvlink_domain": f"rack{k}"} if domain else {})} for k in range(racks)]
    return ClusterSpec.from_dict({"name": "nvl72", "hosts": hosts,
                                  "network": {"intra_region": {"latency": "5us", "bandwidth": "1600Gbps"}}})


def _nvlink() -> tuple[float, float]:
    """GB200's NVLink as planned, from the catalog by hand: 5 µs, 1800/2 GB/s one-way × the collective
    curve's bus-bandwidth fraction."""
    gpu = builtin().lookup("GB200")
    return 5e-6, 1800e9 / 2 * gpu.efficiency.collective.best


def test_tp8_all_reduce_across_two_trays_is_nvlink_priced_by_hand():
    links = LinkTable(_racks())
    link = links.slowest({"r0-0", "r0-1"})  # a TP8 group over two trays of 4
    alpha, beta = _nvlink()
    assert link.alpha_s == pytest.approx(alpha) and link.beta_Bps == pytest.approx(beta)
    assert link == links.between("r0-0", "r0-0")  # exactly the in-tray link
    cm = get_cost_model("analytical")
    size = 64 * MB
    # ring all-reduce over 8: 2·7 steps of α, 2·7/8 of the message over β
    assert cm.collective_time("all_reduce", size, 8, link) == pytest.approx(14 * alpha + 14 / 8 * size / beta)
    # and the network between trays (1600 Gb/s × the inter-host goodput) is about 3× slower
    off = LinkTable(_racks(domain=False)).slowest({"r0-0", "r0-1"})
    assert off.beta_Bps == pytest.approx(200e9 * builtin().inter_host(200e9))
    assert cm.collective_time("all_reduce", size, 8, off) == pytest.approx(14 * alpha + 14 / 8 * size / off.beta_Bps)
    assert cm.collective_time("all_reduce", size, 8, off) > 2.5 * cm.collective_time("all_reduce", size, 8, link)


def test_all_gather_over_the_whole_rack_is_nvlink_priced_by_hand():
    links = LinkTable(_racks())
    link = links.slowest({f"r0-{i}" for i in range(18)})
    alpha, beta = _nvlink()
    size = 256 * MB  # the gathered output
    cm = get_cost_model("analytical")
    assert cm.collective_time("all_gather", size, 72, link) == pytest.approx(71 * alpha + 71 / 72 * size / beta)
    assert links.one_nvlink_domain({f"r0-{i}" for i in range(18)})


def test_across_two_racks_the_slowest_link_is_the_network():
    links = LinkTable(_racks(racks=2))
    assert links.nvlink_domain("r1-3") == "rack1" and not links.one_nvlink_domain({"r0-0", "r1-0"})
    net = links.between("r0-0", "r1-0")
    assert net.alpha_s == pytest.approx(5e-6) and net.beta_Bps == pytest.approx(200e9 * builtin().inter_host(200e9))
    assert links.slowest({"r0-0", "r0-1", "r1-0"}) == net


@pytest.fixture(scope="module")
def sims():
    workload = WorkloadSpec.from_dict({
        "name": "w", "algorithm": "grpo", "models": {"actor": "qwen3-8b"}, "prompts_per_step": 16,
        "responses_per_prompt": 4, "prompt_len": {"mean": 256}, "response_len": {"mean": 512}})
    cm = get_cost_model("analytical")
    return {name: Simulator(cluster, workload, cm) for name, cluster in
            (("domain", _racks()), ("trays", _racks(domain=False)), ("hgx", _racks(per_host=8)))}


def test_the_search_may_cut_a_tp_group_across_trays_only_inside_a_domain(sims):
    trays = [f"r0-{i}:{j}" for i in range(2) for j in range(4)]
    inside = layouts.feasible_shapes(sims["domain"].planning, "actor_train", trays)
    outside = layouts.feasible_shapes(sims["trays"].planning, "actor_train", trays)
    assert max(s.tp for s in inside) == 8 and max(s.tp for s in outside) == 4
    groups = layouts.tp_groups(sims["domain"].planning, trays, 8)
    assert groups == [tuple(trays)]
    assert layouts.tp_groups(sims["trays"].planning, trays, 8) == []


def test_a_tp8_replica_over_two_trays_costs_what_it_costs_on_one_8_gpu_host(sims):
    two_trays = [f"r0-{i}:{j}" for i in range(2) for j in range(4)]
    one_host = [f"r0-0:{j}" for j in range(8)]
    for task in ("actor_train", "actor_gen"):
        split = sims["domain"].costs.replica(task, two_trays, 8, 1, 64)
        whole = sims["hgx"].costs.replica(task, one_host, 8, 1, 64)
        assert split.seconds == pytest.approx(whole.seconds, rel=1e-9)
        apart = sims["trays"].costs.replica(task, two_trays, 8, 1, 64)
        assert apart.seconds > split.seconds  # the same group over the network is slower


def test_a_weight_sync_between_trays_of_a_domain_costs_what_it_costs_inside_one_host(sims):
    """Inside a domain each GPU has its own NVLink: no host's network cards are shared by its streams."""
    def seconds(name: str, train_devs: list[str], gen_devs: list[str]) -> float:
        sim = sims[name]
        ctx = sim.planning
        train = layouts.build_layout(ctx, "actor_train", train_devs, 4, 1)
        gen = layouts.build_layout(ctx, "actor_gen", gen_devs, 4, 1)
        edge = next(e for e in sim.graph.edges if e.backward and e.dst == "actor_gen")
        return sim.transfers.weight_sync_seconds(edge, train, gen)

    tray0, tray1 = [f"r0-0:{j}" for j in range(4)], [f"r0-1:{j}" for j in range(4)]
    host = [f"r0-0:{j}" for j in range(8)]
    inside = seconds("domain", tray0, tray1)
    assert inside == pytest.approx(seconds("hgx", host[:4], host[4:]), rel=1e-9)
    assert seconds("trays", tray0, tray1) > inside


def test_the_ilp_may_cut_a_tp_group_across_trays_only_inside_a_domain(sims):
    from hetprof.planner.search.restricted import RestrictedSpace

    grouping = ((tuple(sims["domain"].graph.tasks)),)
    inside = RestrictedSpace(sims["domain"].planning, grouping)
    outside = RestrictedSpace(sims["trays"].planning, grouping)
    (t_in,), (t_out,) = inside.types, outside.types
    assert inside.host_size(t_in) == outside.host_size(t_out) == 4
    assert inside.tp_span(t_in) == 72 and outside.tp_span(t_out) == 4
    # 16 GPUs of four trays: two TP8 groups inside the rack's NVLink, none over the trays' network
    assert inside.tp_groups(t_in, 16, 8) == 2 and outside.tp_groups(t_out, 16, 8) == 0
    assert inside.tp_groups(t_in, 16, 4) == outside.tp_groups(t_out, 16, 4) == 4
