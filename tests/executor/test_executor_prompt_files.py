"""Prompt files in every format `datasets` reads, configurable fields, validation split, chat templates."""

from __future__ import annotations

import json

import pytest

from hetprof.errors import SpecError
from hetprof.executor.prompts.data import Prompt, arithmetic_prompts, encode_prompt
from hetprof.executor.prompts.prompt_files import load_prompts, prompt_sets
from hetprof.specs import DataParams

ROWS = [{"question": "1+1=", "solution": "2", "id": 1}, {"question": "2+3=", "solution": "5", "id": 2},
        {"question": "what is pi?", "solution": None, "id": 3}]
EXPECTED = [Prompt("1+1=", "2"), Prompt("2+3=", "5"), Prompt("what is pi?", None)]


def _write(path, fmt):
    import datasets

    ds = datasets.Dataset.from_list(ROWS)
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif fmt == "json":
        path.write_text(json.dumps(ROWS, indent=1))
    elif fmt == "parquet":
        ds.to_parquet(str(path))
    elif fmt == "csv":
        ds.to_csv(str(path), index=False)
    elif fmt == "arrow":
        ds.save_to_disk(str(path))  # a saved dataset folder; its data-*.arrow file is read too
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet", "csv", "arrow"])
def test_every_format_reads_the_named_fields(tmp_path, fmt):
    path = _write(tmp_path / f"p.{fmt}", fmt)
    got = load_prompts(path, prompt_field="question", answer_field="solution")
    assert got == EXPECTED
    if fmt == "arrow":  # the single .arrow file inside the saved folder, by suffix
        arrow = next(path.glob("*.arrow"))
        assert load_prompts(arrow, "question", "solution") == EXPECTED


def test_a_numeric_answer_column_becomes_text(tmp_path):
    path = tmp_path / "n.csv"
    path.write_text("prompt,answer\n3+4=,7\n")
    assert load_prompts(path) == [Prompt("3+4=", "7")]


def test_a_missing_prompt_column_is_named_with_the_columns_there(tmp_path):
    path = _write(tmp_path / "p.parquet", "parquet")
    with pytest.raises(SpecError) as err:
        load_prompts(path)  # default field 'prompt'
    msg = str(err.value)
    assert f"{path} row 1" in msg and "field 'prompt'" in msg and "columns: question, solution, id" in msg


@pytest.mark.parametrize(("name", "content", "where"), [
    ("bad.json", '[{"prompt": "a"},\n {"prompt": }]', ":2:13"),
    ("bad.jsonl", '{"prompt": "a"}\n{"prompt": "b"\n', ":2:"),
    ("bad.parquet", "not parquet at all", ""),
    ("bad.txt", "x", ""),
])
def test_malformed_files_name_file_and_line(tmp_path, name, content, where):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(SpecError) as err:
        load_prompts(path)
    assert f"{path}{where}" in str(err.value)
    assert "\n" not in str(err.value)


def test_validation_is_a_file_or_a_seeded_held_out_part(tmp_path):
    train = _write(tmp_path / "t.jsonl", "jsonl")
    val = tmp_path / "v.jsonl"
    val.write_text(json.dumps({"question": "9-9=", "solution": "0"}) + "\n")
    data = DataParams(prompts="t.jsonl", prompt_field="question", answer_field="solution", validation="v.jsonl")
    sets = prompt_sets(data, str(tmp_path))
    assert sets.train == EXPECTED and sets.validation == [Prompt("9-9=", "0")]
    held = prompt_sets(DataParams(validation_size=100), None, seed=3)
    builtin = arithmetic_prompts(4096, seed=3)
    assert len(held.validation) == 100 and len(held.train) <= 4096 - 100
    assert set(held.train) | set(held.validation) == set(builtin) and not set(held.train) & set(held.validation)
    assert prompt_sets(DataParams(validation_size=100), None, seed=3) == held  # same on every rank
    override = prompt_sets(DataParams(prompts="elsewhere.jsonl", prompt_field="question"), None, prompts=str(train))
    assert [p.text for p in override.train] == [r["question"] for r in ROWS]  # --prompts wins over data.prompts
    with pytest.raises(SpecError, match="data.validation_size"):
        prompt_sets(DataParams(prompts=str(train), prompt_field="question", validation_size=3), None)


def test_without_a_validation_set_the_builtin_stream_is_unchanged():
    assert prompt_sets(DataParams(), None, seed=5).train == arithmetic_prompts(4096, seed=5)


def _chat_tokenizer(folder, template: str | None):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>", "<unk>", "user", "assistant", "system", ":", "two", "plus", "is"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>")
    if template is not None:
        tok.chat_template = template
    tok.save_pretrained(str(folder))
    return {w: i for i, w in enumerate(words)}


def test_prompts_are_wrapped_in_the_tokenizers_chat_template(tmp_path):
    from hetprof.executor.models.tokenizer import load_tokenizer

    template = ("{% for m in messages %}<s> {{ m['role'] }} : {{ m['content'] }} </s> {% endfor %}"
                "{% if add_generation_prompt %}assistant :{% endif %}")
    ids = _chat_tokenizer(tmp_path / "chat", template)
    tok = load_tokenizer(str(tmp_path / "chat"))
    assert encode_prompt(tok, Prompt("two plus two")) == [ids[w] for w in
                                                  ["<s>", "user", ":", "two", "plus", "two", "</s>", "assistant", ":"]]
    assert encode_prompt(tok, Prompt("two plus two"), chat_template=False) == [ids[w] for w in ["<s>", "two", "plus", "two"]]
    _chat_tokenizer(tmp_path / "plain", None)
    plain = load_tokenizer(str(tmp_path / "plain"))  # no template: the text after a BOS
    assert encode_prompt(plain, Prompt("two plus two")) == [ids[w] for w in ["<s>", "two", "plus", "two"]]


def test_a_chat_prompt_renders_every_turn_and_rewards_see_its_text(tmp_path):
    from hetprof.executor.models.tokenizer import load_tokenizer

    template = ("{% for m in messages %}<s> {{ m['role'] }} : {{ m['content'] }} </s> {% endfor %}"
                "{% if add_generation_prompt %}assistant :{% endif %}")
    ids = _chat_tokenizer(tmp_path / "chat", template)
    tok = load_tokenizer(str(tmp_path / "chat"))
    prompt = Prompt("is two\n\ntwo plus two", messages=(("system", "is two"), ("user", "two plus two")))
    assert encode_prompt(tok, prompt) == [ids[w] for w in ["<s>", "system", ":", "is", "two", "</s>", "<s>", "user",
                                                            ":", "two", "plus", "two", "</s>", "assistant", ":"]]
    assert encode_prompt(tok, prompt, chat_template=False) == [ids[w] for w in ["<s>", "is", "two", "two", "plus",
                                                                                 "two"]]


def test_verl_style_rows_chat_turns_and_a_nested_answer(tmp_path):
    import datasets

    rows = [{"prompt": [{"role": "system", "content": "answer briefly"}, {"role": "user", "content": "1+1="}],
             "reward_model": {"style": "rule", "ground_truth": "2"}, "data_source": "gsm8k"}]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "verl.parquet"))
    got = load_prompts(tmp_path / "verl.parquet", answer_field="reward_model.ground_truth")
    assert got == [Prompt("answer briefly\n\n1+1=", "2", messages=(("system", "answer briefly"), ("user", "1+1=")))]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}, {"role": "user"}]}) + "\n")
    with pytest.raises(SpecError, match=r"bad.jsonl:1: field 'prompt\[1\]': expected a chat turn"):
        load_prompts(bad)


def test_a_verl_parquet_is_read_without_options(tmp_path):
    """verl's layout as its data scripts write it (pandas → parquet): chat turns in `prompt`, the answer in
    `reward_model.ground_truth`, `data_source` and `extra_info` beside — read with the default fields."""
    import pandas as pd

    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{a}+{a}="}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(2 * a)}, "extra_info": {"split": "train", "index": a}}
            for a in range(3)]
    pd.DataFrame(rows).to_parquet(tmp_path / "train.parquet")
    got = load_prompts(tmp_path / "train.parquet", answers_for="arithmetic")
    assert [(p.text, p.answer, p.messages) for p in got] == [
        (f"{a}+{a}=", str(2 * a), (("user", f"{a}+{a}="),)) for a in range(3)]
    sets = prompt_sets(DataParams(prompts="train.parquet"), str(tmp_path), answers_for="arithmetic")
    assert [p.answer for p in sets.train] == ["0", "2", "4"]


def test_a_reward_that_needs_answers_refuses_a_file_without_them(tmp_path):
    """Without the answer field a run would train on reward 0 every iteration: refused in one line naming
    the field and the fields the file has (nested ones dotted, as data.answer_field names them)."""
    import pandas as pd

    pd.DataFrame([{"prompt": [{"role": "user", "content": "1+1="}], "label": {"gt": "2"}, "data_source": "x"}]
                 ).to_parquet(tmp_path / "t.parquet")
    assert load_prompts(tmp_path / "t.parquet")[0].answer is None  # a reward without answers may read it
    with pytest.raises(SpecError) as err:
        load_prompts(tmp_path / "t.parquet", answers_for="arithmetic")
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 't.parquet'} row 1: field 'answer': expected the reference answer "
                              "reward 'arithmetic' scores against (this row's fields: prompt, label.gt, data_source;")
    assert "--set data.answer_field=FIELD" in message and "\n" not in message
    (tmp_path / "some.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n')
    with pytest.raises(SpecError, match=r"some.jsonl:2: field 'answer'.*fields: prompt;"):
        load_prompts(tmp_path / "some.jsonl", answers_for="math")
    named = load_prompts(tmp_path / "t.parquet", answer_field="label.gt", answers_for="arithmetic")
    assert named[0].answer == "2"


def test_a_template_that_cannot_render_is_named(tmp_path):
    from hetprof.executor.models.tokenizer import load_tokenizer

    _chat_tokenizer(tmp_path / "broken", "{{ raise_exception('no user turns here') }}")
    with pytest.raises(SpecError, match="data.chat_template.*no user turns here"):
        encode_prompt(load_tokenizer(str(tmp_path / "broken")), Prompt("two"))
