"""Advantage estimators against hand computations, and the clipped/decoupled losses term by term."""

from __future__ import annotations

import math

import pytest
import torch

from hetprof.errors import SpecError
from hetprof.executor.algorithms import (
    Algorithm,
    AlgorithmConfig,
    RLBatch,
    available_algorithms,
    get_algorithm,
    register_algorithm,
)
from hetprof.executor.algorithms.advantages import gae, group_normalised, terminal_rewards, whiten
from hetprof.executor.algorithms.base import k3_kl


def test_gae_matches_hand_computation():
    # Row 0: response in columns 1..3, reward 1 at its end. Row 1: columns 2..4 with per-token rewards.
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]])
    values = torch.tensor([[9.0, 0.5, 0.4, 0.3, 9.0], [9.0, 9.0, 1.0, 2.0, 3.0]])  # 9s are ignored
    rewards = torch.tensor([[0.0, 0, 0, 1.0, 0], [0, 0, 0.5, 0, -1.0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # δ3 = 1 - .3 = .7; δ2 = .9*.3 - .4 = -.13; δ1 = .9*.4 - .5 = -.14; A_t = δ_t + .72 A_{t+1}
    a3 = 0.7
    a2 = -0.13 + 0.72 * a3
    a1 = -0.14 + 0.72 * a2
    assert adv[0].tolist() == pytest.approx([0, a1, a2, a3, 0], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([0, a1 + 0.5, a2 + 0.4, a3 + 0.3, 0], abs=1e-6)
    b4 = -1 - 3.0
    b3 = 0.9 * 3 - 2 + 0.72 * b4
    b2 = 0.5 + 0.9 * 2 - 1 + 0.72 * b3
    assert adv[1].tolist() == pytest.approx([0, 0, b2, b3, b4], abs=1e-6)


def test_gae_with_gamma_lam_one_is_reward_to_go_minus_value():
    mask = torch.tensor([[1, 1, 1, 1]])
    values = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    rewards = terminal_rewards(torch.tensor([2.0]), mask)
    adv, ret = gae(rewards, values, mask, 1.0, 1.0)
    assert ret.tolist()[0] == pytest.approx([2.0] * 4)
    assert adv.tolist()[0] == pytest.approx([1.9, 1.8, 1.7, 1.6])


def test_terminal_rewards_land_on_the_last_response_token():
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    out = terminal_rewards(torch.tensor([1.0, 5.0, -2.0]), mask)
    assert out.tolist() == [[0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, -2]]


def test_group_normalised_advantages_sum_to_zero_per_group():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(24, generator=gen)
    rewards[8:12] = 0.7  # a group whose responses all scored the same
    for scale in (True, False):
        adv = group_normalised(rewards, 4, scale_std=scale)
        sums = adv.view(-1, 4).sum(1)
        assert torch.allclose(sums, torch.zeros(6), atol=1e-5)
        assert torch.isfinite(adv).all() and adv[8:12].abs().max() == 0
    adv = group_normalised(rewards, 4)
    stds = adv.view(-1, 4).std(1, unbiased=False)
    assert torch.allclose(stds[[0, 1, 3, 4, 5]], torch.ones(5), atol=1e-3)
    with pytest.raises(ValueError, match="groups of 5"):
        group_normalised(rewards, 5)


def test_grpo_advantages_cover_response_tokens_only():
    batch = _batch(rewards=[1.0, 0.0, 0.0, 0.0], group_size=2)
    get_algorithm("grpo")().advantages(batch)
    assert batch.advantages[2:].abs().sum() == 0  # a group with equal rewards learns nothing
    assert batch.advantages[0, 2] == pytest.approx(1.0, abs=1e-4)
    assert batch.advantages[1, 2] == pytest.approx(-1.0, abs=1e-4)
    assert (batch.advantages * (1 - batch.mask)).abs().sum() == 0


def test_whiten():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    w = whiten(x, mask)
    assert w[0, 3] == 0
    assert float(w[0, :3].mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(w[0, :3].std(unbiased=False)) == pytest.approx(1.0, abs=1e-4)


def test_k3_is_zero_at_equality_positive_elsewhere_and_flat_at_zero():
    ref = torch.tensor([-1.0, -2.0, -0.5])
    lp = ref.clone().requires_grad_(True)
    kl = k3_kl(lp, ref)
    assert torch.allclose(kl, torch.zeros(3))
    kl.sum().backward()
    assert torch.allclose(lp.grad, torch.zeros(3))
    assert (k3_kl(ref + torch.tensor([0.3, -0.3, 1.0]), ref) > 0).all()


def _batch(rewards, group_size=1, T=5, prompt=2):
    b = len(rewards)
    ids = torch.arange(b * T).view(b, T) % 60 + 3
    attn = torch.ones(b, T, dtype=torch.long)
    mask = torch.zeros(b, T - 1)
    mask[:, prompt - 1:] = 1.0  # responses fill columns prompt-1 .. T-2 of the shifted space
    return RLBatch(input_ids=ids, attention_mask=attn, mask=mask, rewards=torch.tensor(rewards),
                   behaviour_logprobs=torch.full((b, T - 1), -1.0), group_size=group_size)


def _with_adv(value: float, **kw):
    batch = _batch([0.0, 0.0], **kw)
    batch.advantages = torch.full_like(batch.mask, value) * batch.mask
    return batch


def test_loss_at_ratio_one_is_minus_mean_advantage_and_nothing_clips():
    algo = get_algorithm("grpo")(kl_coef=0.0)
    batch = _with_adv(0.5)
    lp = batch.behaviour_logprobs.clone().requires_grad_(True)
    loss, stats = algo.loss(batch, lp)
    assert float(loss.detach()) == pytest.approx(-0.5)
    assert stats["clip_frac"] == 0 and stats["approx_kl"] == 0 and stats["ratio_mean"] == pytest.approx(1)
    loss.backward()
    n = batch.mask.sum()
    assert torch.allclose(lp.grad, -0.5 * batch.mask / n)  # d/dθ of -A·exp(lp - old) at ratio 1


@pytest.mark.parametrize("adv, ratio, expect_loss, expect_clip", [
    (1.0, 1.5, -1.2, 1.0),    # good token pushed too far: clipped, no gradient
    (-1.0, 1.5, 1.5, 0.0),    # bad token made more likely: the unclipped (worse) term is kept
    (-1.0, 0.5, 0.8, 1.0),    # bad token pushed away too far: clipped at 1 - ε
    (1.0, 0.5, -0.5, 0.0),
])
def test_clipping(adv, ratio, expect_loss, expect_clip):
    algo = get_algorithm("grpo")(kl_coef=0.0)
    batch = _with_adv(adv)
    lp = (batch.behaviour_logprobs + math.log(ratio)).requires_grad_(True)
    loss, stats = algo.loss(batch, lp)
    assert float(loss.detach()) == pytest.approx(expect_loss, abs=1e-5)
    assert stats["clip_frac"] == pytest.approx(expect_clip)
    loss.backward()
    assert (lp.grad.abs().sum() == 0) == bool(expect_clip)


def test_clip_higher():
    algo = get_algorithm("grpo")(kl_coef=0.0, clip_eps_high=0.28)
    batch = _with_adv(1.0)
    loss, stats = algo.loss(batch, batch.behaviour_logprobs + math.log(1.25))
    assert float(loss.detach()) == pytest.approx(-1.25, abs=1e-5) and stats["clip_frac"] == 0


def test_decoupled_objective_weights_by_capped_behaviour_ratio():
    algo = get_algorithm("grpo")(kl_coef=0.0, behaviour_cap=5.0)
    batch = _with_adv(1.0)
    # The trainer's proximal policy is 10x (capped to 5) or 2x as likely as the stale behaviour policy.
    prox = batch.behaviour_logprobs.clone()
    prox[0] += math.log(10.0)
    prox[1] += math.log(2.0)
    batch.proximal_logprobs = prox
    loss, stats = algo.loss(batch, prox.clone())  # current == proximal: ratio 1, clipping relative to prox
    assert stats["clip_frac"] == 0 and stats["ratio_mean"] == pytest.approx(1.0)
    assert float(loss.detach()) == pytest.approx(-(5.0 + 2.0) / 2, abs=1e-5)
    assert stats["behaviour_capped_frac"] == pytest.approx(0.5)
    uncapped = get_algorithm("grpo")(kl_coef=0.0, behaviour_cap=None)
    assert float(uncapped.loss(batch, prox.clone())[0].detach()) == pytest.approx(-(10.0 + 2.0) / 2, abs=1e-4)


def test_kl_goes_into_grpo_loss_but_into_ppo_rewards():
    batch = _with_adv(0.0)
    batch.ref_logprobs = batch.behaviour_logprobs - 0.5
    lp = batch.behaviour_logprobs.clone()
    expected_kl = math.exp(-0.5) + 0.5 - 1
    loss, stats = get_algorithm("grpo")(kl_coef=0.1).loss(batch, lp)
    assert stats["kl"] == pytest.approx(expected_kl, abs=1e-6)
    assert float(loss.detach()) == pytest.approx(0.1 * expected_kl, abs=1e-6)
    loss, stats = get_algorithm("ppo")(kl_coef=0.1).loss(batch, lp)
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-7) and stats["kl"] == pytest.approx(expected_kl, abs=1e-6)
    # PPO's reward penalty: -kl_coef·(log π - log π_ref) per token, before GAE.
    ppo = get_algorithm("ppo")(kl_coef=0.1, gamma=1.0, lam=1.0, whiten_advantages=False)
    batch.values = torch.zeros_like(batch.mask)
    ppo.advantages(batch)
    n_resp = int(batch.mask[0].sum())
    assert float(batch.returns[0, 1]) == pytest.approx(0.0 - 0.1 * 0.5 * n_resp, abs=1e-5)


def test_entropy_bonus_and_denominator():
    batch = _with_adv(0.0)
    ent = torch.full_like(batch.mask, 2.0)
    loss, stats = get_algorithm("grpo")(kl_coef=0.0, entropy_coef=0.01).loss(batch, batch.behaviour_logprobs, ent)
    assert stats["entropy"] == pytest.approx(2.0) and float(loss.detach()) == pytest.approx(-0.02)
    loss2, _ = get_algorithm("grpo")(kl_coef=0.0, entropy_coef=0.01).loss(
        batch, batch.behaviour_logprobs, ent, denominator=batch.mask.sum() * 2)
    assert float(loss2.detach()) == pytest.approx(-0.01)


def test_ppo_value_loss_clipping():
    ppo = get_algorithm("ppo")(value_clip=0.2)
    batch = _with_adv(0.0)
    batch.values = torch.zeros_like(batch.mask)
    batch.returns = torch.ones_like(batch.mask)
    new = torch.full_like(batch.mask, 0.5, requires_grad=True)
    loss, stats = ppo.value_loss(batch, new)
    assert float(loss.detach()) == pytest.approx(0.5 * (1 - 0.2) ** 2)  # the clipped error is the larger one
    assert stats["value_clip_frac"] == pytest.approx(1.0)
    loss.backward()
    assert new.grad.abs().sum() == 0
    unclipped = get_algorithm("ppo")(value_clip=None)
    assert float(unclipped.value_loss(batch, new)[0].detach()) == pytest.approx(0.5 * 0.25)
    with pytest.raises(ValueError, match="critic's values"):
        ppo.advantages(_batch([1.0, 0.0]))
    with pytest.raises(NotImplementedError):
        get_algorithm("grpo")().value_loss(batch, new)


def test_registry_and_config_errors():
    assert {"grpo", "ppo"} <= set(available_algorithms())
    assert get_algorithm("GRPO") is get_algorithm("grpo")
    assert get_algorithm("ppo").needs_critic and not get_algorithm("grpo").needs_critic
    assert get_algorithm("grpo")().needs_reference and not get_algorithm("grpo")(kl_coef=0).needs_reference
    with pytest.raises(SpecError, match="algorithm"):
        get_algorithm("reinforce-unknown")
    with pytest.raises(SpecError, match="algorithm.clip_eps"):
        AlgorithmConfig(clip_eps=-1)
    with pytest.raises(SpecError, match="algorithm.behaviour_cap"):
        get_algorithm("grpo")(behaviour_cap=0.5)

    @register_algorithm("test-reinforce")
    class Reinforce(Algorithm):
        def advantages(self, batch):
            batch.advantages = batch.rewards[:, None] * batch.mask
            return batch

    assert get_algorithm("test-reinforce") is Reinforce
    batch = Reinforce().advantages(_batch([2.0]))
    assert float(batch.advantages.max()) == 2.0
