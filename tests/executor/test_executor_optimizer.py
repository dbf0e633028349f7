"""The workload's optimizer section reaches the learner: AdamW settings, LR schedule values, grad clip."""

from __future__ import annotations

import math

import pytest
import torch

from hetprof.executor.algorithms.optimizer import build_optimizer, build_scheduler, lr_factor, optimizer_steps
from hetprof.specs import OptimizerParams, WorkloadSpec
from hetprof.specs.loader import from_data


@pytest.mark.parametrize(("schedule", "step", "expected"), [
    ("constant", 0, 0.25), ("constant", 3, 1.0), ("constant", 50, 1.0),  # 4 warm-up steps
    ("linear", 4, 1.0), ("linear", 9, 0.5 + 0.5 * 0.1), ("linear", 14, 0.1), ("linear", 40, 0.1),
    ("cosine", 4, 1.0), ("cosine", 9, 0.1 + 0.9 * 0.5), ("cosine", 14, 0.1),
    ("cosine", 6, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.2))),
])
def test_schedule_values_at_chosen_steps(schedule, step, expected):
    # 15 steps: 4 warm-up, then steps 4..14 decay over 10 intervals to min_lr_ratio 0.1
    assert lr_factor(step, schedule, warmup_steps=4, total_steps=15, min_lr_ratio=0.1) == pytest.approx(expected)


def test_warmup_rises_linearly_from_the_first_step():
    assert [lr_factor(s, "cosine", 4, 100) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]


def test_optimizer_and_scheduler_follow_the_section():
    config = from_data(OptimizerParams, {"betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1,
                                         "lr_schedule": "linear", "warmup_steps": 2, "min_lr_ratio": 0.0})
    model = torch.nn.Linear(3, 1)
    opt = build_optimizer(model.parameters(), 0.01, config)
    group = opt.param_groups[0]
    assert group["betas"] == (0.8, 0.95) and group["eps"] == 1e-6 and group["weight_decay"] == 0.1
    sched = build_scheduler(opt, config, total_steps=6)
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.005, 0.01, 0.01, 0.01 * 2 / 3, 0.01 / 3, 0.0])
    assert build_scheduler(opt, OptimizerParams(), 6) is None  # constant, no warm-up: nothing to step


def test_optimizer_steps_count_epochs_and_mini_batches():
    w = WorkloadSpec.from_dict({"models": {"actor": "tiny"}, "prompt_len": {"mean": 8}, "response_len": {"mean": 4},
                                "ppo_epochs": 2, "mini_batches": 4, "prompts_per_step": 4})
    assert optimizer_steps(w, 10) == 80


def test_learner_honours_the_schedule_and_the_grad_clip():
    from hetprof.executor.algorithms import RLBatch, get_algorithm
    from hetprof.executor.algorithms.learner import Learner
    from hetprof.executor.models.modeling import build_causal_lm

    torch.manual_seed(0)
    model = build_causal_lm("tiny", seed=0)
    config = OptimizerParams(lr_schedule="cosine", warmup_steps=1, grad_clip=1e-3)
    opt = build_optimizer(model.parameters(), 0.1, config)
    learner = Learner(model, opt, get_algorithm("grpo")(kl_coef=0.0), mini_batches=2,
                      lr_scheduler=build_scheduler(opt, config, total_steps=4), max_grad_norm=config.max_grad_norm)
    ids = torch.randint(4, 60, (4, 6))
    mask = torch.zeros(4, 5, dtype=torch.long)
    mask[:, 2:] = 1
    batch = RLBatch(input_ids=ids, attention_mask=torch.ones_like(ids), mask=mask,
                    rewards=torch.tensor([1.0, 0.0, 0.5, 0.2]), behaviour_logprobs=torch.full((4, 5), -4.0),
                    group_size=4)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    stats = learner.update(batch)
    # two optimizer steps: warm-up (lr × 1), then cosine from 1 at step 1 towards 0 at step 3
    assert learner.steps == 2 and stats["lr"] == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi / 2)))
    moved = math.sqrt(sum(float((p.detach() - before[n]).pow(2).sum()) for n, p in model.named_parameters()))
    assert stats["grad_norm"] > 1e-3  # the norm before clipping is reported
    # AdamW's first steps move each weight by about lr whatever the gradient's scale; clipping is
    # checked through the gradient itself: after the last step its global norm was cut to 1e-3
    total = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters() if p.grad is not None))
    assert total == pytest.approx(1e-3, rel=1e-3) and moved > 0
