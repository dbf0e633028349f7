"""executor/algorithms/learner.py on one process: step counts, π_prox, resumable state, clipping, the critic role."""

from __future__ import annotations

import copy

import pytest
import torch

from hetprof.executor.algorithms import RLBatch, get_algorithm
from hetprof.executor.algorithms.learner import Learner, forward_module
from hetprof.executor.algorithms.replicas import replica_denominators
from hetprof.executor.backends import get_backend
from hetprof.executor.models.logprobs import first_response_column, token_logprobs
from hetprof.executor.models.modeling import build_causal_lm, build_value_model
from hetprof.executor.models.tokenizer import CharTokenizer
from hetprof.executor.prompts.data import PromptSource

pytestmark = pytest.mark.usefixtures("one_thread")

TOK = CharTokenizer()


@pytest.fixture(scope="module")
def batch() -> RLBatch:
    """Eight sampled responses (four prompts × two) of the tiny model, with rewards and advantages."""
    model = build_causal_lm("tiny", seed=0)
    prompts = PromptSource.builtin(4, seed=0, words=False).next_batch()
    rollout = get_backend("hf")(model, TOK).generate([TOK.encode(p.text) for p in prompts for _ in range(2)],
                                                     5, generator=torch.Generator().manual_seed(0))
    out = RLBatch.from_rollout(rollout, torch.tensor([1.0, 0.0, 0.2, 0.0, 1.2, 1.0, 0.0, 0.2]), group_size=2)
    get_algorithm("grpo")().advantages(out)
    return out


def _learner(algorithm: str = "grpo", role: str = "actor", **kw) -> Learner:
    model = build_value_model("tiny", seed=1) if role == "critic" else build_causal_lm("tiny", seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=kw.pop("lr", 0.5))
    return Learner(model, opt, get_algorithm(algorithm)(), role=role, **kw)


def _params(learner: Learner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.model.parameters()]


def test_learner_refuses_what_it_cannot_do(batch):
    model = build_causal_lm("tiny")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="role"):
        Learner(model, opt, get_algorithm("grpo")(), role="judge")
    with pytest.raises(ValueError, match="trains no critic"):
        Learner(model, opt, get_algorithm("grpo")(), role="critic")
    with pytest.raises(ValueError, match=">= 1"):
        Learner(model, opt, get_algorithm("grpo")(), mini_batches=0)
    with pytest.raises(ValueError, match="at least one sequence"):
        Learner(model, opt, get_algorithm("grpo")()).update(batch.select(torch.arange(0)))


def test_one_update_takes_epochs_times_mini_batches_steps(batch):
    learner = _learner(ppo_epochs=2, mini_batches=3, micro_batches=2)
    stats = learner.update(copy.deepcopy(batch))
    assert learner.steps == 6 and learner.updates == 1 and stats["optimizer_steps"] == 6.0
    assert stats["micro_batches"] == 2.0 and stats["lr"] == 0.5
    assert stats["reward_mean"] == pytest.approx(float(batch.rewards.mean()))
    assert stats["grad_norm"] > 0 and stats["update_seconds"] >= stats["optimizer_seconds"] > 0
    learner.update(copy.deepcopy(batch))
    assert learner.steps == 12 and learner.updates == 2


def test_proximal_logprobs_are_the_policy_before_the_update_and_leave_the_mode_alone(batch):
    learner = _learner()
    learner.model.train()
    before = learner.proximal_logprobs(batch)
    assert learner.model.training
    with torch.no_grad():
        want = token_logprobs(learner.model, batch.input_ids, batch.attention_mask,
                              from_column=first_response_column(batch.mask))
    assert torch.equal(before, want)
    work = copy.deepcopy(batch)
    assert work.proximal_logprobs is None
    learner.update(work)  # fills π_prox from the weights it started from
    assert torch.equal(work.proximal_logprobs, before)
    assert not torch.equal(learner.proximal_logprobs(batch), before)  # the update moved the policy
    kept = copy.deepcopy(batch)
    _learner(recompute_proximal=False).update(kept)
    assert kept.proximal_logprobs is None


def test_learner_state_roundtrip_resumes_identically(batch, tmp_path):
    def make():
        model = build_causal_lm("tiny", seed=0)
        return model, Learner(model, torch.optim.Adam(model.parameters(), lr=1e-3), get_algorithm("grpo")(),
                              mini_batches=2, seed=5)

    straight_model, straight = make()
    straight.update(copy.deepcopy(batch))
    straight.update(copy.deepcopy(batch))
    first_model, first = make()
    first.update(copy.deepcopy(batch))
    torch.save({"model": first_model.state_dict(), "learner": first.state_dict()}, tmp_path / "s.pt")
    saved = torch.load(tmp_path / "s.pt", weights_only=True)  # tensors and numbers only
    resumed_model, resumed = make()
    resumed_model.load_state_dict(saved["model"])
    resumed.load_state_dict(saved["learner"])
    assert (resumed.steps, resumed.updates) == (2, 1)
    resumed.update(copy.deepcopy(batch))
    assert resumed.steps == straight.steps == 4
    for a, b in zip(straight_model.parameters(), resumed_model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_gradients_are_clipped_to_the_norm_and_the_schedule_steps_with_the_optimizer(batch):
    clipped = _learner(max_grad_norm=1e-3, lr=1.0)
    start = _params(clipped)
    clipped.update(copy.deepcopy(batch))
    moved = torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(_params(clipped), start, strict=True)))
    assert moved.item() == pytest.approx(1e-3, rel=1e-3)  # SGD at lr 1 moves by the clipped gradient
    free = _learner(max_grad_norm=None)
    assert free.update(copy.deepcopy(batch))["grad_norm"] == 0.0  # not measured when not clipped
    model = build_causal_lm("tiny", seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    learner = Learner(model, opt, get_algorithm("grpo")(), mini_batches=3, lr_scheduler=sched)
    assert learner.update(copy.deepcopy(batch))["lr"] == pytest.approx(1.0 / 4)
    assert learner.state_dict()["lr_scheduler"]["last_epoch"] == 3


def test_the_critic_role_trains_the_value_head(batch):
    work = copy.deepcopy(batch)
    with torch.no_grad():
        work.values = build_value_model("tiny", seed=1)(work.input_ids, work.attention_mask)[:, :-1]
    get_algorithm("ppo")().advantages(work)
    critic = _learner("ppo", role="critic", lr=0.05)
    start = _params(critic)
    stats = critic.update(work)
    assert "value_loss" in stats and "reward_mean" not in stats
    assert any(not torch.equal(a, b) for a, b in zip(_params(critic), start, strict=True))


def test_replica_denominators_floor_at_one_token_before_dividing():
    got = replica_denominators(torch.tensor([10.0, 0.0, 1.0]), 2)
    assert [float(x) for x in got] == [5.0, 0.5, 0.5]
    assert [float(x) for x in replica_denominators(torch.tensor([7.0]), 1)] == [7.0]


def test_forward_module_unwraps_only_ddp():
    model = torch.nn.Linear(2, 2)
    assert forward_module(model) is model
