"""Prompts for RL: a built-in arithmetic word-problem set, JSONL files, and a resumable stream.

The built-in set exists so that every machine can check that RL *learns*, not only that it runs:
GSM8K-shaped word problems whose answers are single digits, which a tiny random-init model can
learn to answer right part of the time within a few dozen small updates. Real runs read a file
(prompt_files.py: JSONL, JSON, Parquet, Arrow, CSV) with a prompt and an answer column.

A `PromptSource` is a pure function of (prompts, seed, cursor): batch i is the same on every rank
and after every resume, so a resumed run continues the data stream instead of repeating it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Sequence
from pathlib import Path

from hetprof.errors import SpecError
from hetprof.executor.models.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class Prompt:
    """A prompt and its reference answer. A chat prompt keeps its turns as (role, content) pairs,
    its `text` (what rewards see) their contents one after another."""

    text: str
    answer: str | None = None
    source: str = dataclasses.field(default="", compare=False)  # "file:LINE" / "file row N", for errors
    messages: tuple[tuple[str, str], ...] = ()

    def turns(self) -> list[dict[str, str]]:
        """The conversation a chat template renders: the turns, or the text as one user turn."""
        if self.messages:
            return [{"role": role, "content": content} for role, content in self.messages]
        return [{"role": "user", "content": self.text}]


_NAMES = ("tom", "ana", "li", "sam", "mia", "raj", "eva", "ben", "zoe", "kai")
_ITEMS = ("apples", "pens", "cards", "books", "coins", "shells", "eggs", "cups")
_ADD = ("{n} has {a} {i} and gets {b} more. how many {i} does {n} have?",
        "{n} had {a} {i}. a friend gave {n} {b} more. how many {i} now?")
_SUB = ("{n} has {a} {i} and gives away {b}. how many {i} are left?",
        "{n} had {a} {i} and lost {b}. how many {i} does {n} have now?")
ANSWER_CUE = " #### "


def arithmetic_prompts(n: int, seed: int = 0, max_answer: int = 4, ops: Sequence[str] = ("+", "-"),
                       words: bool = True) -> list[Prompt]:
    """`n` seeded word problems `a + b` / `a - b` whose answers lie in [0, max_answer].

    Answers are uniform over [0, max_answer], so a policy that ignores the prompt is right 1 time in
    max_answer + 1. The default (answers 0-4, operands single digits) is what lets the `tiny` preset's
    reward rise visibly within ~20 small iterations; raise it for a harder task.

    Each prompt ends with the GSM8K answer cue "#### " so the reward can parse a final answer and
    a small model only has to learn the number, not the whole answer format. `words=False` gives
    bare equations ("3+4=") for the smallest smoke tests.
    """
    if n < 0 or max_answer < 0:
        raise ValueError("n and max_answer must be >= 0")
    bad = [op for op in ops if op not in ("+", "-")]
    if bad or not ops:
        raise ValueError(f"ops must be a non-empty subset of '+', '-', got {list(ops)}")
    rng = random.Random(seed)
    out: list[Prompt] = []
    for _ in range(n):
        op = rng.choice(list(ops))
        ans = rng.randint(0, max_answer)  # answers uniform: no answer is a free guess
        if op == "+":
            a = rng.randint(0, ans)
            b = ans - a
        else:
            b = rng.randint(0, max_answer - ans)
            a = ans + b
        if words:
            template = rng.choice(_ADD if op == "+" else _SUB)
            text = template.format(n=rng.choice(_NAMES), i=rng.choice(_ITEMS), a=a, b=b)
        else:
            text = f"{a}{op}{b}="
        out.append(Prompt(text + ANSWER_CUE, str(ans)))
    return out


def encode_prompt(tokenizer: Tokenizer, prompt: Prompt, chat_template: bool = True) -> list[int]:
    """A prompt's token ids: its turns in the tokenizer's chat template when it has one and
    `chat_template` is on (the template writes its own BOS), else the plain text after a BOS."""
    render = getattr(tokenizer, "render_chat", None)
    if chat_template and render is not None and getattr(tokenizer, "chat_template", None):
        try:
            rendered = render(prompt.turns())
        except SpecError:  # the model folder's template past the sandbox's limits: named as such
            raise
        except Exception as exc:  # a Jinja template can raise anything; name it as the model's problem
            raise SpecError(prompt.source or "chat template", "data.chat_template", "a template that renders "
                            "these turns (or data.chat_template: false)", f"{type(exc).__name__}: {exc}") from None
        return tokenizer.encode(rendered, add_bos=False)
    return tokenizer.encode(prompt.text)


def write_jsonl(path: str | Path, prompts: Sequence[Prompt]) -> None:
    """Write prompts in the JSONL format `prompt_files.load_jsonl` reads (to export the built-in set, for example)."""
    with Path(path).open("w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p.turns() if p.messages else p.text, "answer": p.answer}) + "\n")


class PromptSource:
    """Batches of prompts in a seeded order that depends only on the batch index.

    Epoch e visits every prompt once in the order of a permutation seeded by (seed, e); batch i
    covers positions [i*B, (i+1)*B) of the concatenated epochs. The cursor is the next batch
    index, so saving it in a checkpoint is enough to resume the stream exactly; the saved position
    also names the stream (seed, batch size, the prompts' fingerprint), so another is not continued.
    """

    def __init__(self, prompts: Sequence[Prompt], batch_size: int, seed: int = 0, cursor: int = 0):
        if not prompts:
            raise ValueError("PromptSource needs at least one prompt")
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        self.prompts = list(prompts)
        self.batch_size = batch_size
        self.seed = seed
        self.cursor = cursor
        self._orders: dict[int, list[int]] = {}
        self._fingerprint: str | None = None

    @classmethod
    def builtin(cls, batch_size: int, seed: int = 0, size: int = 4096, **kwargs) -> PromptSource:
        """The arithmetic set: problems seeded by `seed`, shuffled by `seed` too."""
        return cls(arithmetic_prompts(size, seed=seed, **kwargs), batch_size, seed=seed)

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.prompts)))
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._orders = {epoch: order}  # one epoch at a time is all a stream needs
        return self._orders[epoch]

    def batch(self, index: int) -> list[Prompt]:
        """Batch `index` (any index, independent of the cursor)."""
        if index < 0:
            raise ValueError("batch index must be >= 0")
        n = len(self.prompts)
        out = []
        for pos in range(index * self.batch_size, (index + 1) * self.batch_size):
            epoch, offset = divmod(pos, n)
            out.append(self.prompts[self._order(epoch)[offset]])
        return out

    def next_batch(self) -> list[Prompt]:
        """The batch at the cursor; advances it."""
        out = self.batch(self.cursor)
        self.cursor += 1
        return out

    def position(self, index: int) -> dict:
        """The stream at batch `index` as plain JSON: where it stands (cursor, epoch, offset) and which
        stream it is (seed, batch size, the prompts' count and fingerprint)."""
        epoch, offset = divmod(index * self.batch_size, len(self.prompts))
        return {"cursor": index, "epoch": epoch, "offset": offset, "seed": self.seed,
                "batch_size": self.batch_size, "prompts": len(self.prompts), "fingerprint": self.fingerprint()}

    def fingerprint(self) -> str:
        """A digest of the prompts in their file order: another file (or an edited one) gives another."""
        if self._fingerprint is None:
            digest = hashlib.sha256()
            for p in self.prompts:
                digest.update(json.dumps([p.text, p.answer, p.messages]).encode("utf-8"))
            self._fingerprint = digest.hexdigest()[:16]
        return self._fingerprint

    def state_dict(self) -> dict:
        return self.position(self.cursor)

    def load_state_dict(self, state: dict) -> None:
        """Continue a saved stream at its cursor; a different stream (batch size, seed, prompts) is
        refused, since continuing it would not continue the run that saved it."""
        for field, own in (("batch_size", self.batch_size), ("seed", self.seed), ("prompts", len(self.prompts)),
                           ("fingerprint", self.fingerprint())):
            if field in state and state[field] != own:
                raise SpecError(None, field, f"{state[field]!r:.40} as in the checkpoint's data stream, which a "
                                f"resume continues", own)
        cursor = state.get("cursor")
        if type(cursor) is not int or cursor < 0:
            raise SpecError(None, "cursor", "a batch index >= 0", cursor)
        self.cursor = cursor
