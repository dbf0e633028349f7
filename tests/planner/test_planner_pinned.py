"""Pinned layouts (hetprof.planner.pinned): a layout given by hand becomes the candidate it names."""

from __future__ import annotations

import pytest

from hetprof.costmodels import get_cost_model
from hetprof.errors import SpecError
from hetprof.planner.pinned import PinnedLayout, pinned_candidate
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec

CLUSTER = {"name": "two", "hosts": [{"name": "n", "gpus": {"type": "H100-SXM", "count": 8}, "count": 2}],
           "network": {"intra_region": {"latency": "0.005ms", "bandwidth": "400Gbps"}}}
WORKLOAD = {"algorithm": "ppo", "models": {"actor": "qwen3-1.7b", "critic": "qwen3-1.7b"}, "prompts_per_step": 16,
            "responses_per_prompt": 4, "prompt_len": {"mean": 64}, "response_len": {"mean": 64},
            "training": {"kl_coef": 0.01}}


def sim() -> Simulator:
    return Simulator(ClusterSpec.from_dict(CLUSTER), WorkloadSpec.from_dict(WORKLOAD), get_cost_model("analytical"),
                     streaming=False)


def layout(tasks: dict, groups: dict | None = None) -> PinnedLayout:
    return PinnedLayout.from_dict({"groups": groups or {"rollout": 8, "train": 8}, "tasks": tasks})


def test_kinds_place_every_task_and_names_override_them():
    s = sim()
    cand = pinned_candidate(s, layout({"generation": {"group": "rollout", "tp": 2},
                                       "inference": {"group": "train"},
                                       "training": {"group": "train", "pp": 2, "sharding": "zero1"},
                                       "critic_train": {"group": "train", "tp": 2}}))
    assert set(cand.tasks()) == set(s.tasks)
    gen = cand.layout("actor_gen")
    assert (gen.tp, gen.pp, gen.dp) == (2, 1, 4) and set(gen.devices()) == set(list(s.devices)[:8])
    train = cand.layout("actor_train")
    assert (train.tp, train.pp, train.dp, train.sharding) == (1, 2, 4, "zero1")
    assert cand.layout("critic_train").tp == 2 and cand.layout("critic_train").sharding == "none"
    assert set(train.devices()) == set(list(s.devices)[8:])
    assert s.evaluate(cand).feasible


def test_tasks_of_one_group_time_share_it():
    cand = pinned_candidate(sim(), layout({"generation": {"group": "all"}, "inference": {"group": "all"},
                                           "training": {"group": "all"}}, groups={"all": 16}))
    assert len(cand.groups) == 1 and len(cand.group_devices[0]) == 16


def test_a_task_without_placement_is_named():
    with pytest.raises(SpecError, match=r"layout\.tasks\.training"):
        pinned_candidate(sim(), layout({"generation": {"group": "rollout"}, "inference": {"group": "train"}}))


def test_sharding_is_for_training_only():
    with pytest.raises(SpecError, match=r"layout\.tasks\.inference\.sharding"):
        pinned_candidate(sim(), layout({"generation": {"group": "rollout"},
                                        "inference": {"group": "train", "sharding": "fsdp"},
                                        "training": {"group": "train"}}))


@pytest.mark.parametrize("bad, where", [
    ({"groups": {"a": 0}, "tasks": {}}, "groups.a"),
    ({"groups": {"a": 8}, "tasks": {"generation": {"group": "b"}}}, "tasks.generation.group"),
    ({"groups": {"a": 8}, "tasks": {"training": {"group": "a", "sharding": "zero9"}}}, "tasks.training.sharding"),
])
def test_a_malformed_layout_names_the_field(bad, where):
    with pytest.raises(SpecError, match=where.replace(".", r"\.")):
        PinnedLayout.from_dict(bad, file="case.yaml")


def test_groups_beyond_the_cluster_or_indivisible_are_refused():
    with pytest.raises(SpecError, match=r"layout\.groups"):
        pinned_candidate(sim(), layout({"generation": {"group": "rollout"}}, groups={"rollout": 32}))
    with pytest.raises(SpecError, match=r"TP × PP"):
        pinned_candidate(sim(), layout({"generation": {"group": "rollout", "tp": 3}, "inference": {"group": "train"},
                                        "training": {"group": "train"}}))


def test_an_offload_group_swaps_every_task_state_over_the_host_link_even_when_it_fits():
    from hetprof.costmodels import comm

    s = sim()
    pins = {"generation": {"group": "all"}, "inference": {"group": "all"}, "training": {"group": "all"}}
    resident = s.evaluate(pinned_candidate(s, layout(pins, {"all": 8})))
    assert resident.feasible and not resident.offload_s  # a 1.7B model's states all fit side by side
    hybrid = pinned_candidate(s, PinnedLayout.from_dict({"groups": {"all": 8}, "tasks": pins, "offload": ["all"]}))
    assert hybrid.offload == frozenset({0})
    scored = s.evaluate(hybrid)
    h100 = s.catalog.lookup("H100-SXM")
    for task in ("actor_gen", "actor_train", "critic_train"):
        lay = hybrid.layout(task)
        state = next(iter(s.costs.evaluate(lay).memory.values())).offloadable
        host = comm.host_link_Bps(h100, state)  # 64 GB/s PCIe 5.0 x16 at its big-copy efficiency
        assert host == pytest.approx(64e9 * 0.78)
        assert scored.offload_s[task] == pytest.approx(2 * state / host)  # reload before, offload after
    # the log-prob pass reloads only the trainer's weights as the trainer holds them (no optimizer)
    train = next(iter(s.costs.evaluate(hybrid.layout("actor_train")).memory.values()))
    assert scored.offload_s["actor_logprob"] == pytest.approx(2 * train.weights / comm.host_link_Bps(h100, train.weights))
    assert scored.iteration_s > resident.iteration_s


def test_offload_names_a_group():
    with pytest.raises(SpecError, match=r"offload\[0\]"):
        PinnedLayout.from_dict({"groups": {"all": 8}, "tasks": {}, "offload": ["nope"]})


def test_the_offload_policy_travels_in_the_plan_file_and_search_traces(tmp_path):
    from hetprof.planner.candidate import Candidate
    from hetprof.planner.search.space import decode_candidate, encode_candidate
    from hetprof.planner.session import build_plan
    from hetprof.specs import Plan

    s = sim()
    pins = {"generation": {"group": "all"}, "inference": {"group": "all"}, "training": {"group": "all"}}
    cand = pinned_candidate(s, PinnedLayout.from_dict({"groups": {"all": 8}, "tasks": pins, "offload": ["all"]}))
    build_plan(s, cand).save(tmp_path / "plan.json")
    loaded = Plan.load(tmp_path / "plan.json")
    assert [g.offload for g in loaded.groups] == [True]
    assert Candidate.of_plan(loaded).offload == frozenset({0})
    assert decode_candidate(encode_candidate(cand)) == cand
