"""The specs: load, save, and one clear error naming file and field for every kind of mistake."""

from __future__ import annotations

import json

import pytest
import yaml

from hetprof.errors import SpecError
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.specs.plan import Plan, workload_tasks

CLUSTER = {
    "name": "two-regions",
    "hosts": [
        {"name": "a100", "region": "us-east", "gpus": {"type": "A100-40GB", "count": 8}, "count": 2},
        {"name": "l4", "region": "eu-west", "gpus": {"type": "L4", "count": 4}, "price_per_hour": 0.5},
    ],
    "network": {
        "intra_region": {"latency": "0.05ms", "bandwidth": "100Gbps"},
        "inter_region": {"latency": "10ms", "bandwidth": "5Gbps"},
        "links": [{"between": ["a100-0", "l4"], "latency": "30ms", "bandwidth": "1Gbps"}],
    },
}

WORKLOAD = {
    "algorithm": "ppo",
    "mode": "async",
    "staleness": 2,
    "models": {"actor": "qwen3-8b", "critic": "qwen3-4b", "reward": "qwen3-4b"},
    "prompts_per_step": 128,
    "responses_per_prompt": 8,
    "prompt_len": {"mean": 256, "max": 1024},
    "response_len": {"mean": 512, "max": 1024, "dist": "lognormal", "std": 300},
}


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_cluster_round_trip_and_expansion(tmp_path):
    spec = ClusterSpec.load(write(tmp_path, "c.yaml", CLUSTER))
    assert spec.host_names() == ["a100-0", "a100-1", "l4"]
    assert spec.gpu_counts() == {"A100-40GB": 16, "L4": 4}
    assert len(spec.devices()) == 20 and spec.devices()[0].id == "a100-0:0"
    assert ClusterSpec.from_dict(spec.to_dict()).to_dict() == spec.to_dict()
    assert spec.price_per_hour("l4") == 0.5
    assert spec.price_per_hour("a100-1") > 0


def test_link_precedence(tmp_path):
    spec = ClusterSpec.from_dict(CLUSTER)
    assert spec.link_between("a100-0", "l4").beta_Bps == pytest.approx(1e9 / 8)  # host-pair override
    assert spec.link_between("a100-1", "l4").beta_Bps == pytest.approx(5e9 / 8)  # inter-region default
    assert spec.link_between("a100-0", "a100-1").alpha_s == pytest.approx(5e-5)  # intra-region
    same = spec.link_between("a100-0", "a100-0")
    assert same.beta_Bps == pytest.approx(300e9)  # NVLink3: 600 GB/s bidirectional, half one way


def test_region_without_link_has_none():
    data = {**CLUSTER, "network": {"intra_region": {"latency": "1ms", "bandwidth": "10Gbps"}}}
    assert ClusterSpec.from_dict(data).link_between("a100-1", "l4") is None


@pytest.mark.parametrize("mutate, field, expected", [
    (lambda d: d["hosts"][1]["gpus"].__setitem__("type", "H999"), "hosts[1].gpus.type", "known GPU type"),
    (lambda d: d["hosts"][0]["gpus"].__setitem__("count", 0), "hosts[0].gpus.count", "positive integer"),
    (lambda d: d["hosts"][0]["gpus"].__setitem__("count", "8"), "hosts[0].gpus.count", "an integer"),
    (lambda d: d["hosts"][0].pop("gpus"), "hosts[0].gpus", "required"),
    (lambda d: d["hosts"][0].__setitem__("colour", "red"), "hosts[0].colour", "known fields"),
    (lambda d: d["network"]["inter_region"].__setitem__("bandwidth", "fast"), "network.inter_region.bandwidth",
     "rate"),
    (lambda d: d["network"]["links"][0].__setitem__("between", ["a100-0"]), "network.links[0].between",
     "exactly two"),
    (lambda d: d["network"]["links"][0].__setitem__("between", ["a100-0", "mars"]), "network.links[0].between",
     "host or region names"),
    (lambda d: d.__setitem__("hosts", "a100"), "hosts", "a list"),
    (lambda d: d["hosts"].append(dict(d["hosts"][1])), "hosts[2].name", "unique"),
])
def test_cluster_errors_name_file_and_field(tmp_path, mutate, field, expected):
    data = json.loads(json.dumps(CLUSTER))
    mutate(data)
    path = write(tmp_path, "bad.yaml", data)
    with pytest.raises(SpecError) as err:
        ClusterSpec.load(path)
    assert err.value.field == field
    assert str(path) in str(err.value)
    assert expected in err.value.expected


def test_unparseable_and_missing_files(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("hosts: [\n")
    with pytest.raises(SpecError, match="broken.yaml"):
        ClusterSpec.load(bad)
    with pytest.raises(SpecError, match="readable file"):
        ClusterSpec.load(tmp_path / "absent.yaml")


def test_workload_roles_and_tasks(tmp_path):
    spec = WorkloadSpec.load(write(tmp_path, "w.yaml", WORKLOAD))
    roles = spec.roles()
    assert roles["actor"].name == "qwen3-8b" and roles["reference"].name == "qwen3-8b"
    assert roles["critic"].name == "qwen3-4b"
    assert spec.sequences_per_step == 1024
    assert workload_tasks(spec) == ["actor_gen", "actor_logprob", "ref_infer", "reward_infer", "critic_infer",
                                    "actor_train", "critic_train"]  # the old-log-prob pass by default
    grpo = WorkloadSpec.from_dict({**WORKLOAD, "algorithm": "grpo", "models": {"actor": "qwen3-4b"}})
    assert workload_tasks(grpo) == ["actor_gen", "actor_logprob", "ref_infer", "actor_train"]


@pytest.mark.parametrize("change, field", [
    ({"algorithm": "grpo"}, "models.critic"),
    ({"algorithm": "dpo"}, "algorithm"),
    ({"models": {"actor": "gpt-9"}, "algorithm": "grpo"}, "models.actor"),
    ({"staleness": 0}, "staleness"),
    ({"response_len": {"mean": 512, "max": 100}}, "response_len.max"),
    ({"mini_batches": 3}, "mini_batches"),
    ({"training": {"top_p": 1.5}}, "training.top_p"),
])
def test_workload_errors(tmp_path, change, field):
    with pytest.raises(SpecError) as err:
        WorkloadSpec.load(write(tmp_path, "w.yaml", {**WORKLOAD, **change}))
    assert err.value.field == field


def test_workload_accepts_local_hf_config(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    spec = WorkloadSpec.load(write(tmp_path, "w.yaml", {**WORKLOAD, "algorithm": "grpo",
                                                        "models": {"actor": "m"}}))
    assert spec.roles()["actor"].hidden == 256


def test_length_distributions_are_seeded_and_capped():
    import numpy as np

    from hetprof.specs import LengthDist
    dist = LengthDist(mean=512, max=1024, dist="lognormal", std=400)
    a = dist.sample(5000, np.random.default_rng(1))
    b = dist.sample(5000, np.random.default_rng(1))
    assert (a == b).all() and a.max() <= 1024 and a.min() >= 1
    assert 400 < a.mean() < 560  # capping trims the tail a little
    assert (LengthDist(mean=100).sample(3, np.random.default_rng(0)) == 100).all()


def _plan_dict():
    cluster = {"hosts": [{"name": "localhost", "gpus": {"type": "cpu", "count": 3}}]}
    workload = {"algorithm": "grpo", "models": {"actor": "tiny"}, "prompt_len": {"mean": 8},
                "response_len": {"mean": 8}, "prompts_per_step": 4, "responses_per_prompt": 4}
    tasklet = {"replica": 0, "stage": 0, "devices": ["localhost:0"], "layer_start": 0, "layer_end": 2}
    return {
        "cluster": cluster, "workload": workload,
        "groups": [{"name": "g0", "tasks": ["actor_gen"], "devices": ["localhost:0"]},
                   {"name": "g1", "tasks": ["ref_infer", "actor_train", "actor_logprob"],
                    "devices": ["localhost:1", "localhost:2"]}],
        "tasks": [
            {"task": "actor_gen", "group": "g0", "tasklets": [tasklet]},
            {"task": "ref_infer", "group": "g1", "tasklets": [{**tasklet, "devices": ["localhost:1"]}]},
            {"task": "actor_train", "group": "g1", "layout": {"dp": 2},
             "tasklets": [{**tasklet, "devices": ["localhost:1"], "batch_share": 0.6},
                          {**tasklet, "replica": 1, "devices": ["localhost:2"], "batch_share": 0.4}]},
            {"task": "actor_logprob", "group": "g1", "layout": {"dp": 2},  # follows actor_train
             "tasklets": [{**tasklet, "devices": ["localhost:1"], "batch_share": 0.6},
                          {**tasklet, "replica": 1, "devices": ["localhost:2"], "batch_share": 0.4}]},
        ],
        "predicted": {"iteration_s": 1.0, "breakdown": {"actor_gen": 0.5}},
    }


def test_plan_round_trip_and_validation(tmp_path):
    plan = Plan.from_dict(_plan_dict())
    plan.validate()
    plan.save(tmp_path / "p.json")
    again = Plan.load(tmp_path / "p.json")
    assert again.to_dict() == plan.to_dict()
    assert again.task("actor_train").layout.dp == 2 and again.workload_spec().models.actor == "tiny"


@pytest.mark.parametrize("mutate, fragment", [
    (lambda d: d["tasks"].pop(1), "missing ['ref_infer']"),
    (lambda d: d["tasks"][2]["tasklets"][0].__setitem__("batch_share", 0.9), "summing to 1"),
    (lambda d: d["tasks"][0]["tasklets"][0].__setitem__("devices", ["localhost:7"]), "devices of group"),
    (lambda d: d["tasks"][0]["tasklets"][0].__setitem__("layer_end", 5), "layer range"),
    (lambda d: d["tasks"][2]["layout"].__setitem__("tp", 2), "tp = 2 devices"),
    (lambda d: d["groups"][0]["devices"].append("elsewhere:0"), "device ids"),
])
def test_plan_validation_names_the_problem(mutate, fragment):
    data = _plan_dict()
    mutate(data)
    with pytest.raises(SpecError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        Plan.from_dict(data).validate()
