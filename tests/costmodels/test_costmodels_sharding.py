"""Sharded data parallelism (DDP, ZeRO-1/2, FSDP) in the memory and time terms, against hand arithmetic."""

from __future__ import annotations

import pytest

from hetprof.costmodels import LinkSpec, Placement, Work, comm, get_cost_model
from hetprof.costmodels import memory as mem
from hetprof.specs.models import ModelShape

# A small model whose counts are easy to write out: 4 layers of hidden 64, FFN 128, 4 heads of 16,
# 2 KV heads, vocab 100, untied embeddings.
M = ModelShape("toy", "llama", 4, 64, 128, 4, 2, 16, 100, False)
LAYER = (64 * 64 + 2 * 64 * 32 + 64 * 64) + 3 * 64 * 128 + 2 * 64   # q, k, v, o; gate, up, down; two norms
ROOT = 100 * 64 + 100 * 64 + 64                                       # embeddings, LM head, final norm


def test_the_toy_model_counts_what_the_test_assumes():
    assert M.params_per_layer == LAYER
    assert M.embedding_params + M.lm_head_params + M.hidden == ROOT


@pytest.mark.parametrize("sharding", ["none", "zero1", "zero2", "fsdp"])
def test_training_state_is_divided_as_each_level_shards_it(sharding):
    dp, tp, batch, seq = 4, 1, 2, 32
    est = mem.task_memory("training", M, 4, tp, batch, seq, "bf16", False, batch, dp=dp, sharding=sharding)
    params = 4 * LAYER + ROOT
    # mixed-precision Adam: bf16 weights (2 B) and grads (2 B), fp32 master + m + v (12 B)
    weights, grads, optimizer = 2.0 * params, 2.0 * params, 12.0 * params
    if sharding in ("zero1", "zero2", "fsdp"):
        optimizer /= dp
    if sharding in ("zero2", "fsdp"):
        grads /= dp
    if sharding == "fsdp":
        weights /= dp
    assert est.weights == pytest.approx(weights)
    assert est.grads == pytest.approx(grads)
    assert est.optimizer == pytest.approx(optimizer)
    # activations: one layer's stored tensors per token (module docstring), all layers, plus logits and
    # their gradient; FSDP also holds the root unit and two layers gathered while they compute
    per_token_layer = 2 * (5 * 64 + (2 * 64 + 2 * 32 + 4 * 128) / tp)
    act = batch * seq * (4 * per_token_layer) + 2 * batch * seq * 100 * 4
    if sharding == "fsdp":
        act += 2.0 * (ROOT + 2 * LAYER)
    assert est.activations == pytest.approx(act)
    assert est.total == pytest.approx(weights + grads + optimizer + act)


def test_one_replica_shards_nothing():
    alone = mem.task_memory("training", M, 4, 1, 2, 32, "bf16", False, 2, dp=1, sharding="fsdp")
    assert alone == mem.task_memory("training", M, 4, 1, 2, 32, "bf16", False, 2)
    with pytest.raises(ValueError, match="unknown sharding"):
        mem.task_memory("training", M, 4, 1, 2, 32, "bf16", False, 2, dp=2, sharding="zero9")


def test_a_logprob_pass_on_an_fsdp_trainer_holds_its_weight_shard_and_one_gathered_unit():
    whole = mem.task_memory("inference", M, 4, 1, 2, 32, "bf16", False, 2)
    infer = mem.task_memory("inference", M, 4, 1, 2, 32, "bf16", False, 2, dp=8, sharding="fsdp")
    assert whole.weights == pytest.approx(2.0 * (4 * LAYER + ROOT))
    assert infer.weights == pytest.approx(2.0 * (4 * LAYER + ROOT) / 8)
    assert infer.activations == pytest.approx(whole.activations + 2.0 * (ROOT + 2 * LAYER))
    # ZeRO-1/2 keep whole weights on every rank: the pass holds them all
    for level in ("zero1", "zero2"):
        assert mem.task_memory("inference", M, 4, 1, 2, 32, "bf16", False, 2, dp=8, sharding=level) == whole


def test_fsdp_with_tensor_parallel_gathers_its_tp_shard_only():
    est = mem.task_memory("training", M, 4, 2, 2, 32, "bf16", False, 2, dp=4, sharding="fsdp")
    params = (4 * LAYER + ROOT) / 2
    assert est.weights == pytest.approx(2.0 * params / 4)
    base = mem.task_memory("training", M, 4, 2, 2, 32, "bf16", False, 2, dp=4, sharding="zero2")
    assert est.activations - base.activations == pytest.approx(2.0 * (ROOT + 2 * LAYER) / 2)


A, B = 1e-5, 1e9  # link latency (s) and bandwidth (B/s)


def ring(op: str, size: float, n: int) -> float:
    """Ring collectives written out: all-reduce 2(n-1) steps moving 2(n-1)/n of S; all-gather and
    reduce-scatter n-1 steps moving (n-1)/n of S."""
    if op == "all_reduce":
        return 2 * (n - 1) * A + 2 * (n - 1) / n * size / B
    return (n - 1) * A + (n - 1) / n * size / B


@pytest.mark.parametrize("n", [2, 8])
def test_ddp_and_zero_move_the_same_bytes_once_per_step(n):
    layer, root = 4e6, 1e6
    total = 10 * layer + root
    ddp = comm.data_parallel_sync_time("none", layer, 10, root, n, A, B)
    assert ddp == pytest.approx(ring("all_reduce", total, n))
    for level in ("zero1", "zero2"):
        t = comm.data_parallel_sync_time(level, layer, 10, root, n, A, B, forward_s=5.0, backward_s=10.0)
        assert t == pytest.approx(ring("reduce_scatter", total, n) + ring("all_gather", total, n))
        assert t == pytest.approx(ddp)  # same α steps, same bytes: compute does not hide them
    assert comm.data_parallel_sync_time("fsdp", layer, 10, root, 1, A, B) == 0.0


def test_fsdp_hides_per_layer_traffic_behind_compute_except_the_first_and_last():
    layer, root, layers, n = 4e6, 1e6, 10, 8
    ag, rs = ring("all_gather", layer, n), ring("reduce_scatter", layer, n)
    root_t = ring("all_gather", root, n) + ring("reduce_scatter", root, n)
    # compute-bound: every layer's forward (and backward) takes longer than its gathers
    slow = comm.data_parallel_sync_time("fsdp", layer, layers, root, n, A, B, forward_s=1.0, backward_s=2.0)
    assert slow == pytest.approx(root_t + ag + (ag + rs))
    # communication-bound (no compute): every layer's traffic shows
    bare = comm.data_parallel_sync_time("fsdp", layer, layers, root, n, A, B)
    assert bare == pytest.approx(root_t + layers * ag + layers * (ag + rs))
    # in between: per layer max(compute, comm), so the exposed part is comm − compute beyond the first
    fwd, bwd = 0.5 * ag * layers, 0.5 * (ag + rs) * layers   # half of each layer's comm hidden
    mid = comm.data_parallel_sync_time("fsdp", layer, layers, root, n, A, B, forward_s=fwd, backward_s=bwd)
    assert mid == pytest.approx(root_t + ag + 9 * 0.5 * ag + ag + 9 * 0.5 * (ag + rs) + rs)
    # two micro-batches gather (and scatter) twice, each against half the compute
    twice = comm.data_parallel_sync_time("fsdp", layer, layers, root, n, A, B, forward_s=2 * fwd,
                                         backward_s=2 * bwd, micro_batches=2)
    assert twice == pytest.approx(2 * mid)


def test_the_cost_model_prices_sharding_over_the_given_link():
    cm = get_cost_model("analytical")
    link = LinkSpec(A, B)
    work = Work("training", M, 4, 16.0, 16.0, "bf16")
    ddp = cm.dp_grad_sync_time(work, Placement("A100-80GB"), 4, link)
    assert ddp == pytest.approx(ring("all_reduce", 2.0 * (4 * LAYER + ROOT), 4))
    zero2 = cm.dp_grad_sync_time(work, Placement("A100-80GB"), 4, link, sharding="zero2")
    assert zero2 == pytest.approx(ddp)
    fsdp = cm.dp_grad_sync_time(work, Placement("A100-80GB"), 4, link, sharding="fsdp", compute_s=30.0)
    ag, rs = ring("all_gather", 2.0 * LAYER, 4), ring("reduce_scatter", 2.0 * LAYER, 4)
    root_t = ring("all_gather", 2.0 * ROOT, 4) + ring("reduce_scatter", 2.0 * ROOT, 4)
    assert fsdp == pytest.approx(root_t + ag + ag + rs)  # 30 s of compute hides every middle layer
    sharded = cm.memory(work, Placement("A100-80GB", dp=4, sharding="fsdp"))
    assert sharded.weights == pytest.approx(cm.memory(work, Placement("A100-80GB")).weights / 4)


def test_published_qwen3_8b_layouts_on_8_h100_fit_in_memory():
    """verl runs Qwen 7-8B GRPO on one 8×H100 node with FSDP over all 8 (TP1), or Megatron TP1×PP2
    with a distributed optimizer; whole Adam state per GPU (DDP) does not fit."""
    import dataclasses

    from hetprof.planner.candidate import Candidate, even_layout
    from hetprof.planner.search import layouts
    from hetprof.planner.simulator import Simulator
    from hetprof.specs import ClusterSpec, TaskLayout, WorkloadSpec

    cluster = ClusterSpec.from_dict({"name": "h100x8", "hosts": [{"name": "n", "gpus": {"type": "H100", "count": 8}}]})
    wl = WorkloadSpec.from_dict({"models": {"actor": "qwen3-8b"}, "prompts_per_step": 128, "responses_per_prompt": 8,
                                 "prompt_len": {"mean": 256, "max": 1024}, "mini_batches": 4,
                                 "response_len": {"mean": 512, "max": 1024, "dist": "lognormal", "std": 256},
                                 "training": {"recompute": True, "kl_coef": 0.0}})
    sim = Simulator(cluster, wl, get_cost_model("analytical"))
    devs = tuple(sorted(sim.devices))
    lays = {t: even_layout(t, devs, 2 if t == "actor_gen" else 1, 1, 36) for t in sim.tasks}

    def colocated(train: TaskLayout):
        return sim.evaluate(Candidate([tuple(sim.tasks)], [devs], {**lays, "actor_train": train}))

    ddp = lays["actor_train"]
    assert not colocated(ddp).feasible  # 16 B/param of an 8B model on each 80 GB GPU
    assert colocated(dataclasses.replace(ddp, sharding="fsdp")).feasible
    pp2 = even_layout("actor_train", devs, 1, 2, 36)
    # whole Adam state fits a stage only once the planner shrinks the micro-batch below the default
    assert sim.planning.micro_tokens("actor_train", "H100", 1, 18, 128, 4, "none") < mem.MICRO_BATCH_TOKENS
    assert sim.planning.micro_tokens("actor_train", "H100", 1, 18, 128, 4, "zero1") == mem.MICRO_BATCH_TOKENS
    assert colocated(dataclasses.replace(pp2, sharding="zero1")).feasible
    chosen = layouts.best_layout(sim.planning, "actor_train", devs)
    assert chosen.sharding != "none" and sim.task_eval(chosen).violations == ()
