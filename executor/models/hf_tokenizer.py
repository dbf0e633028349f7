"""The run's tokenizer as a transformers tokenizer, so an exported model is usable on its own.

A local checkpoint's tokenizer is saved as it came. The `tiny` presets' 64-character vocabulary
(tokenizer.CharTokenizer) becomes a `tokenizers` word-level model over single characters with the
same ids, lower-casing and the same special tokens, so `AutoTokenizer.from_pretrained` (and vLLM)
encode a text to exactly the ids the run trained on.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hetprof.executor.models.tokenizer import (
    _SPECIALS,
    BOS,
    CHARS,
    EOS,
    PAD,
    UNK,
    CharTokenizer,
    HFTokenizer,
    Tokenizer,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def char_tokenizer_fast() -> PreTrainedTokenizerBase:
    """CharTokenizer's vocabulary and rules as a PreTrainedTokenizerFast (a <bos> starts each text)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(_SPECIALS)}
    vocab.update({c: i + len(_SPECIALS) for i, c in enumerate(CHARS)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one token per character
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A $B",
                                                        special_tokens=[(BOS, vocab[BOS])])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   unk_token=UNK, padding_side="left")


def save_tokenizer(tokenizer: Tokenizer, folder: str | Path) -> None:
    """Write the run's tokenizer files into `folder` (a model export)."""
    if isinstance(tokenizer, HFTokenizer):
        tokenizer.hf.save_pretrained(str(folder))
    elif isinstance(tokenizer, CharTokenizer):
        char_tokenizer_fast().save_pretrained(str(folder))
    else:
        raise TypeError(f"cannot export a {type(tokenizer).__name__} as Hugging Face tokenizer files")
