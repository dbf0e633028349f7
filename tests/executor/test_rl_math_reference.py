"""The RL quantities against reference formulas written independently, in float64 numpy, from the papers.

Each reference below is the paper's formula, not a port of the project's code:
- GRPO advantage (DeepSeekMath, Shao et al. 2024, §4.1.2): Â_i = (r_i − mean(r)) / std(r), every token of
  response i. Deliberate choices named here: the *population* std (÷n; TRL's GRPOTrainer uses torch's
  default ÷(n−1)), eps = 1e-6 added to the std, and a group of equal rewards gets exactly 0.
- Decoupled PPO-clip (AReaL, Fu et al. 2025, eq. 5): −min(w, cap)·min(r·A, clip(r, 1−ε, 1+ε_high)·A),
  r = π_θ/π_prox, w = π_prox/π_behav; classic PPO-clip (Schulman et al. 2017) when π_prox = π_behav.
- KL to the reference: Schulman's k3 estimator exp(q) − q − 1 with q = log π_ref − log π_θ (GRPO puts it in
  the loss with weight β; PPO subtracts β·(log π − log π_ref) from the token reward, Ouyang et al. 2022).
- Entropy: −Σ_v p_v log p_v of softmax(logits / T).
- GAE (Schulman et al. 2016): δ_t = r_t + γV_{t+1} − V_t, A_t = Σ_l (γλ)^l δ_{t+l}, V = 0 past the end.
- Clipped value loss (as in OpenAI baselines / verl): ½·max((V − R)², (V_old + clip(V − V_old, ±c) − R)²).
- Token-mean loss over data-parallel replicas: the averaged gradient equals the global token mean.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetprof.executor.algorithms import RLBatch, get_algorithm
from hetprof.executor.algorithms.advantages import gae, group_normalised, terminal_rewards
from hetprof.executor.algorithms.base import k3_kl
from hetprof.executor.algorithms.replicas import replica_denominators
from hetprof.runtime.packedpass import entropy_from_logits, logits_to_logprobs

RNG = np.random.default_rng(20261124)


def ref_group_advantages(rewards: np.ndarray, group: int, scale_std: bool = True) -> np.ndarray:
    out = np.zeros_like(rewards, dtype=np.float64)
    for g in range(0, len(rewards), group):
        r = rewards[g:g + group].astype(np.float64)
        if np.all(r == r[0]):
            continue
        centred = r - r.mean()
        out[g:g + group] = centred / (r.std() + 1e-6) if scale_std and group > 1 else centred
    return out


def ref_gae(rewards: np.ndarray, values: np.ndarray, mask: np.ndarray, gamma: float, lam: float) -> np.ndarray:
    adv = np.zeros_like(values, dtype=np.float64)
    for b in range(values.shape[0]):
        cols = np.flatnonzero(mask[b])
        for t in cols:
            total = 0.0
            for lag, u in enumerate(c for c in cols if c >= t):
                v_next = values[b, u + 1] if u + 1 in cols else 0.0
                delta = rewards[b, u] + gamma * v_next - values[b, u]
                total += (gamma * lam) ** lag * delta
            adv[b, t] = total
    return adv


def ref_policy_loss(lp, prox, behav, adv, mask, eps, eps_high, cap, kl_coef=0.0, ref=None):
    ratio = np.exp(lp - prox)
    per_token = -np.minimum(ratio * adv, np.clip(ratio, 1 - eps, 1 + eps_high) * adv)
    per_token = np.minimum(np.exp(prox - behav), cap) * per_token
    if kl_coef:
        q = ref - lp
        per_token = per_token + kl_coef * (np.exp(q) - q - 1)
    return (per_token * mask).sum() / max(mask.sum(), 1.0)


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


@pytest.mark.parametrize("scale_std", [True, False])
def test_group_advantages_match_deepseekmath(scale_std):
    rewards = RNG.normal(size=32).astype(np.float32)
    rewards[8:16] = 1.2       # all equal: float32's mean of eight 1.2 is one ulp off 1.2
    rewards[16:24] = rewards[16:24].round()
    got = group_normalised(_t(rewards), 8, scale_std=scale_std).double().numpy()
    np.testing.assert_allclose(got, ref_group_advantages(rewards, 8, scale_std), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("value", [1.2, 0.1, -3.7, 1e-3, 0.0])
def test_a_group_of_equal_rewards_gets_exactly_zero(value):
    rewards = torch.full((8,), value, dtype=torch.float32)
    assert torch.equal(group_normalised(rewards, 8), torch.zeros(8))
    batch = RLBatch(input_ids=torch.zeros(8, 5, dtype=torch.long), attention_mask=torch.ones(8, 5),
                    mask=torch.ones(8, 4), rewards=rewards, behaviour_logprobs=torch.zeros(8, 4), group_size=8)
    get_algorithm("grpo")(kl_coef=0.0).advantages(batch)
    assert torch.equal(batch.advantages, torch.zeros(8, 4))


def test_gae_matches_schulman():
    mask = np.zeros((4, 9))
    for b, (lo, hi) in enumerate([(2, 9), (0, 5), (3, 4), (1, 8)]):
        mask[b, lo:hi] = 1
    values = RNG.normal(size=mask.shape) * mask
    token_rewards = terminal_rewards(_t(RNG.normal(size=4)), _t(mask)).double().numpy()
    token_rewards += RNG.normal(size=mask.shape) * 0.1 * mask  # a KL penalty lands on every token
    for gamma, lam in [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)]:
        adv, ret = gae(_t(token_rewards), _t(values), _t(mask), gamma, lam)
        expect = ref_gae(token_rewards, values, mask, gamma, lam)
        np.testing.assert_allclose(adv.double().numpy(), expect, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ret.double().numpy(), (expect + values) * mask, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_decoupled_clipped_loss_matches_areal(kl_coef):
    shape = (6, 10)
    mask = (RNG.random(shape) < 0.7).astype(np.float64)
    behav = RNG.normal(-2.0, 0.5, shape)
    prox = behav + RNG.normal(0, 0.6, shape)       # stale samples: π_prox far from π_behav
    lp = prox + RNG.normal(0, 0.3, shape)          # the ratio leaves [1−ε, 1+ε_high] often
    adv = RNG.normal(size=shape)
    ref = lp + RNG.normal(0, 0.2, shape)
    algo = get_algorithm("grpo")(kl_coef=kl_coef, clip_eps=0.2, clip_eps_high=0.28, behaviour_cap=2.0)
    batch = RLBatch(input_ids=torch.zeros(6, 11, dtype=torch.long), attention_mask=torch.ones(6, 11),
                    mask=_t(mask), rewards=torch.zeros(6), behaviour_logprobs=_t(behav),
                    proximal_logprobs=_t(prox), ref_logprobs=_t(ref), advantages=_t(adv))
    loss, stats = algo.loss(batch, _t(lp))
    expect = ref_policy_loss(lp, prox, behav, adv, mask, 0.2, 0.28, 2.0, kl_coef, ref)
    assert float(loss) == pytest.approx(expect, rel=1e-5, abs=1e-6)
    q = ref - lp
    assert stats["kl"] == pytest.approx(((np.exp(q) - q - 1) * mask).sum() / mask.sum(), rel=1e-5)
    assert stats["behaviour_weight_mean"] == pytest.approx(
        (np.minimum(np.exp(prox - behav), 2.0) * mask).sum() / mask.sum(), rel=1e-5)


def test_k3_and_entropy_and_logprobs_match_their_definitions():
    logits = RNG.normal(size=(3, 7, 11)) * 3
    targets = RNG.integers(0, 11, size=(3, 7))
    for temperature in (1.0, 0.7):
        z = logits / temperature
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        got = logits_to_logprobs(_t(logits), torch.tensor(targets), temperature).double().numpy()
        np.testing.assert_allclose(got, np.take_along_axis(logp, targets[..., None], -1)[..., 0], atol=1e-5)
        ent = entropy_from_logits(_t(logits), temperature).double().numpy()
        np.testing.assert_allclose(ent, -(np.exp(logp) * logp).sum(-1), rtol=1e-5, atol=1e-5)
    lp, ref = RNG.normal(size=50), RNG.normal(size=50)
    np.testing.assert_allclose(k3_kl(_t(lp), _t(ref)).double().numpy(),
                               np.exp(ref - lp) - (ref - lp) - 1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stale", [False, True])
def test_ppo_kl_penalty_and_clipped_value_loss_match_their_definitions(stale):
    """The KL reward penalty is β·(log π − log π_ref) with π the policy being updated: π_prox when the
    batch carries it (async: the generator's π_behav is versions behind), else π_behav."""
    b, t = 4, 6
    mask = np.ones((b, t))
    mask[1, :2] = 0
    values, lp, ref = RNG.normal(size=(b, t)), RNG.normal(-1, 0.3, (b, t)), RNG.normal(-1, 0.3, (b, t))
    prox = lp + RNG.normal(0, 0.3, (b, t)) if stale else None
    rewards = RNG.normal(size=b)
    algo = get_algorithm("ppo")(kl_coef=0.1, gamma=1.0, lam=0.95, whiten_advantages=False, value_clip=0.2)
    batch = RLBatch(input_ids=torch.zeros(b, t + 1, dtype=torch.long), attention_mask=torch.ones(b, t + 1),
                    mask=_t(mask), rewards=_t(rewards), behaviour_logprobs=_t(lp), ref_logprobs=_t(ref),
                    proximal_logprobs=None if prox is None else _t(prox), values=_t(values))
    algo.advantages(batch)
    policy = lp if prox is None else prox
    token_rewards = terminal_rewards(_t(rewards), _t(mask)).double().numpy() - 0.1 * (policy - ref) * mask
    expect = ref_gae(token_rewards, values * mask, mask, 1.0, 0.95)
    np.testing.assert_allclose(batch.advantages.double().numpy(), expect, rtol=1e-4, atol=1e-5)
    new_values = values + RNG.normal(0, 0.5, (b, t))
    returns = batch.returns.double().numpy()
    clipped = values * mask + np.clip(new_values - values * mask, -0.2, 0.2)
    per_token = 0.5 * np.maximum((new_values - returns) ** 2, (clipped - returns) ** 2)
    loss, _ = algo.value_loss(batch, _t(new_values))
    assert float(loss) == pytest.approx((per_token * mask).sum() / mask.sum(), rel=1e-5)


@pytest.mark.parametrize("shares", [[1, 0], [3, 1], [0, 5, 2], [1]])
def test_replica_denominators_give_the_global_token_mean(shares):
    """Each replica divides its token sum by its denominator; averaging the replicas' losses (what DP
    does to gradients) must give the single-process token mean over all tokens — including one token
    over two replicas, where flooring after the division gave a half-size update."""
    per_token = [RNG.normal(size=n) for n in shares]
    (denom,) = replica_denominators(torch.tensor([float(sum(shares))]), len(shares))
    averaged = np.mean([x.sum() / float(denom) for x in per_token])
    assert averaged == pytest.approx(np.concatenate(per_token).mean(), rel=1e-6)
    (empty,) = replica_denominators(torch.tensor([0.0]), len(shares))
    assert float(empty) == pytest.approx(1.0 / len(shares))
