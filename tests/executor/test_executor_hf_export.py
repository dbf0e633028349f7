"""Hugging Face exports: what transformers loads from them is the model and tokenizer the run trained."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetprof.executor.checkpoints.hf_export import _prune, _write_actor, _write_critic, export_folder
from hetprof.executor.models.hf_tokenizer import char_tokenizer_fast
from hetprof.executor.models.modeling import build_causal_lm, build_value_model
from hetprof.executor.models.tokenizer import CHARS, CharTokenizer
from hetprof.specs import WorkloadSpec

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml")


def run_models():
    """The few attributes of the rank context an export reads."""
    return types.SimpleNamespace(tokenizer=CharTokenizer(), workload=WORKLOAD)


FAST = char_tokenizer_fast()


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=CHARS + CHARS.upper() + "é€\t", max_size=40))
def test_exported_char_tokenizer_encodes_every_text_to_the_runs_ids(text):
    assert FAST.encode(text) == CharTokenizer().encode(text)


def test_actor_export_loads_with_automodel_and_gives_the_same_logits(tmp_path, one_thread):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    model = build_causal_lm("tiny", seed=3)
    _write_actor(tmp_path / "actor", model.state_dict(), "tiny", run_models())
    names = {p.name for p in (tmp_path / "actor").iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= names
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "actor", local_files_only=True)
    tok = AutoTokenizer.from_pretrained(tmp_path / "actor", local_files_only=True)
    ids = torch.tensor([tok.encode("what is 2+3?")])
    assert torch.equal(back(ids).logits, model(ids).logits)
    gen = GenerationConfig.from_pretrained(tmp_path / "actor")
    assert (gen.eos_token_id, gen.pad_token_id, gen.max_new_tokens) == (2, 0, WORKLOAD.response_len.cap)


def test_critic_export_is_a_one_label_token_classifier_with_the_critics_values(tmp_path, one_thread):
    from transformers import AutoModelForTokenClassification

    critic = build_value_model("tiny", seed=4)
    torch.nn.init.normal_(critic.head.weight)  # a trained head, not the zero one a critic starts with
    _write_critic(tmp_path / "critic", critic.state_dict(), "tiny", run_models())
    back = AutoModelForTokenClassification.from_pretrained(tmp_path / "critic", local_files_only=True).eval()
    ids = torch.tensor([CharTokenizer().encode("1+1=?")])
    assert back.config.num_labels == 1
    torch.testing.assert_close(back(ids).logits[..., 0], critic(ids, torch.ones_like(ids)))


def test_old_exports_are_pruned_per_role_and_empty_iterations_removed(tmp_path):
    for it in (5, 10, 15):
        for role in ("actor", "critic"):
            export_folder(tmp_path, it, role).mkdir(parents=True)
        _prune(tmp_path / "hf", "actor", keep=2, iteration=it)  # each lead records what it exported
    assert (tmp_path / "hf" / "iter-000005" / "critic").is_dir()  # the critic's lead prunes its own
    assert not (tmp_path / "hf" / "iter-000005" / "actor").exists()
    for it in (5, 10, 15):
        _prune(tmp_path / "hf", "critic", keep=2, iteration=it)
    assert sorted(p.name for p in (tmp_path / "hf").glob("iter-*")) == ["iter-000010", "iter-000015"]


def test_an_export_needs_a_tokenizer_it_knows():
    from hetprof.executor.models.hf_tokenizer import save_tokenizer

    with pytest.raises(TypeError, match="cannot export"):
        save_tokenizer(object(), "unused")
