"""Third-party lines that tell a run's user nothing are gone, each by its own cause or a narrow filter."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

from hetprof.executor.models.modeling import build_causal_lm
from hetprof.runtime.generation import cache_argument, sample_continuations
from hetprof.runtime.vllm_worker import quiet_known_noise

pytestmark = pytest.mark.usefixtures("one_thread")


def test_generation_passes_the_kv_cache_by_the_name_the_model_takes():
    """transformers 5.2x renamed `past_key_values` to `cache` and warns (FutureWarning) on every call with the
    old name: generation uses the name the model's forward declares, so nothing warns."""
    model = build_causal_lm("tiny", seed=0, dtype=torch.float32, device="cpu").eval()
    import inspect

    assert cache_argument(model) == ("cache" if "cache" in inspect.signature(model.forward).parameters
                                     else "past_key_values")
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        out = sample_continuations(model, [[5, 6, 7], [8, 9]], 3, temperature=1.0, top_p=1.0,
                                   generator=torch.Generator().manual_seed(0), pad_id=0, eos_id=2)
    assert out.tokens.shape[0] == 2
    assert not [w for w in caught if "past_key_values" in str(w.message)], [str(w.message) for w in caught]


def test_only_the_known_vllm_lines_are_filtered(caplog):
    """The tied head's and the rotary cache's reload lines and the chat-template warm-up traceback are
    dropped; the same message for another layer, and every other line of those loggers, still shows."""
    quiet_known_noise()
    quiet_known_noise()  # idempotent: one filter per logger
    reload = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    renderer = logging.getLogger("vllm.renderers.base")
    assert sum(type(f).__name__ == "_KnownNoise" for f in reload.filters) == 1
    with caplog.at_level(logging.DEBUG):
        reload.warning("%s: Failed to load weights", "ParallelLMHead")
        reload.warning("%s: Failed to load weights", "RotaryEmbedding")
        reload.warning("%s: Failed to load weights", "QKVParallelLinear")
        renderer.warning("Chat template warmup failed", exc_info=True)
        renderer.warning("Multi-modal warmup failed")
    assert [r.getMessage() for r in caplog.records] == ["QKVParallelLinear: Failed to load weights",
                                                       "Multi-modal warmup failed"]
