"""Reward functions: a registry of rule-based rewards, user functions by import path, a reward model.

Every reward is called on a batch — `reward(prompts, responses, answers) -> list[float]` — because
the reward-model role scores a batch in one forward. User functions are simpler to write per
sample, so `module:function` names a per-sample `f(prompt, response, answer) -> float` (a function
marked `batched = True` receives the lists instead). A user's own file is named by its path,
`path/to/file.py:function`, and loaded from there (workers start without the working folder on
their import path, so a bare module name finds only installed modules). A workload names its reward
as a string, and the string is resolved here, so a shared workload file names code but cannot carry it.

A reward that scores against each prompt's reference answer says so (`needs_answers = True` on the
function): the launcher then refuses a prompt file without answers before any worker starts.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import math
import re
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from hetprof.errors import SpecError
from hetprof.executor.models.tokenizer import Tokenizer
from hetprof.registry import Registry, UnknownName
from hetprof.runtime.generation import pad_left

RewardFn = Callable[[Sequence[str], Sequence[str], Sequence[str | None]], list[float]]
ENTRY_POINT_GROUP = "hetprof.rewards"

# Registered entries are factories (kwargs → batched reward); an entry point names a per-sample
# function like a `module:function` path does, so it is wrapped into a factory (that takes no options).
REWARDS: Registry[Callable[..., RewardFn]] = Registry(
    "reward", ENTRY_POINT_GROUP, check=callable, expected="a callable",
    adapt=lambda name, fn: lambda **_: _batched(fn, name))


def register_reward(name: str) -> Callable[[Callable[[], RewardFn]], Callable[[], RewardFn]]:
    """Register a factory (no arguments) returning a batched reward function."""
    return REWARDS.register(name)


# ---- answer parsing ------------------------------------------------------------------------------
_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
_HASH_ANSWER = re.compile(r"####\s*(" + _NUMBER + ")")
_ANY_NUMBER = re.compile(_NUMBER)
_ONLY_ANSWER = re.compile(r"^\s*(?:####\s*)?" + _NUMBER + r"\s*$")


def parse_final_answer(text: str) -> str | None:
    """The final answer GSM8K-style: the number after "####" if any, else the last number."""
    m = _HASH_ANSWER.search(text)
    if m is not None:
        return _normalise(m.group(1))
    numbers = _ANY_NUMBER.findall(text)
    return _normalise(numbers[-1]) if numbers else None


def _normalise(number: str) -> str:
    number = number.replace(",", "")
    try:
        value = float(number)
    except ValueError:
        return number
    return str(int(value)) if value.is_integer() else repr(value)


def answers_match(predicted: str | None, reference: str | None) -> bool:
    """Numeric equality when both parse as numbers (so "7.0" matches "7"), else exact text."""
    if predicted is None or reference is None:
        return False
    ref = parse_final_answer(reference) or reference.strip()
    try:
        return math.isclose(float(predicted), float(ref), rel_tol=0.0, abs_tol=1e-6)
    except ValueError:
        return predicted.strip() == ref


def well_formed(response: str) -> bool:
    """The response is a final answer and nothing else ("7" or "#### 7"): the format reward's test."""
    return _ONLY_ANSWER.match(response) is not None


@register_reward("arithmetic")
def arithmetic(correct: float = 1.0, format_bonus: float = 0.2) -> RewardFn:
    """Answer match (1.0) plus a small bonus for answering in the expected format.

    The bonus gives a tiny model a gradient before it gets anything right: first it learns to
    answer with a bare number and stop, then which number.
    """

    def reward(prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str | None]) -> list[float]:
        out = []
        for resp, ans in zip(responses, answers, strict=True):
            score = correct if answers_match(parse_final_answer(resp), ans) else 0.0
            out.append(score + (format_bonus if well_formed(resp) else 0.0))
        return out

    reward.needs_answers = True
    return reward


@register_reward("format")
def format_only(bonus: float = 1.0) -> RewardFn:
    """Only the format term (a smoke-test reward that any model can learn in a few steps)."""

    def reward(prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str | None]) -> list[float]:
        return [bonus if well_formed(r) else 0.0 for r in responses]

    return reward


@register_reward("math")
def math_answer(correct: float = 1.0, timeout_s: int = 5) -> RewardFn:
    """Answer equivalence by math-verify, Hugging Face's maintained verifier: the response's final
    answer (boxed, LaTeX or plain) and the reference are parsed to sympy and compared, so `\\frac{1}{2}`,
    `0.5` and `1/2` all match. Its time limits use SIGALRM, which only the main thread may set; off
    the main thread they are left out."""
    try:
        from math_verify import parse, verify
    except ImportError:
        raise SpecError(None, "reward", "the math-verify package for reward 'math' (pip install math-verify)",
                        "not installed") from None

    # Off the main thread it warns on every call that the limit is off; said once in the docstring.
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    def reward(prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str | None]) -> list[float]:
        limit = timeout_s if threading.current_thread() is threading.main_thread() else None
        golds: dict[str, list] = {}
        out = []
        for resp, ans in zip(responses, answers, strict=True):
            if ans is None:
                out.append(0.0)
                continue
            if ans not in golds:  # a bare LaTeX reference ("2\\sqrt{2}") is read as math once given its $...$
                latex = "\\" in ans and "$" not in ans
                golds[ans] = parse(f"${ans}$" if latex else ans, parsing_timeout=limit)
            match = bool(golds[ans]) and verify(golds[ans], parse(resp, parsing_timeout=limit), timeout_seconds=limit)
            out.append(correct if match else 0.0)
        return out

    reward.needs_answers = True
    return reward


def needs_answers(reward: RewardFn) -> bool:
    """Whether `reward` scores against each prompt's reference answer (without one it scores 0)."""
    return bool(getattr(reward, "needs_answers", False))


def is_file_spec(spec: str) -> bool:
    """`path/to/file.py:function` (a file of the user's) rather than `module:function`."""
    where = spec.rpartition(":")[0]
    return where.endswith(".py") or "/" in where


def _from_import_path(spec: str) -> RewardFn:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SpecError(None, "reward", "a registered reward name, 'module:function' or 'path/file.py:function'",
                        spec)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = ""
        if exc.name == module_name.partition(".")[0]:  # the module itself, not one it imports
            hint = f" (a file of yours: name it by path, --reward ./{module_name.replace('.', '/')}.py:{attr})"
        raise SpecError(None, "reward", f"an installed module for {spec!r}{hint}", str(exc)) from None
    return _attribute(module, module_name, attr, spec)


def _from_file(spec: str) -> RewardFn:
    """A function of a Python file, loaded by its path (no sys.path entry is added)."""
    where, _, attr = spec.rpartition(":")
    path = Path(where).expanduser()
    if not attr or not path.is_file():
        raise SpecError(None, "reward", "'path/file.py:function' naming an existing file and a function", spec)
    # its own module name per file, so two files of one name never share a sys.modules entry
    name = f"hetprof_reward_{path.stem}_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]}"
    if name not in sys.modules:
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise SpecError(None, "reward", "a Python source file", spec)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module  # dataclasses and pickling look a module up by name while it runs
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:  # the user's code: its error, one line, named by the file
            del sys.modules[name]
            raise SpecError(str(path), "reward", "a file that imports", f"{type(exc).__name__}: {exc}") from None
    return _attribute(sys.modules[name], str(path), attr, spec)


def _attribute(module: object, module_name: str, attr: str, spec: str) -> RewardFn:
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise SpecError(None, "reward", f"{module_name} to define {attr}", spec)
    if not callable(fn):
        raise SpecError(None, "reward", f"{spec} to be callable", type(fn).__name__)
    return _batched(fn, spec)


def _batched(fn: Callable, name: str) -> RewardFn:
    def reward(prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str | None]) -> list[float]:
        if getattr(fn, "batched", False):
            values = list(fn(prompts, responses, answers))
            if len(values) != len(responses):
                raise SpecError(None, "reward", f"{name} to return {len(responses)} scores", len(values))
        else:
            values = [fn(p, r, a) for p, r, a in zip(prompts, responses, answers, strict=True)]
        return [_as_score(v, name) for v in values]

    reward.needs_answers = needs_answers(fn)
    return reward


def _as_score(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise SpecError(None, "reward", f"{name} to return finite numbers", value)
    return float(value)


def available_rewards() -> list[str]:
    """Every reward that can be asked for by name (besides any `module:function`)."""
    return REWARDS.names()


def get_reward(spec: str, **kwargs) -> RewardFn:
    """A reward by registered name (with factory kwargs), entry point, `path/file.py:function` or
    `module:function` (an installed module)."""
    if spec in REWARDS:
        return REWARDS.get(spec)(**kwargs)
    if ":" in spec:
        return _from_file(spec) if is_file_spec(spec) else _from_import_path(spec)
    raise UnknownName("reward", spec, REWARDS.names(), " or 'path/file.py:function' or 'module:function'")


class RewardModelScorer:
    """The reward-model role: one scalar per (prompt, response) from a scalar-head model.

    `score_ids` scores token ids as the rollout holds them (no re-tokenisation); calling the scorer
    with texts makes it usable wherever a rule-based reward is.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer, device: torch.device | str = "cpu",
                 micro_batch_size: int = 64):
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.micro_batch_size = micro_batch_size

    @torch.no_grad()
    def score_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        scores = []
        for lo in range(0, input_ids.shape[0], self.micro_batch_size):
            ids = input_ids[lo:lo + self.micro_batch_size].to(self.device)
            mask = attention_mask[lo:lo + self.micro_batch_size].to(self.device)
            scores.append(self.model.sequence_scores(ids, mask).float())
        return torch.cat(scores)

    def __call__(self, prompts: Sequence[str], responses: Sequence[str],
                 answers: Sequence[str | None]) -> list[float]:
        seqs = [self.tokenizer.encode(p) + self.tokenizer.encode(r, add_bos=False) + [self.tokenizer.eos_id]
                for p, r in zip(prompts, responses, strict=True)]
        ids, mask = pad_left(seqs, self.tokenizer.pad_id)
        return self.score_ids(ids, mask).tolist()
