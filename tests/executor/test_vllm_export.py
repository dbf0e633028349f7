"""The run's Hugging Face export of the actor is what vLLM serves: it loads with its own tokenizer
and scores the tokens it samples as the trained model does."""

from __future__ import annotations

import importlib.util
import os
import types
from pathlib import Path

import pytest
import torch

from hetprof.executor.checkpoints.hf_export import _write_actor
from hetprof.executor.models.logprobs import token_logprobs
from hetprof.executor.models.modeling import build_causal_lm
from hetprof.executor.models.tokenizer import CharTokenizer
from hetprof.runtime.vllm_engine import engine_settings
from hetprof.specs import WorkloadSpec

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny-vllm.yaml")


def test_actor_export_loads_in_vllm_with_its_tokenizer_and_the_models_logprobs(tmp_path):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (make install-vllm)")
    model = build_causal_lm("tiny-2x", seed=5).float().eval()
    run = types.SimpleNamespace(tokenizer=CharTokenizer(), training=WORKLOAD.training, workload=WORKLOAD)
    _write_actor(tmp_path / "actor", model.state_dict(), "tiny-2x", run)
    settings = engine_settings(model.config, torch.float32, torch.device("cpu"), kv_cache_gib=0.25,
                               cpu_core=0, own_process=False)
    os.environ.update(settings.env)
    from vllm import LLM, SamplingParams

    # the export's own tokenizer, not the executor's token ids: as a user serving it would load it
    llm = LLM(model=str(tmp_path / "actor"), **{**settings.kwargs, "skip_tokenizer_init": False})
    try:
        prompt = "what is 12+7?"
        ids = CharTokenizer().encode(prompt)
        assert llm.get_tokenizer().encode(prompt) == ids
        out = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=1.0, seed=0, logprobs=0))[0]
        sampled = list(out.outputs[0].token_ids)
        served = torch.tensor([step[t].logprob for step, t in zip(out.outputs[0].logprobs, sampled, strict=True)])
    finally:
        engine = getattr(llm.llm_engine, "engine_core", None)
        if engine is not None and hasattr(engine, "shutdown"):
            engine.shutdown()
    full = torch.tensor([ids + sampled])
    with torch.no_grad():
        recomputed = token_logprobs(model, full, torch.ones_like(full))[0, len(ids) - 1:]
    assert len(sampled) >= 1 and (recomputed - served).abs().max() < 1e-3
