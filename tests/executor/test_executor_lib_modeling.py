"""Models built from shapes (seeded, exact parameter counts), local checkpoints, critic and reward heads."""

from __future__ import annotations

import pytest
import torch

from hetprof.errors import SpecError
from hetprof.executor.models.logprobs import token_logprobs
from hetprof.executor.models.modeling import (
    build_causal_lm,
    build_reward_model,
    build_value_model,
    count_parameters,
    position_ids,
    torch_dtype,
    unwrap,
)
from hetprof.executor.models.tokenizer import CharTokenizer
from hetprof.runtime.generation import pad_left
from hetprof.specs.models import PRESETS

pytestmark = pytest.mark.usefixtures("one_thread")



def _same(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.parametrize("preset", ["tiny", "tiny-2x"])
def test_random_model_has_the_planned_shape(preset):
    model = build_causal_lm(preset, seed=0)
    shape = PRESETS[preset]
    assert count_parameters(model) == shape.params  # what the cost models priced is what runs
    assert model.config.num_hidden_layers == shape.layers and model.config.vocab_size == shape.vocab


def test_seeded_init_is_reproducible_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = build_causal_lm("tiny", seed=7)
    after = torch.rand(3)
    assert torch.equal(expected, after)
    assert _same(a, build_causal_lm(PRESETS["tiny"], seed=7))
    assert not _same(a, build_causal_lm("tiny", seed=8))


def test_dtype_and_errors():
    assert next(build_causal_lm("tiny", dtype="bf16").parameters()).dtype == torch.bfloat16
    assert torch_dtype(torch.float16) is torch.float16
    with pytest.raises(SpecError, match="dtype"):
        torch_dtype("fp8")
    with pytest.raises(SpecError, match="model"):
        build_causal_lm("no-such-model")


def test_local_checkpoint_roundtrip(tmp_path):
    model = build_causal_lm("tiny", seed=3)
    model.save_pretrained(tmp_path / "ckpt")
    loaded = build_causal_lm(str(tmp_path / "ckpt"), seed=99)  # weights come from the files, not the seed
    assert _same(model, loaded)
    critic = build_value_model(str(tmp_path / "ckpt"))
    assert torch.equal(critic.backbone.embed_tokens.weight, model.model.embed_tokens.weight)
    # A directory with only a config builds random weights of that shape.
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text((tmp_path / "ckpt" / "config.json").read_text())
    shaped = build_causal_lm(str(tmp_path / "cfg"), seed=3)
    assert count_parameters(shaped) == count_parameters(model)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((tmp_path / "ckpt" / "config.json").read_text())
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(SpecError, match="broken.*loadable Hugging Face checkpoint"):
        build_causal_lm(str(broken))


def test_value_model_starts_at_zero_and_has_one_value_per_position():
    critic = build_value_model("tiny", seed=0)
    ids, mask = pad_left([[1, 5, 6, 7], [1, 9]], 0)
    values = critic(ids, mask)
    assert values.shape == (2, 4) and values.dtype == torch.float32
    assert values.abs().max() == 0  # zero head: V = 0 until the critic learns
    rm = build_reward_model("tiny", seed=0)
    assert rm(ids, mask).abs().max() > 0


def test_left_padding_does_not_change_logprobs():
    model = build_causal_lm("tiny", seed=0).eval()
    tok = CharTokenizer()
    a, b = tok.encode("3+4= #### 7"), tok.encode("1+1= #### 2 and more")
    ids, mask = pad_left([a, b], tok.pad_id)
    with torch.no_grad():
        batched = token_logprobs(model, ids, mask)
        alone = token_logprobs(model, torch.tensor([a]), torch.ones(1, len(a), dtype=torch.long))
    pad = ids.shape[1] - len(a)
    assert torch.allclose(batched[0, pad:], alone[0], atol=1e-5)
    assert position_ids(mask)[0, pad].item() == 0


def test_unwrap_ddp_like_wrappers():
    model = build_causal_lm("tiny")

    class Wrapper(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

    assert unwrap(Wrapper(Wrapper(model))) is model
