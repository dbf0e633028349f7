"""Ulysses sequence parallelism (training.sequence_parallel): its all-to-alls by hand, and who refuses it."""

from __future__ import annotations

import pytest
import yaml

from hetprof.costmodels import LinkSpec, comm, get_cost_model
from hetprof.costmodels.data import Placement, Work
from hetprof.errors import InfeasibleError, SpecError
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.specs.models import ModelShape

M = ModelShape("toy", "llama", 4, 64, 128, 4, 2, 16, 100, False)  # q 4×16 = 64, kv 2×16 = 32 wide
LINK = LinkSpec(1e-5, 1e10)


def test_four_all_to_alls_per_layer_and_pass_move_the_ranks_share_of_q_k_v_and_out():
    # 1000 tokens × (64 + 64 + 32 + 32) × 2 bytes = 384 kB per rank; sp 4 sends 3/4 of it in 3 α-steps
    per_pass = 4 * 3 * 1e-5 + 3 / 4 * 384_000 / 1e10
    assert comm.ulysses_all_to_all_time(1000, 64, 32, 4, 4, 3, 1e-5, 1e10) == pytest.approx(4 * 3 * per_pass)
    assert comm.ulysses_all_to_all_time(1000, 64, 32, 4, 1, 3, 1e-5, 1e10) == 0.0


def test_training_pays_forward_backward_and_recompute_a_log_prob_pass_only_its_forward():
    cm = get_cost_model("analytical")
    place = Placement("H100-SXM", 1)
    one = comm.ulysses_all_to_all_time(10 * 100, 64, 32, 4, 4, 1, 1e-5, 1e10)
    train = Work("training", M, 10, 20, 80, recompute=True)
    assert cm.sequence_parallel_time(train, place, 4, LINK) == pytest.approx(3 * one)
    assert cm.sequence_parallel_time(Work("inference", M, 10, 20, 80), place, 4, LINK) == pytest.approx(one)


def _workload(**training) -> WorkloadSpec:
    return WorkloadSpec.from_dict({
        "name": "w", "algorithm": "grpo", "models": {"actor": "qwen3-0.6b"}, "prompts_per_step": 8,
        "responses_per_prompt": 2, "prompt_len": {"mean": 64, "max": 64}, "response_len": {"mean": 64, "max": 64},
        "training": {"kl_coef": 0.0, **training}})


def test_hetprof_run_refuses_it_and_a_packed_budget_may_hold_a_split_sequence(tmp_path):
    from hetprof.planner.simulator import Simulator

    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"name": "one", "hosts": [{"name": "h", "gpus": {"type": "H100-SXM", "count": 8}}]}))
    with pytest.raises(InfeasibleError, match="training.sequence_parallel"):
        Simulator(ClusterSpec.load(path), _workload(sequence_parallel=2), get_cost_model("analytical"), executable=True)
    assert _workload(sequence_parallel=2, max_tokens_per_microbatch=64).training.sequence_parallel == 2
    with pytest.raises(SpecError, match="max_tokens_per_microbatch"):
        _workload(max_tokens_per_microbatch=64)  # 128 tokens do not fit one rank's 64 unsplit


def test_a_degree_that_does_not_divide_the_replicas_is_a_layout_problem(tmp_path):
    from hetprof.planner.pinned import PinnedLayout, pinned_candidate
    from hetprof.planner.simulator import Simulator
    from hetprof.specs.loader import from_data

    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"name": "one", "hosts": [{"name": "h", "gpus": {"type": "H100-SXM", "count": 8}}]}))
    sim = Simulator(ClusterSpec.load(path), _workload(sequence_parallel=3), get_cost_model("analytical"),
                    streaming=False, executable=False)
    tasks = {"generation": {"group": "all", "tp": 1, "pp": 1}, "inference": {"group": "all", "tp": 1, "pp": 1},
             "training": {"group": "all", "tp": 1, "pp": 1, "sharding": "fsdp"}}
    score = sim.evaluate(pinned_candidate(sim, from_data(PinnedLayout, {"groups": {"all": 8}, "tasks": tasks})))
    assert not score.feasible
    assert any("sequence_parallel 3 does not divide its 8 replicas" in v for v in score.violations)


def test_a_sequence_longer_than_a_ranks_budget_splits_its_activations_over_the_group():
    from hetprof.costmodels import memory

    def act(batch: int, seq_len: int, sp: int) -> float:
        return memory.task_memory("inference", M, 4, 1, batch, seq_len, "bf16", False, 1, sp=sp).activations

    per_token = memory.activation_bytes_per_token_layer(M, 1) + M.vocab * memory.LOGIT_BYTES
    # one 32768-token sequence a rank: alone it holds all of it; 4 ranks form micro-batches of 4 × 16384
    # tokens (2 sequences) and each holds a quarter of one: 16384 tokens
    assert act(1, 32768, 1) == pytest.approx(32768 * per_token)
    assert act(1, 32768, 4) == pytest.approx(16384 * per_token)
    # many short sequences fill the budget either way: 16 of 1000 alone, 65 of 1000 over 4 ranks
    assert act(64, 1000, 1) == pytest.approx(16000 * per_token)
    assert act(64, 1000, 4) == pytest.approx(65000 / 4 * per_token)


def test_hetprof_run_refuses_a_what_if_plan_that_splits_sequences():
    from hetprof.errors import ExecutionError
    from hetprof.executor.launch.checks import check_supported
    from hetprof.executor.launch.handwritten_plan import handwritten_plan

    cluster = {"name": "c", "hosts": [{"name": "h", "gpus": {"type": "cpu", "count": 2}}]}
    data = _workload(sequence_parallel=2).to_dict()
    plan = handwritten_plan(cluster, data, {"actor_gen": ["h:0"], "actor_train": ["h:0", "h:1"]})
    with pytest.raises(ExecutionError, match=r"training\.sequence_parallel 2"):
        check_supported(plan)
    data["training"]["sequence_parallel"] = 1
    plan = handwritten_plan(cluster, data, {"actor_gen": ["h:0"], "actor_train": ["h:0", "h:1"]})
    assert check_supported(plan) == "gloo"
