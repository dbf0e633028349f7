"""Tokenizers the executor feeds its models with.

The `tiny` presets train on a CPU in seconds only because their vocabulary is 64 characters, so
the character tokenizer here *is* their vocabulary: its ids must stay stable, since checkpoints and
weight syncs of tiny models carry embedding rows in this order. Real checkpoints bring their own
tokenizer files, read from a local path (nothing is downloaded). Random-weight presets with big
vocabularies have no tokenizer at all; the character ids are valid ids for them, which is all a
throughput run needs.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from hetprof.errors import SpecError
from hetprof.runtime.generation import pad_left

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
_SPECIALS = (PAD, BOS, EOS, UNK)
# Digits and letters first (the arithmetic task's answers and words), then what word problems and
# GSM8K answers ("#### 7") use. Upper case folds to lower case: 64 ids leave no room for both.
_SYMBOLS = " +-*/=?.,#:()!'\n$%<>;\"&_"
CHARS = string.digits + string.ascii_lowercase + _SYMBOLS
VOCAB_SIZE = len(_SPECIALS) + len(CHARS)
assert VOCAB_SIZE == 64, VOCAB_SIZE


class Tokenizer(Protocol):
    """What the executor needs from any tokenizer (the char one or a transformers one)."""

    pad_id: int
    bos_id: int
    eos_id: int
    vocab_size: int

    def encode(self, text: str, add_bos: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str: ...


class CharTokenizer:
    """One id per character of a fixed 64-symbol alphabet; unknown characters map to <unk>."""

    pad_id = 0
    bos_id = 1
    eos_id = 2
    unk_id = 3
    vocab_size = VOCAB_SIZE

    def __init__(self) -> None:
        self._to_id = {c: i + len(_SPECIALS) for i, c in enumerate(CHARS)}
        self._to_char = {i: c for c, i in self._to_id.items()}

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = [self._to_id.get(c, self.unk_id) for c in text.lower()]
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Text of `ids`, stopping at the first <eos> (what follows it was never generated)."""
        out: list[str] = []
        for raw in ids:
            i = int(raw)
            if i == self.eos_id:
                if not skip_special:
                    out.append(EOS)
                break
            if i < len(_SPECIALS):
                if not skip_special:
                    out.append(_SPECIALS[i])
                continue
            out.append(self._to_char.get(i, "?"))
        return "".join(out)

    def __len__(self) -> int:
        return self.vocab_size


class HFTokenizer:
    """A transformers tokenizer behind the executor's small interface (ids as plain lists)."""

    def __init__(self, tok: PreTrainedTokenizerBase) -> None:
        self._tok = tok
        eos = tok.eos_token_id
        if eos is None:
            raise SpecError(str(getattr(tok, "name_or_path", "tokenizer")), "eos_token_id",
                            "a tokenizer with an end-of-sequence token")
        self.eos_id = int(eos)
        self.pad_id = int(tok.pad_token_id) if tok.pad_token_id is not None else self.eos_id
        self.bos_id = int(tok.bos_token_id) if tok.bos_token_id is not None else self.eos_id
        self._has_bos = tok.bos_token_id is not None
        self.vocab_size = len(tok)
        self._bounded: Any = None  # the chat template compiled in the bounded sandbox, on first use

    @property
    def hf(self) -> PreTrainedTokenizerBase:
        """The transformers tokenizer underneath (what a model export saves)."""
        return self._tok

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False)
        return [self.bos_id, *ids] if add_bos and self._has_bos else list(ids)

    @property
    def chat_template(self) -> str | None:
        """The model's chat template (Jinja), if its tokenizer files have one."""
        return getattr(self._tok, "chat_template", None)

    def render_chat(self, turns: Sequence[dict[str, str]]) -> str:
        """The turns ({"role", "content"}) in the chat template, ending where the assistant's reply starts.
        The template is code from the model folder: it is first rendered in a sandbox with time and
        output caps (hetprof.safety.templates), and refused (TemplateLimit) past them."""
        from hetprof.safety.templates import BoundedTemplate, TemplateLimit

        try:
            if self._bounded is None:
                self._bounded = BoundedTemplate(self.chat_template or "")
            self._bounded.render(messages=[dict(t) for t in turns], add_generation_prompt=True,
                                 **{k: v for k, v in self._tok.special_tokens_map.items() if isinstance(v, str)})
        except TemplateLimit as exc:
            raise SpecError(str(getattr(self._tok, "name_or_path", "") or "tokenizer"), "chat_template",
                            f"a template that renders in {self._bounded.seconds:g} s and "
                            f"{self._bounded.chars:,} characters", str(exc)) from None
        except Exception:  # noqa: BLE001 - the template's own errors: transformers raises (and names) them below
            pass
        return self._tok.apply_chat_template(list(turns), tokenize=False, add_generation_prompt=True)

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        ids = [int(i) for i in ids]
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id) + (0 if skip_special else 1)]
        return self._tok.decode(ids, skip_special_tokens=skip_special)

    def __len__(self) -> int:
        return self.vocab_size


def load_tokenizer(model_ref: str) -> Tokenizer:
    """The tokenizer for a model reference: a local HF directory's own, else the char tokenizer.

    A directory without tokenizer files (a config-only shape) gets the char tokenizer, like the
    random-weight presets: its ids are below any real vocabulary size.
    """
    path = Path(model_ref)
    if path.is_dir() and any((path / f).is_file() for f in
                             ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")):
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise SpecError(str(path), "tokenizer", "loadable tokenizer files", str(exc)) from None
        return HFTokenizer(tok)
    return CharTokenizer()


def encode_batch(tokenizer: Tokenizer, texts: Sequence[str],
                 device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Encode texts with a leading <bos> and left-pad them for generation."""
    return pad_left([tokenizer.encode(t) for t in texts], tokenizer.pad_id, device)
