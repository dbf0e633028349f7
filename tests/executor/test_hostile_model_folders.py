"""Hostile model and tokenizer folders (issue 37): chat templates bounded in time and output,
config.json fields checked before any worker starts — one line naming the file and field."""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest

from hetprof.errors import SpecError
from hetprof.executor.prompts.data import Prompt, encode_prompt
from hetprof.safety.templates import BoundedTemplate, TemplateLimit
from hetprof.specs.models import from_hf_config, resolve_model

MESSAGES = [{"role": "user", "content": "two plus two"}]


@pytest.mark.parametrize("template, match", [
    ("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "ran past"),
    ("{% set x = range(5000)|list %}{% for a in x %}{% for b in x %}{% endfor %}{% endfor %}", "ran past"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "characters"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "characters"),
    ("{{ 'x' * 10**9 }}", "characters"),
    ("{{ 'x'|center(1000000000) }}", "more than"),
    ("{{ 9 ** 99999999 }}", "bits"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nest too deep"),
])
def test_a_hostile_template_is_stopped_fast_in_bounded_memory(template, match):
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(TemplateLimit, match=match):
            BoundedTemplate(template, seconds=0.5).render(messages=MESSAGES, add_generation_prompt=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 128 << 20 and time.monotonic() - started < 20


def test_a_real_template_renders_as_before():
    template = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}{{ messages|tojson }}")
    out = BoundedTemplate(template).render(messages=MESSAGES, add_generation_prompt=True, bos_token="<s>")
    assert out == '<s><|user|>two plus two<|assistant|>[{"role": "user", "content": "two plus two"}]'


def test_a_looping_chat_template_in_a_tokenizer_folder_is_refused_in_one_line(tmp_path, monkeypatch):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from hetprof.executor.models.tokenizer import load_tokenizer
    from hetprof.safety import templates

    monkeypatch.setattr(templates, "MAX_SECONDS", 0.5)
    core = Tokenizer(models.WordLevel({"<s>": 0, "</s>": 1, "<unk>": 2}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok.chat_template = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    tok.save_pretrained(str(tmp_path / "model"))
    started = time.monotonic()
    with pytest.raises(SpecError, match="chat_template.*ran past") as err:
        encode_prompt(load_tokenizer(str(tmp_path / "model")), Prompt("two", source="p.jsonl:1"))
    assert "\n" not in str(err.value) and str(tmp_path / "model") in str(err.value)
    assert time.monotonic() - started < 20


def _config(tmp_path, **fields):
    cfg = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "intermediate_size": 128, "vocab_size": 64, "max_position_embeddings": 512, "model_type": "qwen3"}
    cfg.update(fields)
    path = tmp_path / "model" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("fields, field", [
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"num_key_value_heads": 0}, "num_key_value_heads"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"hidden_size": 66}, "num_attention_heads"),
    ({"vocab_size": 10**12}, "vocab_size"),
    ({"max_position_embeddings": 10**12}, "max_position_embeddings"),
    ({"hidden_size": True}, "hidden_size"),
    ({"head_dim": -1}, "head_dim"),
    ({"rope_scaling": 1e999}, "rope_scaling"),
])
def test_bad_config_fields_are_refused_naming_file_and_field(tmp_path, fields, field):
    path = _config(tmp_path, **fields)
    with pytest.raises(SpecError, match=f"field '{field}'") as err:
        resolve_model(str(path.parent))
    assert err.value.exit_code == 2 and str(path) in str(err.value) and "\n" not in str(err.value)


def test_deep_or_non_regular_configs_are_refused(tmp_path):
    import os

    path = tmp_path / "model" / "config.json"
    path.parent.mkdir()
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(SpecError, match="nested"):
        from_hf_config(path)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(SpecError, match="FIFO"):
        from_hf_config(path)


def test_a_good_config_still_reads(tmp_path):
    shape = from_hf_config(_config(tmp_path))
    assert (shape.heads, shape.kv_heads, shape.head_dim, shape.family) == (4, 2, 16, "qwen3")
