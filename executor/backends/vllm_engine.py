"""How a vLLM engine is set up for one generation slot: engine arguments and process environment.

On a GPU the engine gets a share of the device's memory. On a `cpu` worker slot (one core, see
the cluster spec) it gets what the slot has: a fixed KV-cache size, OpenMP threads bound to the
slot's core, the model's own dtype when the CPU kernels take it, and the engine core inside the
worker process (no extra process: a worker that dies takes its engine with it, as with `hf`).
vLLM's CPU attention kernels exist for a fixed set of head sizes; a model with another is refused
before the engine starts, naming the size.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from hetprof.errors import ExecutionError

# vLLM's CPU attention backend (vllm/v1/attention/backends/cpu_attn.py: get_supported_head_sizes)
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
DEFAULT_CPU_KV_CACHE_GIB = 1.0
WORKER_EXTENSION = "hetprof.executor.backends.vllm_worker.WeightUpdateExtension"
VLLM_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """Keyword arguments for `vllm.LLM` and the environment variables to set before it starts."""

    kwargs: dict
    env: dict[str, str]


def slot_core(local_rank: int | None = None) -> int:
    """The CPU core a worker slot owns: its index among this host's workers (torchrun's LOCAL_RANK),
    mapped onto the cores this process may run on."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    index = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
    return cores[index % len(cores)]


def check_head_dim(config) -> None:
    """Refuse a model vLLM's CPU attention cannot run, before an engine spends time starting."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim not in CPU_HEAD_DIMS:
        raise ExecutionError(f"backend 'vllm' on CPU: the model's head_dim is {head_dim}, and vLLM's CPU attention "
                             f"runs only head_dim in {', '.join(map(str, CPU_HEAD_DIMS))} (use a model with one of "
                             f"those, e.g. the tiny-2x preset, or --backend hf)")


def engine_settings(config, dtype: torch.dtype, device: torch.device, *, tensor_parallel_size: int = 1,
                    gpu_memory_utilization: float = 0.5, kv_cache_gib: float | None = None,
                    cpu_core: int | None = None, seed: int = 0) -> EngineSettings:
    """The engine a generation replica runs on `device`, for a model of `config` held in `dtype`."""
    limit = getattr(config, "max_position_embeddings", None)
    kwargs = {"skip_tokenizer_init": True, "tensor_parallel_size": tensor_parallel_size, "seed": seed,
              "enforce_eager": True, "logprobs_mode": "processed_logprobs", "worker_extension_cls": WORKER_EXTENSION,
              "dtype": VLLM_DTYPES.get(dtype, "auto")}
    if limit:
        kwargs["max_model_len"] = int(limit)
    if device.type != "cpu":
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        return EngineSettings(kwargs, {})
    check_head_dim(config)
    if tensor_parallel_size != 1:
        raise ExecutionError("backend 'vllm' on CPU runs one engine per cpu slot (tensor_parallel_size 1); "
                             "plan the generator with --max-tp 1")
    gib = DEFAULT_CPU_KV_CACHE_GIB if kv_cache_gib is None else kv_cache_gib
    kwargs["kv_cache_memory_bytes"] = int(gib * 2**30)
    core = slot_core() if cpu_core is None else cpu_core
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": str(core),
           "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
    return EngineSettings(kwargs, env)
