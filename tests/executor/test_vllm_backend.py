"""The `vllm` backend for real, on vLLM's CPU build (`make install-vllm`; `make test-vllm` runs these).

One engine serves the module (starting one takes tens of seconds): its rollouts carry behaviour
log-probs equal to the trainer's recompute, and a weight sync reaches the engine — the probe check
of `weights_arrived` passes after it and fails while the engine still holds the old weights.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from hetprof.errors import ExecutionError
from hetprof.executor.backends import get_backend
from hetprof.executor.models.logprobs import token_logprobs
from hetprof.executor.models.modeling import build_causal_lm, hf_config
from hetprof.executor.models.tokenizer import CharTokenizer
from hetprof.executor.prompts.data import arithmetic_prompts
from hetprof.runtime.vllm_engine import CPU_HEAD_DIMS, check_head_dim, engine_settings
from hetprof.safety.process_guard import proc_stat, start_time

TOK = CharTokenizer()


def test_cpu_settings_fit_one_slot():
    config = hf_config("tiny-2x")
    settings = engine_settings(config, torch.float32, torch.device("cpu"), kv_cache_gib=0.5, cpu_core=1)
    assert settings.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # no process group here: in-process
    assert settings.core is None  # an engine in the caller's process leaves its threads alone
    assert settings.kwargs["kv_cache_memory_bytes"] == 2**29 and settings.kwargs["dtype"] == "float32"
    assert settings.kwargs["max_model_len"] == 512
    # a run's worker is a torch.distributed rank: its engine core gets a process of its own
    own = engine_settings(config, torch.float32, torch.device("cpu"), cpu_core=0, own_process=True)
    assert own.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    # one thread, bound to the slot's core, and the model run in the engine core's own process: not
    # the default extra worker, which busy-polls for a second after every call
    assert own.env["OMP_NUM_THREADS"] == "1" and own.core == 0
    assert own.kwargs["distributed_executor_backend"].endswith("UniProcExecutor")
    with pytest.raises(ExecutionError, match="tensor_parallel_size 1"):
        engine_settings(config, torch.float32, torch.device("cpu"), tensor_parallel_size=2)


def test_cpu_refuses_a_head_size_its_kernels_lack():
    with pytest.raises(ExecutionError, match=r"head_dim is 16.*tiny-2x"):
        check_head_dim(hf_config("tiny"))
    assert hf_config("tiny-2x").head_dim in CPU_HEAD_DIMS


@pytest.fixture(scope="module")
def engine():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (make install-vllm)")
    model = build_causal_lm("tiny-2x", seed=0)
    gen = get_backend("vllm")(model, TOK, device="cpu", kv_cache_gib=0.25, cpu_core=0)
    yield gen
    gen.close()


def _prompts(n: int = 6) -> list[list[int]]:
    return [TOK.encode(p.text) for p in arithmetic_prompts(n, seed=0)]


@pytest.mark.vllm
@pytest.mark.slow
def test_rollout_logprobs_equal_the_trainers_recompute(engine):
    out = engine.generate(_prompts(), 6, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert out.input_ids.shape[0] == 6 and out.lengths.min() >= 1
    with torch.no_grad():
        recomputed = token_logprobs(engine.model, out.input_ids, out.attention_mask)
    mask = out.shifted_mask.bool()
    assert (recomputed - out.shifted_logprobs)[mask].abs().max() < 1e-3


@pytest.mark.vllm
@pytest.mark.slow
def test_a_weight_sync_reaches_the_engine_and_is_checked(engine):
    assert engine.weights_arrived()["logprob_gap"] < 1e-3  # the weights it started with
    other = build_causal_lm("tiny-2x", seed=1)
    engine.load_weights(dict(other.named_parameters()))
    assert engine.logprob_gap() > 1e-2  # the generator's copy moved; the engine has not yet
    assert engine.weights_arrived()["logprob_gap"] < 1e-3
    greedy = engine.generate(_prompts(2), 4, temperature=0.0)
    ref = get_backend("hf")(other, TOK).generate(_prompts(2), 4, temperature=0.0)
    assert greedy.response_ids() == ref.response_ids()


# A run's worker in small: a torch.distributed rank (world of one) that starts a vLLM engine in a
# process of its own, and marks in a file when the engine is up.
STARTING_WORKER = """
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + sys.argv[1] + "/pg", rank=0, world_size=1)
from hetprof.executor.backends import get_backend
from hetprof.executor.models.modeling import build_causal_lm
from hetprof.executor.models.tokenizer import CharTokenizer
get_backend("vllm")(build_causal_lm("tiny-2x", seed=0), CharTokenizer(), device="cpu", kv_cache_gib=0.25)
open(sys.argv[1] + "/up", "w").close()
"""
ENGINE_TITLE = "VLLM::EngineCor"  # vLLM's engine core process names itself so (comm keeps 15 characters)


def _engine_core_of(worker: int) -> int | None:
    """The pid of the vLLM engine core process `worker` started, once it has taken its title."""
    for name in os.listdir("/proc"):
        fields = proc_stat(int(name)) if name.isdigit() else None
        if fields is not None and int(fields[1]) == worker:
            with open(f"/proc/{name}/comm") as f:
                if f.read().strip() == ENGINE_TITLE:
                    return int(name)
    return None


@pytest.mark.vllm
@pytest.mark.slow
def test_a_worker_killed_while_its_engine_starts_takes_the_engine_with_it(tmp_path):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (make install-vllm)")
    worker = subprocess.Popen([sys.executable, "-c", STARTING_WORKER, str(tmp_path)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    engine = None
    try:
        deadline = time.monotonic() + 180  # vLLM's import and the engine core's spawn: tens of seconds
        while engine is None and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
            engine = _engine_core_of(worker.pid)
        assert engine is not None, "the worker started no vLLM engine core"
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        assert not (tmp_path / "up").exists(), "the engine was up before the kill: not the start window"
        deadline = time.monotonic() + 30  # the guardian polls every 0.2 s
        while start_time(engine) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert start_time(engine) is None, "the engine core outlived the worker killed during its start"
    finally:
        worker.kill()
        if engine is not None and start_time(engine) is not None:
            os.kill(engine, signal.SIGKILL)
