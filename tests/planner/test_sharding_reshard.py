"""The hybrid engine's in-place resharding of new weights (trainer layout -> generator layout), by hand."""

from __future__ import annotations

import pytest
import yaml

from hetprof.costmodels import LinkSpec, get_cost_model
from hetprof.planner.pinned import PinnedLayout, pinned_candidate
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.specs.loader import from_data
from hetprof.specs.models import ModelShape

M = ModelShape("toy", "llama", 4, 64, 128, 4, 2, 16, 100, False)
LINK = LinkSpec(1e-5, 1e10)


def test_each_generator_rank_gathers_the_rest_of_its_tp_shard():
    cm = get_cost_model("analytical")
    weights = M.weight_bytes("bf16")
    # FSDP over 32 ranks -> TP4 generators: each rank holds 1/32, needs 1/4: a ring all-gather of
    # the 1/4 shard among the 8 ranks holding its pieces: 7 steps of α, 7/8 of the shard over β
    assert cm.reshard_time(M, LINK, 4, 32) == pytest.approx(7 * 1e-5 + 7 / 8 * weights / 4 / 1e10)
    # Megatron TP8 x PP4 -> TP8 (a PP fold): 3 of the 4 stages' layers come from the other stages
    assert cm.reshard_time(M, LINK, 8, 8, stages=4) == pytest.approx(3 * 1e-5 + 3 / 4 * weights / 8 / 1e10)
    assert cm.reshard_time(M, LINK, 4, 4) == 0.0  # the trainer's piece is the generator's shard
    # Megatron TP1 x PP4 -> TP8: a generator shard is 1/8 of every layer's width, on all 4 stages; the
    # stage's own GPU holds its layers' full width, so 3/4 of the shard comes from the other stages
    assert cm.reshard_time(M, LINK, 8, 1, stages=4) == pytest.approx(3 * 1e-5 + 3 / 4 * weights / 8 / 1e10)
    # TP2 x PP2 -> TP1: the generator needs the whole model, held in 2 widths x 2 stages
    assert cm.reshard_time(M, LINK, 1, 2, stages=2) == pytest.approx(3 * 1e-5 + 3 / 4 * weights / 1e10)


def test_gathers_that_share_a_hosts_network_cards_each_get_a_share_of_them():
    cm = get_cost_model("analytical")
    weights = M.weight_bytes("bf16")
    # 8 GPUs of a host gather at once through its cards: α per step as before, 8× the bytes per β
    assert cm.reshard_time(M, LINK, 4, 32, flows=8) == pytest.approx(7 * 1e-5 + 8 * 7 / 8 * weights / 4 / 1e10)


def test_a_colocated_step_prices_the_reshard_and_a_split_one_the_broadcast(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"name": "two", "hosts": [{"name": "h", "gpus": {"type": "H100-SXM", "count": 8},
                                                               "count": 2}]}))
    workload = WorkloadSpec.from_dict({
        "name": "w", "algorithm": "grpo", "models": {"actor": "qwen3-0.6b"}, "prompts_per_step": 16,
        "responses_per_prompt": 4, "prompt_len": {"mean": 64, "max": 64}, "response_len": {"mean": 64, "max": 64},
        "training": {"kl_coef": 0.0}})
    cm = get_cost_model("analytical")
    sim = Simulator(ClusterSpec.load(path), workload, cm, streaming=False, executable=False)
    tasks = {"generation": {"group": "all", "tp": 2, "pp": 1}, "inference": {"group": "all", "tp": 1, "pp": 1},
             "training": {"group": "all", "tp": 1, "pp": 1, "sharding": "fsdp"}}
    score = sim.evaluate(pinned_candidate(sim, from_data(PinnedLayout, {"groups": {"all": 16}, "tasks": tasks})))
    link = sim.links.slowest(set(sim.links.hosts))  # the two hosts' link
    model = sim.graph.model_of("actor_train")
    # FSDP over 16 -> TP2: each GPU gathers 1/2 of the weights from 8 ranks, the 8 GPUs of a host at once
    # over its network cards (the pieces span both hosts)
    by_hand = 7 * link.alpha_s + 8 * 7 / 8 * model.weight_bytes("bf16") / 2 / link.beta_Bps
    assert score.transfer_s["weights:actor_train->actor_gen"] == pytest.approx(by_hand)


def test_within_one_host_the_reshard_shares_no_network_card(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"name": "one", "hosts": [{"name": "h", "gpus": {"type": "H100-SXM", "count": 8}}]}))
    workload = WorkloadSpec.from_dict({
        "name": "w", "algorithm": "grpo", "models": {"actor": "qwen3-0.6b"}, "prompts_per_step": 16,
        "responses_per_prompt": 4, "prompt_len": {"mean": 64, "max": 64}, "response_len": {"mean": 64, "max": 64},
        "training": {"kl_coef": 0.0}})
    cm = get_cost_model("analytical")
    sim = Simulator(ClusterSpec.load(path), workload, cm, streaming=False, executable=False)
    tasks = {"generation": {"group": "all", "tp": 2, "pp": 1}, "inference": {"group": "all", "tp": 1, "pp": 1},
             "training": {"group": "all", "tp": 1, "pp": 1, "sharding": "fsdp"}}
    score = sim.evaluate(pinned_candidate(sim, from_data(PinnedLayout, {"groups": {"all": 8}, "tasks": tasks})))
    link = sim.links.between("h", "h")  # the host's own GPU link
    model = sim.graph.model_of("actor_train")
    # FSDP over 8 -> TP2: 3 of the 4 pieces of a TP shard come over NVLink, which each GPU has to itself
    by_hand = 3 * link.alpha_s + 3 / 4 * model.weight_bytes("bf16") / 2 / link.beta_Bps
    assert score.transfer_s["weights:actor_train->actor_gen"] == pytest.approx(by_hand)


def test_a_split_broadcast_across_hosts_streams_through_one_gpus_network_card(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"name": "two", "hosts": [{"name": "h", "gpus": {"type": "H100-SXM", "count": 8},
                                                               "count": 2}]}))
    workload = WorkloadSpec.from_dict({
        "name": "w", "algorithm": "grpo", "models": {"actor": "qwen3-0.6b"}, "prompts_per_step": 16,
        "responses_per_prompt": 4, "prompt_len": {"mean": 64, "max": 64}, "response_len": {"mean": 64, "max": 64},
        "training": {"kl_coef": 0.0}})
    sim = Simulator(ClusterSpec.load(path), workload, get_cost_model("analytical"), streaming=False, executable=False)
    tasks = {"generation": {"group": "gen", "tp": 2, "pp": 1}, "inference": {"group": "train", "tp": 1, "pp": 1},
             "training": {"group": "train", "tp": 1, "pp": 1, "sharding": "fsdp"}}
    layout = {"groups": {"train": 8, "gen": 8}, "tasks": tasks}
    score = sim.evaluate(pinned_candidate(sim, from_data(PinnedLayout, layout)))
    link = sim.links.slowest(set(sim.links.hosts))
    model = sim.graph.model_of("actor_train")
    # one trainer rank broadcasts to the 4 TP2 generators (a ring of 5: 4 hops of α, the weights once),
    # through its own card: 1/8 of the host's 8-GPU bandwidth
    by_hand = 4 * link.alpha_s + model.weight_bytes("bf16") / (link.beta_Bps / 8)
    assert score.transfer_s["weights:actor_train->actor_gen"] == pytest.approx(by_hand)
