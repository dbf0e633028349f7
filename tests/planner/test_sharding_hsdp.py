"""Hybrid sharding (training.shard_group, verl's fsdp_size): each group of replicas holds one copy."""

from __future__ import annotations

import pytest
import yaml

from hetprof.costmodels import get_cost_model
from hetprof.errors import SpecError
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec


def _workload(**training) -> WorkloadSpec:
    return WorkloadSpec.from_dict({
        "name": "w", "algorithm": "grpo", "models": {"actor": "qwen3-0.6b"}, "prompts_per_step": 8,
        "responses_per_prompt": 2, "prompt_len": {"mean": 64, "max": 64}, "response_len": {"mean": 64, "max": 64},
        "training": {"kl_coef": 0.0, **training}})


def test_a_shard_group_of_two_holds_what_fsdp_over_two_replicas_holds(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"name": "one", "hosts": [{"name": "h", "gpus": {"type": "H100-SXM", "count": 8}}]}))
    cluster, cm = ClusterSpec.load(path), get_cost_model("analytical")
    hybrid = Simulator(cluster, _workload(shard_group=2), cm, executable=False).costs
    full = Simulator(cluster, _workload(), cm, executable=False).costs
    layers = hybrid.basis.graph.model_of("actor_train").layers
    for task in ("actor_train", "actor_logprob"):
        by_group = hybrid.memory(task, "H100-SXM", 1, layers, 2, dp=8, sharding="fsdp")
        assert by_group == full.memory(task, "H100-SXM", 1, layers, 2, dp=2, sharding="fsdp")
        assert by_group.total > full.memory(task, "H100-SXM", 1, layers, 2, dp=8, sharding="fsdp").total
    # a group as large as the replicas is plain FSDP
    wide = Simulator(cluster, _workload(shard_group=16), cm, executable=False).costs
    assert wide.memory("actor_train", "H100-SXM", 1, layers, 2, dp=8, sharding="fsdp") == \
        full.memory("actor_train", "H100-SXM", 1, layers, 2, dp=8, sharding="fsdp")


def test_a_group_of_zero_is_refused_naming_the_field():
    with pytest.raises(SpecError, match="shard_group"):
        _workload(shard_group=0)
