"""The `math` reward: answer equivalence through math-verify, next to the exact-match `arithmetic` one."""

from __future__ import annotations

import threading

import pytest

from hetprof.executor.runners.rewards import available_rewards, get_reward


@pytest.mark.parametrize(("response", "answer", "score"), [
    ("so the answer is \\boxed{\\frac{1}{2}}", "1/2", 1.0),
    ("0.5", "\\frac12", 1.0),                     # a bare LaTeX reference is read as math
    ("$\\sqrt{8}$", "2\\sqrt{2}", 1.0),
    ("#### 12", "12", 1.0),
    ("I think it is 3", "4", 0.0),
    ("", "1", 0.0),
    ("7", None, 0.0),                             # no reference: nothing to verify
])
def test_math_reward_scores_equivalent_answers(response, answer, score):
    assert get_reward("math")(["q"], [response], [answer]) == [score]


def test_math_reward_differs_from_exact_match_where_it_should():
    assert "math" in available_rewards() and "arithmetic" in available_rewards()
    exact = get_reward("arithmetic", format_bonus=0.0)
    assert exact(["q"], ["\\frac{1}{2}"], ["0.5"]) == [0.0] and get_reward("math")(["q"], ["\\frac{1}{2}"], ["0.5"]) == [1.0]


def test_math_reward_works_off_the_main_thread():
    got: list = []
    worker = threading.Thread(target=lambda: got.append(get_reward("math", correct=2.0)(["q"], ["#### 9"], ["9"])))
    worker.start()
    worker.join()
    assert got == [[2.0]]
