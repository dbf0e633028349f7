"""The baselines make the choices their papers and careful users make, on small cases."""

from __future__ import annotations

from hetprof.costmodels import get_cost_model
from hetprof.planner.search import SearchContext, get_search
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec


def sim_of(hosts: list[tuple[str, str, int, str]], wan: tuple[str, str], mode: str = "sync",
           model: str = "qwen3-1.7b", prompts: int = 16) -> Simulator:
    cluster = ClusterSpec.from_dict({
        "name": "c", "hosts": [{"name": n, "gpus": {"type": t, "count": k}, "region": r} for n, t, k, r in hosts],
        "network": {"intra_region": {"latency": "0.05ms", "bandwidth": "100Gbps"},
                    "inter_region": {"latency": wan[0], "bandwidth": wan[1]}}})
    work = WorkloadSpec.from_dict({
        "name": "w", "algorithm": "grpo", "mode": mode, "models": {"actor": model}, "prompts_per_step": prompts,
        "responses_per_prompt": 4, "prompt_len": {"mean": 256}, "response_len": {"mean": 256}})
    return Simulator(cluster, work, get_cost_model("analytical"))


def run(sim: Simulator, name: str):
    return get_search(name)(SearchContext(planning=sim.planning, seed=0, max_pp=2)).run()


def regions(sim: Simulator, devices) -> set[str]:
    return {sim.devices[d].region for d in devices}


def types(sim: Simulator, devices) -> set[str]:
    return {sim.devices[d].type for d in devices}


TWO_REGIONS = [("a", "A100-40GB", 2, "us"), ("b", "A100-40GB", 2, "us"), ("c", "A100-40GB", 2, "eu")]


def test_verl_takes_one_region_when_the_wan_is_slow_and_all_gpus_when_it_is_not():
    slow = sim_of(TWO_REGIONS, ("100ms", "100Mbps"))
    res = run(slow, "verl")
    assert len(res.candidate.groups) == 1                    # the hybrid engine: every role colocated
    assert regions(slow, res.candidate.devices()) == {"us"}, res.extra["chosen"]
    assert res.extra["settings_tried"] > 4                   # tuned over pools × rollout TP × engine
    # a step big enough that a third host pays for its share of the all-reduce (a 16-prompt step
    # runs fastest on two hosts whatever the WAN)
    fast = sim_of(TWO_REGIONS, ("0.05ms", "100Gbps"), prompts=64)
    assert len(run(fast, "verl").candidate.devices()) == 6


def test_verl_rollout_tp_is_its_own_and_the_batch_split_is_even():
    sim = sim_of([("a", "A100-40GB", 2, "us"), ("b", "L4", 2, "us")], ("1ms", "10Gbps"), model="qwen3-0.6b")
    res = run(sim, "verl")
    for _task, lay in res.candidate.layouts:
        assert max(lay.shares) - min(lay.shares) < 1e-9        # verl does not know one GPU from another
    assert "rollout TP" in res.extra["chosen"]


def test_streamrl_keeps_each_pool_in_one_region():
    sim = sim_of([("a", "A100-40GB", 2, "us"), ("b", "L40S", 2, "us"), ("c", "L40S", 2, "eu"),
                  ("d", "L4", 2, "eu")], ("20ms", "5Gbps"), mode="async")
    res = run(sim, "streamrl")
    assert res.candidate.groups[0] == ("actor_gen",) and len(res.candidate.groups) == 2
    for devs in res.candidate.group_devices:
        assert len(regions(sim, devs)) == 1, res.extra["chosen"]


def test_arealhex_trains_on_the_flop_rich_type_and_rolls_out_on_the_bandwidth_rich_one():
    sim = sim_of([("a", "L40S", 2, "us"), ("b", "L40S", 2, "us"), ("c", "A100-40GB", 2, "us"),
                  ("d", "A100-40GB", 2, "us")], ("1ms", "10Gbps"), mode="async")
    res = run(sim, "arealhex")
    train = next(devs for tasks, devs in zip(res.candidate.groups, res.candidate.group_devices, strict=True)
                 if "actor_train" in tasks)
    roll = next(devs for tasks, devs in zip(res.candidate.groups, res.candidate.group_devices, strict=True)
                if "actor_gen" in tasks)
    assert types(sim, train) == {"L40S"} and types(sim, roll) == {"A100-40GB"}
