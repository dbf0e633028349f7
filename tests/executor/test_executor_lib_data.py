"""Tokenizer, built-in arithmetic prompts, JSONL prompt files and the resumable prompt stream."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from hetprof.errors import SpecError
from hetprof.executor.models.tokenizer import VOCAB_SIZE, CharTokenizer, encode_batch, load_tokenizer
from hetprof.executor.prompts.data import (
    ANSWER_CUE,
    Prompt,
    PromptSource,
    arithmetic_prompts,
    write_jsonl,
)
from hetprof.executor.prompts.prompt_files import load_jsonl
from hetprof.runtime.generation import pad_left
from hetprof.specs.models import PRESETS


def test_char_vocabulary_matches_tiny_presets():
    tok = CharTokenizer()
    assert VOCAB_SIZE == PRESETS["tiny"].vocab == PRESETS["tiny-2x"].vocab == len(tok)
    ids = tok.encode("tom has 3 apples + 4 = ? #### 7")
    assert ids[0] == tok.bos_id and max(ids) < VOCAB_SIZE
    assert len(set(ids)) > 10  # distinct characters get distinct ids
    assert {tok.pad_id, tok.bos_id, tok.eos_id}.isdisjoint(ids[1:])


def test_char_roundtrip_and_eos_stops_decoding():
    tok = CharTokenizer()
    text = "ana had 9 pens, lost 2. how many now? #### 7\n"
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode("Upper CASE")) == "upper case"  # documented fold
    ids = tok.encode("12", add_bos=False) + [tok.eos_id] + tok.encode("99", add_bos=False)
    assert tok.decode(ids) == "12"
    assert tok.decode(ids, skip_special=False) == "12<eos>"
    assert tok.decode(tok.encode("a~b", add_bos=False)) == "ab"  # <unk> is special, skipped


def test_pad_left_aligns_the_last_token():
    ids, mask = pad_left([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    with pytest.raises(ValueError, match="empty"):
        pad_left([[1], []], 0)
    ids, mask = encode_batch(CharTokenizer(), ["1+1=", "12+13="])
    assert ids.shape == (2, 7) and int(mask[0].sum()) == 5


def test_load_tokenizer_falls_back_to_chars_for_presets_and_config_only_dirs(tmp_path):
    assert isinstance(load_tokenizer("tiny"), CharTokenizer)
    assert isinstance(load_tokenizer("qwen3-8b"), CharTokenizer)  # random weights: char ids are valid ids
    (tmp_path / "config.json").write_text("{}")
    assert isinstance(load_tokenizer(str(tmp_path)), CharTokenizer)


def test_arithmetic_prompts_are_seeded_correct_and_uniform():
    a = arithmetic_prompts(400, seed=3)
    assert a == arithmetic_prompts(400, seed=3)
    assert a != arithmetic_prompts(400, seed=4)
    for p in a:
        assert p.text.endswith(ANSWER_CUE)
        nums = [int(t) for t in p.text.replace(".", " ").replace("?", " ").split() if t.isdigit()]
        assert len(nums) == 2
        x, y = nums
        assert int(p.answer) in (x + y, x - y)
        assert 0 <= int(p.answer) <= 4
    counts = Counter(p.answer for p in a)
    assert set(counts) == {"0", "1", "2", "3", "4"}
    assert max(counts.values()) < 2 * min(counts.values())  # no answer is a free guess
    eq = arithmetic_prompts(50, seed=0, words=False, max_answer=9, ops=("+",))
    for p in eq:
        x, y = p.text.split("=")[0].split("+")
        assert int(x) + int(y) == int(p.answer) <= 9
    with pytest.raises(ValueError, match="ops"):
        arithmetic_prompts(3, ops=("*",))


def test_jsonl_roundtrip(tmp_path):
    path = tmp_path / "p.jsonl"
    prompts = arithmetic_prompts(5, seed=1)
    write_jsonl(path, prompts)
    assert load_jsonl(path) == prompts
    path.write_text('{"prompt": "2+2=", "answer": 4}\n\n{"prompt": "say hi"}\n')
    assert load_jsonl(path) == [Prompt("2+2=", "4"), Prompt("say hi", None)]


@pytest.mark.parametrize("line, field, expected", [
    ('{"prompt": "ok", "answer": "1"', "<root>", "one JSON object per line"),
    ('["a", "b"]', "<root>", "JSON object"),
    ('{"answer": "1"}', "prompt", "non-empty string"),
    ('{"prompt": "  ", "answer": "1"}', "prompt", "non-empty string"),
    ('{"prompt": 5, "answer": "1"}', "prompt", "non-empty string"),
    ('{"prompt": "x", "answer": [1]}', "answer", "string or a number"),
    ('{"prompt": "x", "answer": true}', "answer", "string or a number"),
])
def test_jsonl_bad_line_names_file_line_and_field(tmp_path, line, field, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n\n" + line + "\n")
    with pytest.raises(SpecError) as err:
        load_jsonl(path)
    msg = str(err.value)
    assert f"{path}:3" in msg and f"field '{field}'" in msg and expected in msg


def test_jsonl_missing_or_empty_file(tmp_path):
    with pytest.raises(SpecError, match="readable"):
        load_jsonl(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(SpecError, match="at least one prompt"):
        load_jsonl(tmp_path / "empty.jsonl")


def test_prompt_source_is_deterministic_covers_epochs_and_resumes():
    prompts = arithmetic_prompts(10, seed=0)
    src = PromptSource(prompts, batch_size=4, seed=7)
    stream = [src.next_batch() for _ in range(5)]  # 20 prompts = two epochs
    flat = [p for b in stream for p in b]
    assert sorted(flat[:10], key=repr) == sorted(prompts, key=repr)  # each epoch visits all once
    assert sorted(flat[10:], key=repr) == sorted(prompts, key=repr)
    assert flat[:10] != flat[10:]  # a new order per epoch
    resumed = PromptSource(prompts, batch_size=4, seed=7)
    resumed.load_state_dict(json.loads(json.dumps(src.state_dict())))  # survives a JSON checkpoint
    fresh = PromptSource(prompts, batch_size=4, seed=7)
    for _ in range(5):
        fresh.next_batch()
    assert resumed.next_batch() == fresh.next_batch()
    assert PromptSource(prompts, 4, seed=8).batch(0) != src.batch(0)
    with pytest.raises(SpecError, match="batch_size"):
        PromptSource(prompts, batch_size=3).load_state_dict(src.state_dict())


def test_a_saved_data_position_names_its_stream_and_another_is_not_continued():
    prompts = arithmetic_prompts(10, seed=0)
    src = PromptSource(prompts, batch_size=4, seed=7)
    position = json.loads(json.dumps(src.position(3)))  # plain JSON, as a checkpoint's meta.json holds it
    assert (position["cursor"], position["epoch"], position["offset"]) == (3, 1, 2)  # position 12: epoch 1, offset 2
    for other, field in ((PromptSource(prompts, 4, seed=8), "seed"), (PromptSource(prompts[:9], 4, seed=7), "prompts"),
                         (PromptSource([*prompts[:9], arithmetic_prompts(11, seed=0)[10]], 4, seed=7), "fingerprint")):
        with pytest.raises(SpecError, match=field):
            other.load_state_dict(position)
    resumed = PromptSource(list(prompts), 4, seed=7)
    resumed.load_state_dict(position)
    assert resumed.cursor == 3 and resumed.next_batch() == src.batch(3)


def test_builtin_source_defaults():
    src = PromptSource.builtin(batch_size=8, seed=1)
    assert len(src.next_batch()) == 8 and src.cursor == 1


def test_local_hf_tokenizer_directory(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from hetprof.executor.models.tokenizer import HFTokenizer

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "[UNK]": 3, "two": 4, "plus": 5, "is": 6, "4": 7}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="[UNK]")
    fast.save_pretrained(tmp_path)
    tok = load_tokenizer(str(tmp_path))
    assert isinstance(tok, HFTokenizer)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 2, 8)
    ids = tok.encode("two plus two is 4")
    assert ids == [1, 4, 5, 4, 6, 7]
    assert tok.decode(ids[1:] + [tok.eos_id, 4, 4]) == "two plus two is 4"
    padded, mask = encode_batch(tok, ["two", "two plus two"])
    assert padded[0].tolist() == [0, 0, 1, 4] and mask[0].tolist() == [0, 0, 1, 1]
