"""Packed sequences equal padded ones: forward, log-probs, values, losses and gradients, on batches
whose lengths differ by an order of magnitude; and the token-budget micro-batch grouping."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.packing_batches import ragged_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetprof.errors import SpecError
from hetprof.executor.algorithms import RLBatch, get_algorithm
from hetprof.executor.algorithms.learner import Learner
from hetprof.executor.models.logprobs import token_logprobs
from hetprof.executor.models.modeling import build_causal_lm, build_reward_model, build_value_model
from hetprof.executor.models.packing import packed_sequence_scores, packed_values, priced_pass
from hetprof.executor.parallel.batch_split import token_share_slices
from hetprof.runtime.packedpass import pack, packed_token_logprobs, unpack
from hetprof.runtime.tokenbudget import micro_batch_count, micro_batches_by_tokens
from hetprof.specs.workload import WorkloadSpec

pytestmark = pytest.mark.usefixtures("one_thread")

def test_pack_keeps_attended_tokens_with_restarting_positions_and_unpacks_exactly():
    batch = ragged_batch()
    packed = pack(batch.input_ids, batch.attention_mask)
    lengths = batch.attention_mask.sum(1)
    assert packed.tokens == int(lengths.sum())
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    assert packed.position_ids[0, starts].eq(0).all()
    assert packed.position_ids[0, starts + lengths - 1].tolist() == (lengths - 1).tolist()
    back = unpack(packed.input_ids[0], packed)
    assert torch.equal(back, batch.input_ids * batch.attention_mask)


def test_packed_forward_logprobs_and_entropy_equal_padded():
    batch = ragged_batch()
    model = build_causal_lm("tiny", seed=0).eval()
    valid = batch.attention_mask[:, :-1].bool() & batch.attention_mask[:, 1:].bool()
    with torch.no_grad():
        lp, ent = token_logprobs(model, batch.input_ids, batch.attention_mask, 0.7, with_entropy=True)
        for budget in (None, 80, 72):  # one pack; several packs (72 = the longest sequence alone)
            plp, pent = packed_token_logprobs(model, batch.input_ids, batch.attention_mask, 0.7,
                                              with_entropy=True, max_tokens=budget)
            assert torch.allclose(plp[valid], lp[valid], atol=1e-5)
            assert torch.allclose(pent[valid], ent[valid], atol=1e-5)
            assert plp[~valid].eq(0).all()
        # restricted to the response columns: the same numbers there, zero elsewhere
        only = packed_token_logprobs(model, batch.input_ids, batch.attention_mask, 0.7, needed=batch.mask)
    assert torch.allclose(only[batch.mask.bool()], lp[batch.mask.bool()], atol=1e-5)
    assert only[~batch.mask.bool()].eq(0).all()


def test_packed_values_and_sequence_scores_equal_padded():
    batch = ragged_batch()
    critic, rm = build_value_model("tiny", seed=0), build_reward_model("tiny", seed=3)
    torch.nn.init.normal_(critic.head.weight)  # a zero head would hide any difference
    attended = batch.attention_mask.bool()
    with torch.no_grad():
        padded = critic(batch.input_ids, batch.attention_mask)
        for budget in (None, 90):
            assert torch.allclose(packed_values(critic, batch.input_ids, batch.attention_mask, budget)[attended],
                                  padded[attended], atol=1e-5)
        scores = packed_sequence_scores(rm, batch.input_ids, batch.attention_mask, 90)
        assert torch.allclose(scores, rm.sequence_scores(batch.input_ids, batch.attention_mask), atol=1e-5)


def _grads_after_update(batch: RLBatch, role: str, **learner_kwargs) -> tuple[list[torch.Tensor], dict]:
    if role == "actor":
        model = build_causal_lm("tiny", seed=0)
        algo = get_algorithm("grpo")(kl_coef=0.1, entropy_coef=0.01, clip_eps=0.1)
    else:
        model = build_value_model("tiny", seed=0)
        torch.nn.init.normal_(model.head.weight, std=0.1, generator=torch.Generator().manual_seed(0))
        algo = get_algorithm("ppo")(value_clip=0.05)
    learner = Learner(model, torch.optim.SGD(model.parameters(), lr=0.0), algo, role=role, max_grad_norm=None,
                      recompute_proximal=role == "actor", **learner_kwargs)
    stats = learner.update(batch)
    return [p.grad.detach().clone() for p in model.parameters()], stats


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_packed_update_equals_padded_update(role):
    batch = ragged_batch()
    (get_algorithm("grpo")() if role == "actor" else get_algorithm("ppo")()).advantages(batch)
    padded, padded_stats = _grads_after_update(copy.deepcopy(batch), role, micro_batches=2)
    for budget in (72, 200, 10_000):
        packed, stats = _grads_after_update(copy.deepcopy(batch), role, max_tokens_per_microbatch=budget)
        for a, b in zip(padded, packed, strict=True):
            assert torch.allclose(a, b, atol=1e-6, rtol=1e-4), (budget, float((a - b).abs().max()))
        loss = "policy_loss" if role == "actor" else "value_loss"
        if budget == 10_000:  # one micro-batch per side when the padded update runs one too
            whole, whole_stats = _grads_after_update(copy.deepcopy(batch), role, micro_batches=1)
            assert stats[loss] == pytest.approx(whole_stats[loss], rel=1e-4, abs=1e-6)
    assert any(g.abs().sum() > 0 for g in padded)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 50), min_size=0, max_size=40), budget=st.integers(1, 120),
       count=st.integers(1, 12))
def test_token_budget_groups_cover_every_sequence_once_within_the_budget(lengths, budget, count):
    groups = micro_batches_by_tokens(lengths, budget, count)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert len(groups) >= count
    for g in groups:
        assert len(g) == 1 or sum(lengths[i] for i in g) <= budget  # only a lone long sequence goes over
        assert g == sorted(g)
    if len(lengths) >= count:
        assert all(groups)  # empty groups only when there are fewer sequences than groups
    fewest = micro_batch_count(lengths, budget)
    assert len(groups) == max(count, fewest)
    assert fewest >= max(1, -(-sum(min(n, budget) for n in lengths) // budget))  # no fewer than the tokens need


def test_budget_below_the_longest_sequence_is_refused_by_name():
    data = {"models": {"actor": "tiny"}, "prompt_len": {"mean": 8, "max": 16},
            "response_len": {"mean": 32, "max": 64}, "training": {"max_tokens_per_microbatch": 79}}
    with pytest.raises(SpecError, match="max_tokens_per_microbatch"):
        WorkloadSpec.from_dict(data, file="w.yaml").validate()
    data["training"]["max_tokens_per_microbatch"] = 80
    WorkloadSpec.from_dict(data, file="w.yaml").validate()


def test_varlen_attention_splits_packed_rows_without_an_n_squared_mask(monkeypatch):
    import hetprof.runtime.varlen_attention as varlen

    batch = ragged_batch()
    packed = pack(batch.input_ids, batch.attention_mask)
    lengths = batch.attention_mask.sum(1)
    assert varlen.sequence_starts(packed.position_ids) == [0, *lengths.cumsum(0).tolist()]
    block_mask = build_causal_lm("tiny", seed=0, attn_implementation="sdpa").eval()  # transformers' N × N mask
    per_sequence = build_causal_lm("tiny", seed=0).eval()
    assert per_sequence.config._attn_implementation == varlen.VARLEN_ATTENTION

    def no_mask(*args, **kwargs):
        raise AssertionError("a packed row needs no mask")

    with torch.no_grad():
        expected = block_mask(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False).logits
        monkeypatch.setattr(varlen, "sdpa_mask", no_mask)
        got = per_sequence(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False).logits
    assert torch.allclose(got, expected, atol=1e-5)


def test_flash_varlen_call_hands_the_kernel_the_packed_rows_bounds(monkeypatch):
    """The flash path's layout on the CPU, with a stand-in kernel that reads only what flash
    attention's varlen API gives it ([N, heads, d] states, int32 cumulative bounds)."""
    import torch.nn.functional as F

    import hetprof.runtime.varlen_attention as varlen

    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, softmax_scale, causal):
        assert cu_q.dtype == torch.int32 and torch.equal(cu_q, cu_k) and max_q == max_k and causal
        assert max_q == int((cu_q[1:] - cu_q[:-1]).max())
        parts = [F.scaled_dot_product_attention(q[a:b].transpose(0, 1), k[a:b].transpose(0, 1),
                                                v[a:b].transpose(0, 1), is_causal=True, scale=softmax_scale,
                                                enable_gqa=True).transpose(0, 1)
                 for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True)]
        return torch.cat(parts)

    monkeypatch.setattr(varlen, "flash_attn_varlen_func", kernel)
    gen = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(1, h, 23, 8, generator=gen) for h in (4, 2, 2))
    positions = torch.cat([torch.arange(n) for n in (5, 11, 7)])[None]
    module = torch.nn.Module().eval()
    loop, _ = varlen.varlen_attention_forward(module, query, key, value, None, scaling=0.3, position_ids=positions)
    flash = varlen.flash_varlen(query, key, value, varlen.sequence_starts(positions), 0.0, 0.3)
    assert flash.shape == loop.shape == (1, 23, 4, 8) and torch.allclose(flash, loop, atol=1e-6)


@pytest.mark.gpu
def test_flash_varlen_kernel_equals_the_per_sequence_loop_on_a_gpu(monkeypatch):
    import hetprof.runtime.varlen_attention as varlen

    if varlen.flash_attn_varlen_func is None:
        pytest.skip("flash-attn is not installed (a GPU build's package)")
    if not torch.cuda.is_available():
        pytest.skip("flash attention's varlen kernel needs a CUDA GPU")
    batch = ragged_batch()
    packed = pack(batch.input_ids, batch.attention_mask)
    model = build_causal_lm("tiny", seed=0).eval().to("cuda", torch.bfloat16)
    ids, positions = packed.input_ids.cuda(), packed.position_ids.cuda()
    with torch.no_grad():
        flash = model(input_ids=ids, position_ids=positions, use_cache=False).logits.float()
        monkeypatch.setattr(varlen, "flash_attn_varlen_func", None)  # the per-sequence SDPA loop
        loop = model(input_ids=ids, position_ids=positions, use_cache=False).logits.float()
    assert torch.allclose(flash, loop, atol=3e-2, rtol=3e-2)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 300), min_size=3, max_size=40),
       shares=st.lists(st.floats(0.05, 1.0), min_size=1, max_size=3))
def test_token_shares_cut_consecutive_slices_near_each_replicas_token_share(lengths, shares):
    slices = token_share_slices(lengths, shares)
    assert [s.start for s in slices[1:]] == [s.stop for s in slices[:-1]] and slices[-1].stop == len(lengths)
    assert all(s.stop - s.start >= 1 for s in slices)
    running = [0]
    for n in lengths:
        running.append(running[-1] + n)
    target = 0.0
    for k, cut in enumerate(s.stop for s in slices[:-1]):
        target += running[-1] * shares[k] / sum(shares)
        lo, hi = slices[k].start + 1, len(lengths) - (len(shares) - k - 1)
        best = min(range(lo, hi + 1), key=lambda c: abs(running[c] - target))
        assert abs(running[cut] - target) == abs(running[best] - target)  # no cut in reach comes closer


def test_priced_pass_records_packed_work_as_its_average_pack():
    mask = ragged_batch().attention_mask  # 8 rows, 72 wide, lengths 43..64 and short ones
    lengths = mask.sum(1)
    assert priced_pass(mask, None) == (8, 72, 1.0)
    assert priced_pass(mask, None, groups=2) == (4, 72, 1.0)
    rows, tokens, packs = priced_pass(mask, 80)
    m = micro_batch_count(lengths.tolist(), 80)  # 3 packs of the 8 rows: the passes the run made
    assert m == 3 and packs == 3.0
    mean = float(lengths.float().mean())
    # the average pack, 8/3 rows: recorded as 3 rows holding a third of the batch's tokens
    assert rows == 3 and tokens == round(mean * 8 / 9)
    assert priced_pass(mask, 80, groups=2, passes=2.0) == (2, round(mean), 2.0)  # 4 rows in 2 packs
    assert priced_pass(mask, 80, groups=2, passes=3.0) == (1, round(mean * 4 / 3), 3.0)
    # a batch a few tokens off the plan's mean length is recorded at the plan's (its profiled shape)
    assert priced_pass(mask, 80, groups=2, passes=2.0, priced_length=mean * 1.08)[1] == round(mean * 1.08)
    assert priced_pass(mask, 80, groups=2, passes=2.0, priced_length=mean * 1.5)[1] == round(mean)  # far off


def test_a_packed_steps_record_prices_back_to_the_step_it_took():
    """A run records a packed step as one pack's pass plus the step's one optimizer step (the unit
    a profiled training row times); the planner prices `packs` such passes and one step, so the
    record priced back is the measured step. Hand-computed: 2 steps of 0.5 s, 0.05 s of Adam each,
    2.5 packs: one pack = 0.45 / 2.5 + 0.05 = 0.23 s."""
    from hetprof.executor.records.iteration_report import train_timing
    from hetprof.planner.passtime import packed_seconds

    row = train_timing(12, 70, 1.0, ppo_epochs=1, mini_batches=2, packs=2.5, optimizer_seconds=0.1)
    assert (row["batch"], row["steps"], row["packs"]) == (6, 2, 2.5)
    assert row["seconds"] == pytest.approx(0.23)
    assert packed_seconds([(row["seconds"], row["packs"])], 0.05) == pytest.approx(0.5)
    padded = train_timing(12, 70, 1.0, ppo_epochs=1, mini_batches=2, optimizer_seconds=0.1)
    assert padded["seconds"] == pytest.approx(0.5) and padded["packs"] == 1.0
