"""A tiny Qwen3-MoE (transformers' Qwen3MoeForCausalLM at the `tiny-moe` preset, random weights)
trains with GRPO end to end on CPU: hf generation, log-probs, data-parallel training, weight sync,
a Hugging Face export — and with expert parallelism (actor_train and ref_infer DP2 EP2: each rank
holds half of every MoE layer's experts) the same losses and gradient norms as without, to rounding,
also across a resume from its checkpoint (which holds every expert, gathered).

Two runs share one module-scoped fixture (each `hetprof run` starts worker processes): the same plan
with EP1 and with EP2. The `vllm` tests (make test-vllm) run the tiny MoE on vLLM's CPU build:
generation at the model's log-probs, an in-place reload of new experts (which needs the worker's
workaround in hetprof/runtime/vllm_worker.py), a GRPO run whose every sync is checked, and the HF
export served by vLLM. vLLM's CPU attention kernels have no head size 16 (tiny-moe's, as tiny's), so
these tests take tiny-moe at head size 32 — the same Qwen3-MoE layers.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import types
from pathlib import Path

import pytest
import torch
from test_executor_runtime_run import ROOT, hetprof_run

from hetprof.executor.checkpoints.hf_export import _write_actor, export_folder
from hetprof.executor.launch.handwritten_plan import handwritten_plan
from hetprof.executor.models.logprobs import token_logprobs
from hetprof.executor.models.modeling import build_causal_lm
from hetprof.executor.models.tokenizer import CharTokenizer
from hetprof.executor.records.run_log import read_log
from hetprof.runtime.vllm_engine import engine_settings
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.specs.models import PRESETS

pytestmark = pytest.mark.slow  # multi-process: `make test-fast` leaves it out

BOTH = ["localhost:0", "localhost:1"]
PLACEMENT = {"actor_gen": BOTH, "ref_infer": BOTH, "actor_train": BOTH}


def moe_plan(path: Path, ep: int) -> Path:
    """The tiny MoE's GRPO plan on two CPU slots, actor_train and ref_infer at expert-parallel degree `ep`."""
    cluster = ClusterSpec.from_dict({"name": "cpu", "hosts": [{"name": "localhost", "gpus": {"type": "cpu",
                                                                                              "count": 2}}]})
    workload = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    # two mini-batches, so each update clips and steps twice; the reference's replicas take uneven rows
    # (the trainer's stay even: a resume restores one shuffler for every replica, which only replicas
    # of equal shares continue alike)
    workload.update({"prompts_per_step": 4, "responses_per_prompt": 4, "ppo_epochs": 1, "mini_batches": 2,
                     "models": {"actor": "tiny-moe"}})
    handwritten_plan(cluster, workload, PLACEMENT, shares={"ref_infer": [0.75, 0.25]},
                     expert_parallel={"actor_train": ep, "ref_infer": ep}).save(path)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, Path]:
    """Each EP degree's run folder (run.jsonl; checkpoint and HF export after iteration 2): EP1 runs
    2 iterations straight, EP2 one, then resumes from its checkpoint for the second."""
    out = {}
    for ep, legs in ((1, (("--iterations", "2"),)), (2, (("--iterations", "1"), ("--iterations", "2", "--resume")))):
        tmp = tmp_path_factory.mktemp(f"ep{ep}")
        # a reward that differs between a group's responses (a random model rarely answers right), so
        # the advantages and with them every gradient are not zero
        (tmp / "spread.py").write_text("def score(prompt, response, answer):\n    return float(sum(map(ord, response)) % 7)\n")
        plan = moe_plan(tmp / "plan.json", ep)
        for leg in legs:
            done = hetprof_run(plan, tmp, *leg, "--verify-sync", "--reward", "spread.py:score",
                               "--checkpoint-dir", str(tmp / "ckpt"), "--checkpoint-every", "1")
            assert done.returncode == 0, done.stderr[-3000:]
        out[ep] = tmp
    return out


def test_tiny_qwen3_moe_trains_with_grpo_on_cpu(runs):
    records = read_log(runs[1] / "run.jsonl")
    assert [r["iteration"] for r in records] == [0, 1]
    assert all(r["sync_verified"] is True for r in records)
    assert all(math.isfinite(r["kl"]) and math.isfinite(r["grad_norm"]) for r in records)
    assert records[0]["layouts"]["actor_train"] == "DP2×TP1×PP1"


def test_expert_parallel_training_resumed_equals_one_expert_group(runs):
    one, two = (read_log(runs[ep] / "run.jsonl") for ep in (1, 2))
    assert two[0]["layouts"]["actor_train"] == "DP2×TP1×PP1 EP2"
    assert two[0]["layouts"]["ref_infer"] == "DP2×TP1×PP1 EP2"
    assert all(r["sync_verified"] is True for r in two)  # the generators got the gathered experts
    assert all(r["grad_norm"] > 0 for r in one) and one[1]["kl"] != 0  # updates that moved the model
    for a, b in zip(one, two, strict=True):
        for key in ("policy_loss", "grad_norm", "kl", "entropy", "reward_mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (b["iteration"], key)


def _state(run: Path) -> dict[str, torch.Tensor]:
    from hetprof.executor.checkpoints import checkpoint

    folder = checkpoint.task_dir(run / "ckpt", "actor_train") / checkpoint.iteration_folder(2)
    return checkpoint.load(folder, map_location="cpu")[0]["model"]


def test_checkpoint_and_export_hold_the_whole_trained_model(runs):
    from transformers import AutoModelForCausalLM

    one, two = _state(runs[1]), _state(runs[2])
    assert set(two) == set(one)  # an EP checkpoint holds every expert, as one replica's would
    # Adam divides by the gradients' RMS, so an element whose gradient is near zero turns rounding
    # into up to a few thousandths of a step (lr 0.01): equal well within a hundredth of one
    for name, tensor in one.items():
        torch.testing.assert_close(two[name], tensor, rtol=0, atol=1e-4, msg=name)
    exported = AutoModelForCausalLM.from_pretrained(export_folder(runs[2] / "ckpt", 2, "actor")).eval()
    trained = build_causal_lm("tiny-moe")
    trained.load_state_dict(two)
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=ids).logits, trained.eval()(input_ids=ids).logits,
                                   rtol=1e-5, atol=1e-5)


# ---- vLLM's CPU build (make install-vllm; make test-vllm runs these) ----------------------------------
MOE_HD32 = dataclasses.replace(PRESETS["tiny-moe"], name="tiny-moe-hd32", head_dim=32)
TOK = CharTokenizer()


def _need_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (make install-vllm)")


def _served_logprobs(llm, ids: list[int], sampled: list[int] | None = None, **sampling) -> tuple[list[int], torch.Tensor]:
    """One sampled response to `ids` and the engine's log-prob of each of its tokens."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(logprobs=0, **sampling),
                       use_tqdm=False)[0].outputs[0]
    tokens = list(out.token_ids)
    return tokens, torch.tensor([step[t].logprob for step, t in zip(out.logprobs, tokens, strict=True)])


def _recomputed(model, ids: list[int], tokens: list[int]) -> torch.Tensor:
    full = torch.tensor([ids + tokens])
    with torch.no_grad():
        return token_logprobs(model, full, torch.ones_like(full))[0, len(ids) - 1:]


@pytest.fixture(scope="module")
def moe_engine(tmp_path_factory):
    """A vLLM CPU engine started from the tiny MoE (at head size 32) as a run's `vllm` backend starts
    one: in a process of its own, which this closes."""
    _need_vllm()
    from hetprof.runtime.vllm_engine import WORKER_EXTENSION, start_engine

    model = build_causal_lm(MOE_HD32, seed=0).eval()
    folder = tmp_path_factory.mktemp("engine")
    settings = engine_settings(model.config, torch.float32, torch.device("cpu"), kv_cache_gib=0.25, cpu_core=0,
                               own_process=True, worker_extension=WORKER_EXTENSION)
    llm = start_engine(model, str(folder), settings)
    yield llm, model, folder
    engine = getattr(llm.llm_engine, "engine_core", None)
    if engine is not None and hasattr(engine, "shutdown"):
        engine.shutdown()


@pytest.mark.vllm
def test_vllm_on_cpu_generates_with_the_tiny_moe_at_the_models_logprobs(moe_engine):
    llm, model, _ = moe_engine
    ids = TOK.encode("what is 12+7?")
    tokens, served = _served_logprobs(llm, ids, max_tokens=8, temperature=1.0, seed=0)
    assert len(tokens) >= 1 and (_recomputed(model, ids, tokens) - served).abs().max() < 1e-3


@pytest.mark.vllm
def test_vllm_on_cpu_reloads_the_tiny_moes_experts_in_place(moe_engine):
    from hetprof.runtime.vllm_engine import reload_weights

    llm, _, folder = moe_engine
    other = build_causal_lm(MOE_HD32, seed=1).eval()  # a trainer's new weights, every expert among them
    reload_weights(llm, other, str(folder))
    ids = TOK.encode("what is 3+4?")
    tokens, served = _served_logprobs(llm, ids, max_tokens=6, temperature=1.0, seed=1)
    assert (_recomputed(other, ids, tokens) - served).abs().max() < 1e-3


@pytest.mark.vllm
def test_tiny_moe_trains_with_grpo_on_vllms_cpu_build_each_sync_checked(tmp_path):
    """The whole loop with the `vllm` backend: the engine generates, and after every update its
    log-probs of the probe equal the trainer's recompute on the synced copy, experts included."""
    _need_vllm()
    (tmp_path / "config.json").write_text(json.dumps(MOE_HD32.to_hf_config()))
    cluster = ClusterSpec.from_dict({"name": "cpu", "hosts": [{"name": "localhost", "gpus": {"type": "cpu",
                                                                                              "count": 2}}]})
    workload = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny-vllm.yaml").to_dict()
    workload.update({"prompts_per_step": 4, "responses_per_prompt": 4, "ppo_epochs": 1, "mini_batches": 1,
                     "models": {"actor": str(tmp_path / "config.json")}})
    (tmp_path / "spread.py").write_text("def score(prompt, response, answer):\n    return float(sum(map(ord, response)) % 7)\n")
    plan = handwritten_plan(cluster, workload, {"actor_gen": ["localhost:0"], "ref_infer": ["localhost:1"],
                                                "actor_train": ["localhost:1"]}, backend="vllm")
    plan.save(tmp_path / "plan.json")
    done = hetprof_run(tmp_path / "plan.json", tmp_path, "--iterations", "2", "--verify-sync",
                       "--reward", "spread.py:score", "--timeout", "300", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_log(tmp_path / "run.jsonl")
    assert [r["iteration"] for r in records] == [0, 1]
    assert all(r["grad_norm"] > 0 for r in records)  # updates that moved the experts the engine reloads
    gaps = [r["generator_logprob_gap"] for r in records]
    assert all(g is not None and g < 1e-3 for g in gaps), gaps
    assert all(r["sync_verified"] is True for r in records)


@pytest.mark.vllm
def test_the_tiny_moe_export_is_served_by_vllm_with_the_models_logprobs(tmp_path):
    _need_vllm()
    model = build_causal_lm(MOE_HD32, seed=5).eval()
    workload = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny-vllm.yaml")
    run = types.SimpleNamespace(tokenizer=TOK, training=workload.training, workload=workload)
    _write_actor(tmp_path / "actor", model.state_dict(), MOE_HD32, run)
    settings = engine_settings(model.config, torch.float32, torch.device("cpu"), kv_cache_gib=0.25,
                               cpu_core=0, own_process=False)
    os.environ.update(settings.env)
    from vllm import LLM

    llm = LLM(model=str(tmp_path / "actor"), **{**settings.kwargs, "skip_tokenizer_init": False})
    try:
        assert llm.get_tokenizer().encode("what is 12+7?") == TOK.encode("what is 12+7?")  # the export's own
        ids = TOK.encode("what is 12+7?")
        tokens, served = _served_logprobs(llm, ids, max_tokens=8, temperature=1.0, seed=0)
    finally:
        engine = getattr(llm.llm_engine, "engine_core", None)
        if engine is not None and hasattr(engine, "shutdown"):
            engine.shutdown()
    assert len(tokens) >= 1 and (_recomputed(model, ids, tokens) - served).abs().max() < 1e-3
