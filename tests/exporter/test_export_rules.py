"""What verl and AReaL cannot express (hetprof/specs/expressible.py): one test per rule, each with a
plan that needs the feature and, beside it, the nearest one that does not."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hetprof.specs import expressible
from hetprof.specs.cluster import Device
from hetprof.specs.layout import TaskLayout

HOSTS = {"a0": "A100", "a1": "A100", "l0": "L4"}
DEVICES = [Device(h, i, t, "us-east") for h, t in HOSTS.items() for i in range(4)]


def dev(host: str, *idx: int) -> tuple[str, ...]:
    return tuple(f"{host}:{i}" for i in idx)


def lay(task: str, replicas, tp: int = 1, pp: int = 1, sharding: str = "none", shares=None, splits=None,
        sp: int = 1) -> TaskLayout:
    dp = len(replicas)
    return TaskLayout(task, tp, pp, tuple(replicas), tuple(shares or [1 / dp] * dp),
                      tuple(splits or [(36 // pp,) * pp] * dp), sharding, sp=sp)


def arrangement(layouts: dict[str, TaskLayout], groups, mode: str = "sync", backend: str = "vllm"):
    return expressible.arrangement(groups, layouts, DEVICES, mode, backend)


def colocated(**changes) -> expressible.Arrangement:
    """GRPO with every task on the two A100 hosts (verl's hybrid engine): expressible by both... but AReaL."""
    devs = dev("a0", 0, 1, 2, 3) + dev("a1", 0, 1, 2, 3)
    layouts = {"actor_gen": lay("actor_gen", [devs[:4], devs[4:]], tp=4),
               "actor_train": lay("actor_train", [(d,) for d in devs], sharding="fsdp"),
               "actor_logprob": lay("actor_logprob", [(d,) for d in devs]),
               "ref_infer": lay("ref_infer", [(d,) for d in devs])}
    layouts.update(changes)
    return arrangement(layouts, [("g0", tuple(layouts), devs)])


def split(mode: str = "async", gen_tasks=("actor_gen",), **changes) -> expressible.Arrangement:
    """The rollout on the L4 host, the trainer side on the A100 hosts."""
    train = dev("a0", 0, 1, 2, 3) + dev("a1", 0, 1, 2, 3)
    gen = dev("l0", 0, 1, 2, 3)
    layouts = {"actor_gen": lay("actor_gen", [gen[:2], gen[2:]], tp=2),
               "actor_train": lay("actor_train", [(d,) for d in train], sharding="fsdp"),
               "actor_logprob": lay("actor_logprob", [(d,) for d in train]),
               "ref_infer": lay("ref_infer", [(d,) for d in train])}
    if "actor_train" in changes:  # the passes on the actor's workers take its layout unless told otherwise
        for t in ("actor_logprob", "ref_infer"):
            layouts[t] = dataclasses.replace(changes["actor_train"], task=t, sharding="none")
    layouts.update(changes)
    rest = tuple(t for t in layouts if t not in gen_tasks)
    return arrangement(layouts, [("gen", tuple(gen_tasks), gen), ("train", rest, train)], mode=mode)


def broken(target: str, arr) -> list[str]:
    return [rule.name for rule, _ in expressible.problems(target, arr)]


def test_the_baselines_are_expressible():
    assert broken("verl", colocated()) == []
    assert broken("verl", split()) == [] and broken("areal", split()) == []
    assert broken("areal", colocated()) == ["decoupled"]  # AReaL always runs the rollout on its own GPUs


@pytest.mark.parametrize("target", ["verl", "areal"])
def test_uneven_batch_shares(target):
    base = split().layouts["actor_train"]
    arr = split(actor_train=dataclasses.replace(base, shares=(0.2,) * 4 + (0.05,) * 4))
    assert broken(target, arr) == ["even-shares"]
    line = expressible.refusal(target, *expressible.problems(target, arr)[0])
    assert line.startswith(f"{target}: per-replica batch shares are not expressible (actor_train shares 0.05–0.2;")
    assert line.endswith(f"re-plan with --target {target}") and "\n" not in line


@pytest.mark.parametrize("target", ["verl", "areal"])
def test_per_replica_tp(target):
    gen = dev("l0", 0, 1, 2, 3)
    arr = split(actor_gen=lay("actor_gen", [gen[:1], gen[1:2], gen[2:]], tp=2, shares=[0.25, 0.25, 0.5]))
    arr = split(actor_gen=dataclasses.replace(arr.layouts["actor_gen"], shares=(1 / 3,) * 3))
    assert broken(target, arr) == ["one-tp-per-role"]


@pytest.mark.parametrize("target", ["verl", "areal"])
def test_uneven_layer_splits(target):
    train = dev("a0", 0, 1, 2, 3) + dev("a1", 0, 1, 2, 3)
    pipelined = [train[i:i + 2] for i in range(0, 8, 2)]
    assert broken(target, split(actor_train=lay("actor_train", pipelined, pp=2))) == []
    uneven = lay("actor_train", pipelined, pp=2, splits=[(20, 16)] * 4)
    assert broken(target, split(actor_train=uneven)) == ["even-layers"]


@pytest.mark.parametrize("target", ["verl", "areal"])
def test_pools_with_unequal_gpus_per_node(target):
    train = dev("a0", 0, 1, 2, 3) + dev("a1", 0, 1)  # 4 GPUs of one node, 2 of the other
    layouts = {t: lay(t, [(d,) for d in train]) for t in ("actor_train", "actor_logprob", "ref_infer")}
    gen = dev("l0", 0, 1, 2, 3)
    layouts["actor_gen"] = lay("actor_gen", [gen])
    arr = arrangement(layouts, [("gen", ("actor_gen",), gen), ("train", ("actor_train", "actor_logprob",
                                                                          "ref_infer"), train)], mode="async")
    assert "whole-nodes" in broken(target, arr)


@pytest.mark.parametrize("target", ["verl", "areal"])
def test_sharded_model_parallel(target):
    train = dev("a0", 0, 1, 2, 3) + dev("a1", 0, 1, 2, 3)
    tp2 = lay("actor_train", [train[i:i + 2] for i in range(0, 8, 2)], tp=2, sharding="zero2")
    assert broken(target, split(actor_train=tp2)) == ["sharding"]
    assert broken(target, split(actor_train=dataclasses.replace(tp2, sharding="zero1"))) == []


@pytest.mark.parametrize("target", ["verl", "areal"])
def test_ulysses_with_tp(target):
    train = dev("a0", 0, 1, 2, 3) + dev("a1", 0, 1, 2, 3)
    tp2 = lay("actor_train", [train[i:i + 2] for i in range(0, 8, 2)], tp=2, sp=2)
    assert broken(target, split(actor_train=tp2)) == ["ulysses"]


@pytest.mark.parametrize("target", ["verl", "areal"])
def test_engines_the_frameworks_lack(target):
    arr = dataclasses.replace(split(), backend="hf")
    assert broken(target, arr) == ["engine"]


def test_verl_maps_actor_reference_and_critic_to_one_pool():
    train = dev("a0", 0, 1, 2, 3)
    ref = dev("a1", 0, 1, 2, 3)
    gen = dev("l0", 0, 1, 2, 3)
    layouts = {"actor_gen": lay("actor_gen", [gen], tp=4),
               "actor_train": lay("actor_train", [(d,) for d in train], sharding="fsdp"),
               "actor_logprob": lay("actor_logprob", [(d,) for d in train]),
               "ref_infer": lay("ref_infer", [(d,) for d in ref])}
    arr = arrangement(layouts, [("gen", ("actor_gen",), gen), ("train", ("actor_train", "actor_logprob"), train),
                                ("ref", ("ref_infer",), ref)], mode="async")
    assert broken("verl", arr) == ["trainer-pool"]
    assert broken("areal", arr) == ["actor-allocation"]  # AReaL runs the reference on the actor's allocation


def test_verl_runs_a_rollout_pool_apart_only_fully_async_and_alone():
    assert broken("verl", split(mode="sync")) == ["rollout-pool"]
    assert broken("verl", split(mode="async")) == []
    assert {"trainer-pool", "rollout-pool"} <= set(broken("verl", split(gen_tasks=("actor_gen", "ref_infer"))))


def test_areal_decouples_the_rollout():
    assert broken("areal", split(mode="sync")) == []  # max_head_offpolicyness 0
    assert "decoupled" in broken("areal", split(gen_tasks=("actor_gen", "ref_infer")))


@pytest.mark.parametrize("target", ["verl", "areal"])
def test_a_task_on_part_of_its_pool(target):
    gen = dev("l0", 0, 1, 2, 3)
    arr = split(actor_gen=lay("actor_gen", [gen[:2]], tp=2))  # two of the pool's four GPUs idle
    assert broken(target, arr) == ["whole-pool"]


def test_shares_may_differ_by_one_sequence():
    """1024 sequences over 24 replicas: 42 or 43 each, as the frameworks split them."""
    base = split().layouts["actor_train"]
    whole = dataclasses.replace(base, shares=(43 / 100,) + (57 / 700,) * 7)
    arr = dataclasses.replace(split(actor_train=whole), sequences=100)
    assert broken("verl", arr) != [] and broken("verl", dataclasses.replace(arr, sequences=1)) == []
    near = dataclasses.replace(base, shares=(13 / 100,) + (87 / 700,) * 7)  # 13 vs 12.43 sequences
    assert broken("verl", dataclasses.replace(split(actor_train=near), sequences=100)) == []


def test_a_sub_cluster_search_keeps_the_targets_restriction():
    """Searches that split the cluster (region pools) score on `on_cluster` simulators: those must
    refuse what the target cannot express too, or a sub-pool plan could escape the restriction."""
    from hetprof.planner.session import PlanOptions, make_simulator
    from hetprof.planner.targets import TargetedSimulator
    from hetprof.specs import ClusterSpec, WorkloadSpec

    root = Path(__file__).resolve().parents[2] / "examples"
    cluster = ClusterSpec.load(root / "clusters/hetrl-multi-region.yaml")
    workload = WorkloadSpec.load(root / "workloads/qwen3-4b-grpo-sync.yaml")
    sim = make_simulator(cluster, workload, PlanOptions(target="verl"))
    sub = sim.on_cluster(cluster)
    assert isinstance(sub, TargetedSimulator) and sub.target == "verl"


def test_expert_parallel_fsdp_replicas():
    # verl's and AReaL's FSDP engines split no experts: an EP layout must be Megatron's (zero1 or none)
    train = dev("a0", 0, 1, 2, 3) + dev("a1", 0, 1, 2, 3)
    ep = lay("actor_train", [(d,) for d in train], sharding="fsdp")
    ep = dataclasses.replace(ep, ep=4)
    for target in ("verl", "areal"):
        moe = dataclasses.replace(split(actor_train=ep), experts=frozenset({"actor_train"}))
        assert broken(target, moe) == ["fsdp-experts"]
        zero1 = dataclasses.replace(split(actor_train=dataclasses.replace(ep, sharding="zero1")),
                                    experts=frozenset({"actor_train"}))
        assert broken(target, zero1) == []


def test_areal_names_a_megatron_trainer_only_with_whole_experts():
    train = dev("a0", 0, 1, 2, 3) + dev("a1", 0, 1, 2, 3)
    tp2 = lay("actor_train", [train[i:i + 2] for i in range(0, 8, 2)], tp=2)
    sliced = dataclasses.replace(split(actor_train=tp2), experts=frozenset(split().layouts))
    assert broken("areal", sliced) == ["whole-experts"] and broken("verl", sliced) == []
    whole = dataclasses.replace(split(actor_train=dataclasses.replace(tp2, etp=1)), experts=frozenset(split().layouts))
    assert broken("areal", whole) == []
    assert broken("areal", split(actor_train=tp2)) == []  # a dense model has no experts to slice


def test_exports_name_megatrons_expert_parallel_size():
    """Megatron counts the EP group's ranks: ep replicas, × tp with whole experts (etp 1); verl is told
    both sizes, AReaL's `e` dimension carries it (its experts are whole)."""
    from types import SimpleNamespace

    from hetprof.exporter.areal import _term
    from hetprof.exporter.verl import _engine_settings

    train = dev("a0", 0, 1, 2, 3) + dev("a1", 0, 1, 2, 3)
    tp2 = dataclasses.replace(lay("actor_train", [train[i:i + 2] for i in range(0, 8, 2)], tp=2), ep=2)
    for layout, ep, etp in ((tp2, 2, 2), (dataclasses.replace(tp2, etp=1), 4, 1)):
        task = SimpleNamespace(task="actor_train", layout=layout)
        plan = SimpleNamespace(tasks=[task], task=lambda _name, t=task: t)
        sets = {s.key: s.value for s in _engine_settings("actor_rollout_ref.actor", plan, "actor_train")}
        assert sets["actor_rollout_ref.actor.megatron.expert_model_parallel_size"] == ep
        assert sets["actor_rollout_ref.actor.megatron.expert_tensor_parallel_size"] == etp
    assert _term("megatron", "actor", dataclasses.replace(tp2, etp=1)) == "megatron[actor]:d4p1t2e4"
    assert _term("megatron", "actor", dataclasses.replace(tp2, tp=1, replicas=tuple((d,) for d in train),
                                                          shares=(1 / 8,) * 8, layer_splits=((36,),) * 8,
                                                          ep=8)) == "megatron[actor]:d8p1t1e8"
