"""The log-prob pass on an FSDP trainer's shards pays FSDP's per-layer parameter gathers, by hand."""

from __future__ import annotations

import pytest
import yaml

from hetprof.costmodels import comm, get_cost_model
from hetprof.planner.pinned import PinnedLayout, pinned_candidate
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.specs.loader import from_data


def test_a_forward_pass_gathers_the_root_and_every_layer_per_micro_batch():
    # 4 ranks, α 10 µs, β 1 GB/s: a layer's gather is 3 α + 3/4 of 1 MB, the root's 3 α + 3/4 of 2 MB
    gather, root = 3e-5 + 0.75e-3, 3e-5 + 1.5e-3
    bare = comm.fsdp_forward_gather_time(1e6, 3, 2e6, 4, 1e-5, 1e9, forward_s=0.0, micro_batches=2)
    assert bare == pytest.approx(2 * (root + 3 * gather))  # nothing to hide behind: every gather exposed
    # a slow forward hides all but the first layer's gather (prefetch) and the root's
    hidden = comm.fsdp_forward_gather_time(1e6, 3, 2e6, 4, 1e-5, 1e9, forward_s=1.0, micro_batches=2)
    assert hidden == pytest.approx(2 * (root + gather))
    # a forward of 0.5 ms per layer leaves (gather - 0.5 ms) of each later layer exposed
    part = comm.fsdp_forward_gather_time(1e6, 3, 2e6, 4, 1e-5, 1e9, forward_s=6 * 0.5e-3, micro_batches=2)
    assert part == pytest.approx(2 * (root + gather + 2 * (gather - 0.5e-3)))
    assert comm.fsdp_forward_gather_time(1e6, 3, 2e6, 1, 1e-5, 1e9) == 0.0  # one rank holds it all


def test_the_simulator_adds_the_gathers_to_an_fsdp_logprob_pass_only(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"name": "two", "hosts": [{"name": "h", "gpus": {"type": "H100-SXM", "count": 8},
                                                               "count": 2}]}))
    workload = WorkloadSpec.from_dict({
        "name": "w", "algorithm": "grpo", "models": {"actor": "qwen3-0.6b"}, "prompts_per_step": 32,
        "responses_per_prompt": 4, "prompt_len": {"mean": 64, "max": 64}, "response_len": {"mean": 64, "max": 64},
        "training": {"kl_coef": 0.0}})
    sim = Simulator(ClusterSpec.load(path), workload, get_cost_model("analytical"), streaming=False, executable=False)

    def logprob(sharding: str) -> float:
        tasks = {"generation": {"group": "all", "tp": 2, "pp": 1}, "inference": {"group": "all", "tp": 1, "pp": 1},
                 "training": {"group": "all", "tp": 1, "pp": 1, "sharding": sharding}}
        cand = pinned_candidate(sim, from_data(PinnedLayout, {"groups": {"all": 16}, "tasks": tasks}))
        return sim.task_eval(sim.with_followers(cand)[0]["actor_logprob"]).seconds

    plain, sharded = logprob("none"), logprob("fsdp")
    model = sim.graph.model_of("actor_logprob")
    link = sim.links.slowest(set(sim.links.hosts))
    # 16 ranks, one micro-batch (8 sequences × 128 tokens): the root's gather (embeddings, LM head,
    # final norm) and the first layer's exposed, each later layer's beyond its share of the forward
    gather = comm.collective_time("all_gather", model.params_per_layer * 2, 16, link.alpha_s, link.beta_Bps)
    root_params = model.embedding_params + model.lm_head_params + model.hidden
    root = comm.collective_time("all_gather", root_params * 2, 16, link.alpha_s, link.beta_Bps)
    by_hand = root + gather + (model.layers - 1) * max(0.0, gather - plain / model.layers)
    assert sharded - plain == pytest.approx(by_hand)
    assert by_hand > 0
