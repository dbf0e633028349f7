"""The validation split's evaluator: when it runs, that it asks for greedy answers in the plan's batch,
and how it scores them (a scripted engine answers; no worker starts)."""

from __future__ import annotations

import torch

from hetprof.executor.backends.base import Rollout
from hetprof.executor.loop.evaluation import Validator
from hetprof.executor.models.tokenizer import CharTokenizer
from hetprof.executor.prompts.data import Prompt
from hetprof.executor.runners.rewards import get_reward
from hetprof.specs import WorkloadSpec


class ScriptedEngine:
    """Answers each prompt with the text `answers` maps it to, recording how it was asked."""

    def __init__(self, tokenizer: CharTokenizer, answers: dict[str, str]):
        self.tokenizer = tokenizer
        self.answers = {tuple(tokenizer.encode(p)): a for p, a in answers.items()}
        self.calls: list[tuple[int, int, float]] = []

    def generate(self, prompt_ids, max_new_tokens, temperature=1.0, top_p=1.0, generator=None) -> Rollout:
        self.calls.append((len(prompt_ids), max_new_tokens, temperature))
        replies = [self.tokenizer.encode(self.answers[tuple(p)], add_bos=False) + [self.tokenizer.eos_id]
                   for p in prompt_ids]
        width, span = max(len(p) for p in prompt_ids), max(len(r) for r in replies)
        ids = torch.zeros(len(replies), width + span, dtype=torch.long)
        for row, reply in enumerate(replies):
            ids[row, width:width + len(reply)] = torch.tensor(reply)
        lengths = torch.tensor([len(r) for r in replies])
        zeros = torch.zeros_like(ids)
        return Rollout(ids, zeros, zeros, zeros.float(), lengths, width)


def _workload(**data) -> WorkloadSpec:
    return WorkloadSpec.from_dict({"models": {"actor": "tiny"}, "prompt_len": {"mean": 8},
                                   "response_len": {"mean": 4, "max": 6}, "prompts_per_step": 1,
                                   "responses_per_prompt": 2, "data": {"validation_size": 1, **data}})


def test_due_every_n_iterations_and_after_the_last():
    v = Validator([Prompt("1+1=", "2")], get_reward("arithmetic"), CharTokenizer(), _workload(eval_every=3), 7)
    assert [i for i in range(1, 8) if v.due(i)] == [3, 6, 7]
    never = Validator([Prompt("1+1=", "2")], get_reward("arithmetic"), CharTokenizer(), _workload(), 7)
    assert not any(never.due(i) for i in range(1, 8))


def test_greedy_answers_in_the_plans_batch_scored_by_the_reward():
    tok = CharTokenizer()
    prompts = [Prompt(f"{a}+{a}= #### ", str(2 * a)) for a in range(5)]
    right = {p.text: f"#### {p.answer}" for p in prompts[:3]} | {p.text: "#### 9" for p in prompts[3:]}
    engine = ScriptedEngine(tok, right)
    v = Validator(prompts, get_reward("math"), tok, _workload(eval_every=1, eval_prompts=4), 2)
    fields = v.named(v.evaluate(engine))
    # the first eval_prompts (4) only, in batches of sequences_per_step (2), greedy, up to response_len.max
    assert engine.calls == [(2, 6, 0.0), (2, 6, 0.0)]
    assert fields == {"val_reward_mean": 0.75, "val_response_tokens_mean": 7.0, "val_prompts": 4.0}
