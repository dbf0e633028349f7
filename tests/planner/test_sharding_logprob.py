"""The log-prob pass on an FSDP trainer's replicas holds a weight shard, in the simulator and the plan's check."""

from __future__ import annotations

import yaml

from hetprof.costmodels import get_cost_model
from hetprof.planner.memcheck import check_plan
from hetprof.planner.pinned import PinnedLayout, pinned_candidate
from hetprof.planner.session import build_plan
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.specs.loader import from_data

WORKLOAD = {"name": "w", "algorithm": "grpo", "models": {"actor": "llama3-70b"}, "prompts_per_step": 32,
            "responses_per_prompt": 4, "prompt_len": {"mean": 128, "max": 128}, "response_len": {"mean": 128, "max": 128},
            "mini_batches": 4, "training": {"kl_coef": 0.0, "recompute": True}}
CLUSTER = {"name": "h100x32", "hosts": [{"name": "h", "gpus": {"type": "H100-SXM", "count": 8}, "count": 4}]}
LAYOUT = {"groups": {"all": 32}, "offload": ["all"],
          "tasks": {"generation": {"group": "all", "tp": 8, "pp": 1}, "inference": {"group": "all", "tp": 1, "pp": 1},
                    "training": {"group": "all", "tp": 1, "pp": 1, "sharding": "fsdp"}}}


def test_a_70b_fsdp_layout_is_feasible_and_its_logprob_pass_holds_a_shard(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(CLUSTER))
    sim = Simulator(ClusterSpec.load(path), WorkloadSpec.from_dict(WORKLOAD), get_cost_model("analytical"),
                    streaming=False, executable=False)
    cand = pinned_candidate(sim, from_data(PinnedLayout, LAYOUT))
    score = sim.evaluate(cand)
    assert score.feasible, score.violations  # 140 GB of weights whole on an 80 GB GPU would not be
    logprob = sim.task_eval(sim.with_followers(cand)[0]["actor_logprob"])
    assert max(m.weights for m in logprob.memory.values()) * 32 < 150e9
    plan = build_plan(sim, cand, score, search="pinned", seed=0, objective="throughput")
    assert {t.task: t.layout.sharding for t in plan.tasks}["actor_logprob"] == "none"  # it shards no state
    assert check_plan(plan) == []  # the independent check prices the pass on its leader's shards too


def test_every_generator_replica_is_priced_with_the_steps_longest_response(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(CLUSTER))
    workload = dict(WORKLOAD, models={"actor": "qwen3-0.6b"},
                    response_len={"mean": 256, "max": 4096, "dist": "lognormal", "std": 256})
    sim = Simulator(ClusterSpec.load(path), WorkloadSpec.from_dict(workload), get_cost_model("analytical"),
                    streaming=False, executable=False)
    costs = sim.costs.basis
    for batch in (1, 4, 32):
        lengths = costs.replica_lengths(batch)
        # the sync step waits for the replica holding the step's longest response, not a quantile of it
        assert lengths[-1] == costs.lengths[-1] == costs.lengths.max()
        assert sorted(lengths) == list(lengths)
    assert costs.replica_lengths(4)[0] < costs.lengths.mean()  # the rest still spread over the distribution
