"""Expert parallelism in the planner: the degrees a layout is tried with, the link its all-to-alls
cross, EP chosen where it pays for an MoE model, and dense plans untouched."""

from __future__ import annotations

import dataclasses
import math

import pytest

from hetprof.costmodels import get_cost_model
from hetprof.errors import SpecError
from hetprof.planner.layoutcomms import expert_groups, expert_link
from hetprof.planner.pinned import PinnedLayout, pinned_candidate
from hetprof.planner.planning import PlanningContext
from hetprof.planner.search import layouts
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, TaskLayout, WorkloadSpec
from hetprof.specs.vocabulary import Task

# two 8-GPU H100 hosts in one region joined by 400 Gb/s; one 8-GPU L40S host
LINK = {"latency": "0.01ms", "bandwidth": "400Gbps"}


def _sim(model: str, hosts=(("h0", "H100-SXM"), ("h1", "H100-SXM"), ("l0", "L40S")), **extra) -> Simulator:
    cluster = ClusterSpec.from_dict({
        "name": "moe", "hosts": [{"name": h, "gpus": {"type": t, "count": 8}, "region": "r"} for h, t in hosts],
        "network": {"intra_region": LINK}})
    workload = WorkloadSpec.from_dict({
        "name": "w", "algorithm": "grpo", "mode": "sync", "models": {"actor": model}, "prompts_per_step": 128,
        "responses_per_prompt": 8, "prompt_len": {"mean": 256}, "response_len": {"mean": 512}, **extra})
    return Simulator(cluster, workload, get_cost_model("analytical"))


@pytest.fixture(scope="module")
def moe() -> Simulator:
    return _sim("qwen3-30b-a3b")


def _ctx(sim: Simulator) -> PlanningContext:
    return sim.planning


def test_ep_degrees_divide_replicas_and_experts_and_keep_a_gpu_type_per_group(moe):
    ctx = _ctx(moe)
    h100 = [(f"h0:{i}",) for i in range(8)]
    assert layouts.expert_degrees(ctx, Task.ACTOR_GEN, h100) == (1, 2, 4, 8)
    mixed = [("h0:0",), ("h0:1",), ("l0:0",), ("l0:1",)]   # groups of 4 would mix H100 and L40S
    assert layouts.expert_degrees(ctx, Task.ACTOR_GEN, mixed) == (1, 2)
    dense = _ctx(_sim("qwen3-8b"))
    assert layouts.expert_degrees(dense, Task.ACTOR_GEN, h100) == (1,)


def test_expert_link_is_the_gpu_link_in_a_host_and_a_share_of_the_network_across_hosts(moe):
    ctx = _ctx(moe)
    basis = moe.costs.basis
    one_host = layouts.build_layout(ctx, Task.ACTOR_GEN, [f"h0:{i}" for i in range(8)], 1, 1)
    assert one_host is not None
    within = dataclasses.replace(one_host, ep=8)
    assert expert_link(basis, within) == basis.links.between("h0", "h0")
    assert expert_link(basis, dataclasses.replace(one_host, ep=1)) is None
    across = dataclasses.replace(one_host, replicas=tuple((d,) for d in ("h0:0", "h0:1", "h1:0", "h1:1")),
                                 shares=(0.25,) * 4, layer_splits=((48,),) * 4, ep=4)
    assert expert_groups(across) == [("h0:0", "h0:1", "h1:0", "h1:1")]
    net, nvlink = basis.links.between("h0", "h1"), basis.links.between("h0", "h0")
    # each GPU sends 1 of its 3 peers' shares over NVLink and 2 over the network, whose host link its 2
    # GPUs share as they exchange at once: the slower of the two paces it
    per_byte = max((1 / 3) / nvlink.beta_Bps, (2 / 3) * 2 / net.beta_Bps)
    link = expert_link(basis, across)
    assert link.alpha_s == net.alpha_s and link.beta_Bps == pytest.approx(1 / per_byte)
    assert net.beta_Bps / 2 < link.beta_Bps  # more than every byte over the shared network would give


def test_generation_on_one_host_chooses_expert_parallelism(moe):
    ctx = _ctx(moe)
    lay = layouts.best_layout(ctx, Task.ACTOR_GEN, [f"h0:{i}" for i in range(8)])
    assert lay is not None and lay.ep > 1
    plain = layouts.layout_cost(ctx, dataclasses.replace(lay, ep=1))
    assert layouts.layout_cost(ctx, lay) < plain


def test_hetrl_plans_qwen3_30b_a3b_with_expert_parallelism(moe):
    from hetprof.planner.session import PlanOptions, run_search

    result = run_search(moe, "hetrl", PlanOptions(max_evals=60, executable=False))
    eps = {task: lay.ep for task, lay in result.candidate.layouts}
    assert max(eps.values()) > 1, eps


def test_a_pinned_ep_must_divide_the_replicas_and_the_experts(moe):
    pin = PinnedLayout.from_dict({"groups": {"all": 8}, "tasks": {
        "generation": {"group": "all", "tp": 1, "ep": 8}, "inference": {"group": "all"},
        "training": {"group": "all", "ep": 3}}})
    with pytest.raises(SpecError) as err:
        pinned_candidate(moe, pin, file="case.yaml")
    assert "layout.tasks.training.ep" in str(err.value) and "\n" not in str(err.value)
    ok = PinnedLayout.from_dict({"groups": {"all": 8}, "tasks": {
        "generation": {"group": "all", "ep": 8}, "inference": {"group": "all"}, "training": {"group": "all"}}})
    cand = pinned_candidate(moe, ok)
    assert dict(cand.layouts)[Task.ACTOR_GEN].ep == 8


def test_runnable_plans_take_only_the_degrees_hetprof_run_carries_out():
    """Planning for `hetprof run`: EP for training and the forward passes of whole-model replicas with
    unsharded state; none for generation (vLLM/hf decode each sequence on one replica) or TP replicas."""
    cluster = ClusterSpec.from_dict({"name": "moe", "hosts": [{"name": "h0", "gpus": {"type": "H100-SXM", "count": 8}}]})
    workload = WorkloadSpec.from_dict({
        "name": "w", "algorithm": "grpo", "mode": "sync", "models": {"actor": "qwen3-30b-a3b"},
        "prompts_per_step": 128, "responses_per_prompt": 8, "prompt_len": {"mean": 256}, "response_len": {"mean": 512}})
    ctx = Simulator(cluster, workload, get_cost_model("analytical"), executable=True).planning
    singles = [(f"h0:{i}",) for i in range(8)]
    assert layouts.expert_degrees(ctx, Task.ACTOR_TRAIN, singles) == (1, 2, 4, 8)
    assert layouts.expert_degrees(ctx, Task.REF_INFER, singles) == (1, 2, 4, 8)
    assert layouts.expert_degrees(ctx, Task.ACTOR_GEN, singles) == (1,)
    pairs = [("h0:0", "h0:1"), ("h0:2", "h0:3")]
    assert layouts.expert_degrees(ctx, Task.ACTOR_TRAIN, pairs, tp=2) == (1,)
    lay = layouts.best_layout(ctx, Task.ACTOR_TRAIN, [f"h0:{i}" for i in range(8)])
    assert lay is not None and not (lay.ep > 1 and lay.sharding != "none")


def test_a_workload_that_states_its_expert_imbalance_is_priced_at_it(moe):
    """A router measured (or forced) to balance: the same EP layout costs less than at the cited 1.52."""
    balanced = _sim("qwen3-30b-a3b", expert_imbalance=1.0)
    for sim in (moe, balanced):
        assert sim.costs.basis.work(Task.ACTOR_TRAIN, 8).expert_imbalance == sim.workload.expert_imbalance
    lay = layouts.build_layout(_ctx(moe), Task.ACTOR_TRAIN, [f"h0:{i}" for i in range(8)], 1, 1)
    lay = dataclasses.replace(lay, ep=8)
    assert layouts.layout_cost(_ctx(balanced), lay) < layouts.layout_cost(_ctx(moe), lay)
    with pytest.raises(SpecError, match="expert_imbalance"):
        _sim("qwen3-30b-a3b", expert_imbalance=0.9)


def test_an_expert_group_is_one_pipeline_stage_of_its_replicas(moe):
    """A stage's MoE layers exchange tokens only with the same stage of the other replicas."""
    ctx = _ctx(moe)
    lay = layouts.build_layout(ctx, Task.ACTOR_TRAIN, [f"h{h}:{i}" for h in (0, 1) for i in range(8)], 1, 2)
    assert lay is not None and lay.pp == 2 and lay.dp == 8
    groups = expert_groups(dataclasses.replace(lay, ep=4))
    assert len(groups) == 2 * 2  # two groups of 4 replicas, each per stage
    for g, group in enumerate(groups):
        first, stage = 4 * (g // 2), g % 2
        assert group == tuple(d for r in range(first, first + 4) for d in lay.stage_devices(r, stage))


def test_the_plan_report_says_what_it_assumes_of_the_router_load(moe):
    from rich.console import Console

    from hetprof.planner.report import expert_load_line, print_plan

    pin = PinnedLayout.from_dict({"groups": {"all": 8}, "tasks": {
        "generation": {"group": "all", "tp": 1}, "inference": {"group": "all"},
        "training": {"group": "all", "ep": 8, "sharding": "zero1"}}})
    for sim, said in ((moe, "1.52× the mean (cited for an auxiliary balance loss"),
                      (_sim("qwen3-30b-a3b", expert_imbalance=1.1), "1.10× the mean (the workload's expert_imbalance)")):
        cand = pinned_candidate(sim, pin)
        console = Console(record=True, width=200)
        print_plan(console, sim, cand, sim.evaluate(cand))
        assert said in console.export_text()
    plain = PinnedLayout.from_dict({"groups": {"all": 8}, "tasks": {
        "generation": {"group": "all"}, "inference": {"group": "all"}, "training": {"group": "all"}}})
    layouts_, _ = moe.with_followers(pinned_candidate(moe, plain))
    assert expert_load_line(moe, layouts_) is None  # no expert parallelism: no rank waits for another


def test_whole_experts_fold_over_tp_ranks_as_megatron_recipes_pin_them(moe):
    """ETP1 (verl's and NeMo RL's MoE recipes): a TP2 training layout with whole experts is one EP
    group of each stage's ep × tp GPUs, searched beside sliced experts, pinned by `etp`, written to the
    plan file and named in the layout; a generation task or a dense model refuses it in one line."""
    ctx = _ctx(moe)
    assert layouts.expert_tp_choices(ctx, Task.ACTOR_TRAIN, 2) == (None, 1)
    assert layouts.expert_tp_choices(ctx, Task.ACTOR_TRAIN, 1) == (None,)
    assert layouts.expert_tp_choices(ctx, Task.ACTOR_GEN, 2) == (None,)
    assert layouts.expert_tp_choices(_ctx(_sim("qwen3-8b")), Task.ACTOR_TRAIN, 2) == (None,)
    pin = {"groups": {"all": 8}, "tasks": {"generation": {"group": "all", "tp": 2}, "inference": {"group": "all"},
                                           "training": {"group": "all", "tp": 2, "ep": 4, "etp": 1,
                                                        "sharding": "zero1"}}}
    lay = dict(pinned_candidate(moe, PinnedLayout.from_dict(pin)).layouts)[Task.ACTOR_TRAIN]
    assert lay.folded and lay.describe() == "DP4×TP2×PP1 zero1 EP4 ETP1"
    assert expert_groups(lay) == [tuple(f"h0:{i}" for i in range(8))]
    assert expert_link(moe.costs.basis, dataclasses.replace(lay, ep=1)) is not None  # the fold alone spreads
    entry = lay.to_dict()
    assert entry["layout"]["etp"] == 1 and type(lay).from_dict(Task.ACTOR_TRAIN, entry) == lay
    sliced = dataclasses.replace(lay, etp=None)
    assert math.isfinite(layouts.layout_cost(ctx, lay)) and layouts.layout_cost(ctx, lay) != layouts.layout_cost(ctx, sliced)
    for task, bad in (("generation", {"group": "all", "tp": 2, "etp": 1}),
                      ("training", {"group": "all", "tp": 2, "etp": 3})):
        wrong = {**pin, "tasks": {**pin["tasks"], task: bad}}
        with pytest.raises(SpecError) as err:
            pinned_candidate(moe, PinnedLayout.from_dict(wrong), file="case.yaml")
        assert f"layout.tasks.{task}.etp" in str(err.value) and "\n" not in str(err.value)


def test_expert_groups_on_one_host_share_its_network(moe):
    """Two EP2 groups, each one GPU on h0 and one on h1: both GPUs of a host cross its network at
    once, so each gets half of it (bandwidth is conserved at the host's NICs)."""
    basis = moe.costs.basis
    one_host = layouts.build_layout(_ctx(moe), Task.ACTOR_GEN, [f"h0:{i}" for i in range(8)], 1, 1)
    paired = dataclasses.replace(one_host, replicas=(("h0:0",), ("h1:0",), ("h0:1",), ("h1:1",)),
                                 shares=(0.25,) * 4, layer_splits=((48,),) * 4, ep=2)
    assert expert_groups(paired) == [("h0:0", "h1:0"), ("h0:1", "h1:1")]
    net = basis.links.between("h0", "h1")
    assert expert_link(basis, paired).beta_Bps == pytest.approx(net.beta_Bps / 2)
    alone = dataclasses.replace(paired, replicas=(("h0:0",), ("h1:0",)), shares=(0.5, 0.5),
                                layer_splits=((48,),) * 2)
    assert expert_link(basis, alone).beta_Bps == pytest.approx(net.beta_Bps)  # one GPU a host: the whole NIC


def test_a_pipelined_expert_layout_in_megatrons_rank_order_keeps_its_groups_on_a_host(moe):
    """PP2 EP8 over two 8-GPU hosts: each replica's two stages on neighbouring GPUs put every stage's
    EP8 group on both hosts, whose 400 Gb/s networks all 16 GPUs cross at once; Megatron's order
    (pipeline outermost) puts stage s on host s, so its all-to-alls stay on NVLink. The layout search
    tries both orders for a pipelined MoE layout on one GPU type; pinned, `pipeline_outermost`."""
    from hetprof.planner.candidate import megatron_order

    ctx = _ctx(moe)
    devices = [f"h{h}:{i}" for h in (0, 1) for i in range(8)]
    lay = layouts.build_layout(ctx, Task.ACTOR_TRAIN, devices, 1, 2)
    assert lay is not None and layouts.stage_blocks_alike(ctx, lay)
    ep8 = dataclasses.replace(lay, ep=8, sharding="zero1")
    outer = megatron_order(ep8)
    assert all(len({d.split(":")[0] for d in g}) == 2 for g in expert_groups(ep8))
    assert all(len({d.split(":")[0] for d in g}) == 1 for g in expert_groups(outer))
    assert layouts.layout_cost(ctx, outer) < layouts.layout_cost(ctx, ep8) / 5
    assert sorted(outer.devices()) == sorted(ep8.devices()) and outer.layer_splits == ep8.layer_splits
    pin = PinnedLayout.from_dict({"groups": {"all": 16}, "tasks": {
        "generation": {"group": "all"}, "inference": {"group": "all"},
        "training": {"group": "all", "pp": 2, "ep": 8, "sharding": "zero1", "pipeline_outermost": True}}})
    pinned = dict(pinned_candidate(moe, pin).layouts)[Task.ACTOR_TRAIN]
    assert pinned.replicas[0] == ("h0:0", "h1:0") and expert_groups(pinned)[0] == tuple(f"h0:{i}" for i in range(8))


def test_sliced_experts_exchange_among_the_ranks_holding_one_slice(moe):
    """Megatron's EP over TP2 replicas with sliced experts: each TP rank's all-to-all runs among the
    ep ranks at its own TP position (they hold the same slice); whole experts (etp 1) make the whole
    stage one group. Two replicas on two hosts: every sliced group crosses the network entirely."""
    basis = moe.costs.basis
    sliced = TaskLayout(Task.ACTOR_TRAIN, 2, 1, (("h0:0", "h0:1"), ("h1:0", "h1:1")), (0.5, 0.5), ((48,),) * 2,
                        ep=2)
    assert expert_groups(sliced) == [("h0:0", "h1:0"), ("h0:1", "h1:1")]
    assert expert_groups(dataclasses.replace(sliced, etp=1)) == [("h0:0", "h0:1", "h1:0", "h1:1")]
    net = basis.links.between("h0", "h1")
    # no peer on the host: all bytes over the network, which both TP ranks' groups cross at once
    assert expert_link(basis, sliced).beta_Bps == pytest.approx(net.beta_Bps / 2)
