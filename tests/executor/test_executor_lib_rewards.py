"""Reward parsing, the arithmetic reward, user rewards by import path, and the reward-model scorer."""

from __future__ import annotations

import textwrap

import pytest
import torch

from hetprof.errors import SpecError
from hetprof.executor.models.modeling import build_reward_model
from hetprof.executor.models.tokenizer import CharTokenizer
from hetprof.executor.runners.rewards import (
    RewardModelScorer,
    answers_match,
    get_reward,
    needs_answers,
    parse_final_answer,
    register_reward,
    well_formed,
)

pytestmark = pytest.mark.usefixtures("one_thread")



@pytest.mark.parametrize("text, expected", [
    ("she has 3 + 4 = 7 apples\n#### 7", "7"),
    ("#### 1,234", "1234"),
    ("the answer is 12 not 13", "13"),
    ("#### -5 then 9", "-5"),
    ("7.0", "7"),
    ("2.5 cups", "2.5"),
    ("no number here", None),
    ("", None),
])
def test_parse_final_answer(text, expected):
    assert parse_final_answer(text) == expected


def test_answers_match_is_numeric():
    assert answers_match("7", "7")
    assert answers_match("7", "7.0")
    assert answers_match("1234", "#### 1,234")
    assert not answers_match("7", "8")
    assert not answers_match(None, "8")
    assert not answers_match("7", None)


def test_well_formed():
    assert well_formed("7") and well_formed(" #### 42 ") and well_formed("-3")
    assert not well_formed("7 apples") and not well_formed("") and not well_formed("####")


def test_arithmetic_reward_values():
    reward = get_reward("arithmetic")
    prompts = ["q"] * 5
    responses = ["4", "#### 4", "it is 4", "5", "xyz"]
    assert reward(prompts, responses, ["4"] * 5) == pytest.approx([1.2, 1.2, 1.0, 0.2, 0.0])
    no_bonus = get_reward("arithmetic", format_bonus=0.0)
    assert no_bonus(prompts, responses, ["4"] * 5) == pytest.approx([1, 1, 1, 0, 0])
    assert get_reward("format")(["q"], ["12"], [None]) == [1.0]


def test_user_reward_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent("""
        def length_penalty(prompt, response, answer):
            return -len(response) + (10 if response == answer else 0)

        def batch_scores(prompts, responses, answers):
            return [float(i) for i in range(len(responses))]
        batch_scores.batched = True

        def bad(prompt, response, answer):
            return "high"

        def short(prompts, responses, answers):
            return [1.0]
        short.batched = True

        NOT_CALLABLE = 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = get_reward("my_rewards:length_penalty")
    assert fn(["p", "p"], ["abc", "7"], ["7", "7"]) == [-3.0, 9.0]
    assert get_reward("my_rewards:batch_scores")(["a"] * 3, ["x"] * 3, [None] * 3) == [0.0, 1.0, 2.0]
    with pytest.raises(SpecError, match="finite numbers"):
        get_reward("my_rewards:bad")(["p"], ["r"], [None])
    with pytest.raises(SpecError, match="return 2 scores"):
        get_reward("my_rewards:short")(["p", "p"], ["r", "r"], [None, None])
    with pytest.raises(SpecError, match="callable"):
        get_reward("my_rewards:NOT_CALLABLE")
    with pytest.raises(SpecError, match="define nope"):
        get_reward("my_rewards:nope")
    with pytest.raises(SpecError, match="installed module"):
        get_reward("no_such_module_xyz:f")


def test_user_reward_by_file_path_needs_no_import_path(tmp_path, monkeypatch):
    """`--reward path/file.py:fn` loads the file itself; a bare module name is not looked up in the working
    folder (workers start without it) and its error says to name the file by path."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "myrew.py").write_text(textwrap.dedent("""
        import dataclasses

        @dataclasses.dataclass
        class Weights:  # a dataclass needs its module in sys.modules while the file runs
            exact: float = 2.0

        def score(prompt, response, answer):
            return Weights().exact if response == answer else 0.0
        score.needs_answers = True

        def broken(prompt, response, answer):
            return 1.0
    """))
    (folder / "fails.py").write_text("raise RuntimeError('no key set')\n")
    monkeypatch.chdir(folder)
    fn = get_reward(str(folder / "myrew.py") + ":score")
    assert fn(["p", "p"], ["7", "8"], ["7", "7"]) == [2.0, 0.0]
    assert needs_answers(fn) and not needs_answers(get_reward("./myrew.py:broken"))
    with pytest.raises(SpecError, match=r"--reward \./myrew\.py:score"):
        get_reward("myrew:score")
    with pytest.raises(SpecError, match="existing file"):
        get_reward("./nosuch.py:score")
    with pytest.raises(SpecError, match="define nope"):
        get_reward("./myrew.py:nope")
    with pytest.raises(SpecError, match="fails.py: field 'reward': expected a file that imports, got "
                                        "'RuntimeError: no key set'"):
        get_reward("fails.py:f")


def test_rewards_that_score_against_answers_say_so():
    assert needs_answers(get_reward("arithmetic")) and needs_answers(get_reward("math"))
    assert not needs_answers(get_reward("format"))


def test_unknown_reward_lists_known_ones():
    with pytest.raises(SpecError) as err:
        get_reward("no-such-reward")
    assert "arithmetic" in str(err.value) and "module:function" in str(err.value)


def test_registered_reward():
    @register_reward("test-constant")
    def constant(value: float = 0.5):
        return lambda prompts, responses, answers: [value] * len(responses)

    assert get_reward("test-constant", value=2.0)(["a"], ["b"], [None]) == [2.0]


def test_reward_model_scorer_reads_the_last_real_token():
    tok = CharTokenizer()
    model = build_reward_model("tiny", seed=3).eval()
    scorer = RewardModelScorer(model, tok, micro_batch_size=2)
    prompts, responses = ["1+1=", "2+3= ####", "9-9="], ["2", "5", "0"]
    scores = scorer(prompts, responses, [None] * 3)
    assert len(scores) == 3 and len(set(scores)) == 3  # a random head still separates inputs
    alone = [scorer([p], [r], [None])[0] for p, r in zip(prompts, responses, strict=True)]
    assert scores == pytest.approx(alone, abs=1e-5)  # left padding does not change a score
    # Right padding (rollout layout) reads the same last token as left padding.
    ids = tok.encode("1+1=") + tok.encode("2", add_bos=False) + [tok.eos_id]
    right = torch.tensor([ids + [tok.pad_id] * 3])
    mask = torch.tensor([[1] * len(ids) + [0] * 3])
    assert float(scorer.score_ids(right, mask)[0]) == pytest.approx(scores[0], abs=1e-5)
