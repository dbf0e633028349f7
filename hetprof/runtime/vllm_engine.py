"""How a vLLM engine is set up for one generation slot: engine arguments, process environment, and
the checkpoint folder it starts from. Shared by the executor's `vllm` backend and the profiler's
`vllmgen` suite, so the profiler times the engine the executor runs.

On a GPU the engine gets a share of the device's memory. On a `cpu` worker slot (one core, see
the cluster spec) it gets what the slot has: a fixed KV-cache size, one thread, its process bound
to the slot's core, and the model's own dtype when the CPU kernels take it. There the model runs
inside the engine core's process (vLLM's single-process executor), not in the extra worker
process vLLM's CPU build starts by default: that worker busy-polls its request queue for a second
after every call and assumes a core of its own for the engine core beside it, so in a run, where
each core also trains, it takes CPU from the slot's training and from the other slot's engine.

Where the engine core runs: in a process of its own when the caller is a rank of a torch.distributed
job (a run's worker), because vLLM builds its process groups on an already initialised default
group — a collective every other rank of the run would have to join; inside the caller otherwise
(tests), which saves starting a process. The profiler asks for its own process, to time what a
run's calls cost.
vLLM's CPU attention kernels exist for a fixed set of head sizes; a model with another is refused
before the engine starts, naming the size.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import os
from typing import Any

import torch

from hetprof.errors import ExecutionError
from hetprof.runtime.cpuslots import slot_core

# vLLM's CPU attention backend (vllm/v1/attention/backends/cpu_attn.py: get_supported_head_sizes)
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
DEFAULT_CPU_KV_CACHE_GIB = 1.0
VLLM_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
# mixed into vLLM's workers, which import it by path: the weight reload after a sync (vllm_worker.py)
WORKER_EXTENSION = "hetprof.runtime.vllm_worker.WeightUpdateExtension"
# by path, so that vLLM's CPU platform keeps it (it swaps the name "uni" for its multi-process executor)
SINGLE_PROCESS_EXECUTOR = "vllm.v1.executor.uniproc_executor.UniProcExecutor"


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """Keyword arguments for `vllm.LLM`, the environment variables to set before it starts, and the
    CPU core its process is bound to once started (None: left where the OS puts it)."""

    kwargs: dict
    env: dict[str, str]
    core: int | None = None


def check_head_dim(config) -> None:
    """Refuse a model vLLM's CPU attention cannot run, before an engine spends time starting."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim not in CPU_HEAD_DIMS:
        raise ExecutionError(f"backend 'vllm' on CPU: the model's head_dim is {head_dim}, and vLLM's CPU attention "
                             f"runs only head_dim in {', '.join(map(str, CPU_HEAD_DIMS))} (use a model with one of "
                             f"those, e.g. the tiny-2x preset, or --backend hf)")


def engine_settings(config, dtype: torch.dtype, device: torch.device, *, tensor_parallel_size: int = 1,
                    gpu_memory_utilization: float = 0.5, kv_cache_gib: float | None = None,
                    cpu_core: int | None = None, seed: int = 0,
                    worker_extension: str | None = None, own_process: bool | None = None) -> EngineSettings:
    """The engine a generation replica runs on `device`, for a model of `config` held in `dtype`;
    `worker_extension` names a class mixed into vLLM's workers (the executor's weight updates);
    `own_process` puts the engine core in a process of its own (default: when torch.distributed is
    initialised here)."""
    if own_process is None:
        own_process = torch.distributed.is_available() and torch.distributed.is_initialized()
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1" if own_process else "0",
           "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
    limit = getattr(config, "max_position_embeddings", None)
    kwargs = {"skip_tokenizer_init": True, "tensor_parallel_size": tensor_parallel_size, "seed": seed,
              "enforce_eager": True, "logprobs_mode": "processed_logprobs",
              "dtype": VLLM_DTYPES.get(dtype, "auto")}
    if worker_extension:
        kwargs["worker_extension_cls"] = worker_extension
    if limit:
        kwargs["max_model_len"] = int(limit)
    if device.type != "cpu":
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        return EngineSettings(kwargs, env)
    check_head_dim(config)
    if tensor_parallel_size != 1:
        raise ExecutionError("backend 'vllm' on CPU runs one engine per cpu slot (tensor_parallel_size 1); "
                             "plan the generator with --max-tp 1")
    # whole prefills only: vLLM's CPU build fails on a seeded request whose prefill was split ("CPU
    # Generator does not use offset"), and the executor seeds every request
    kwargs["enable_chunked_prefill"] = False
    gib = DEFAULT_CPU_KV_CACHE_GIB if kv_cache_gib is None else kv_cache_gib
    kwargs["kv_cache_memory_bytes"] = int(gib * 2**30)
    kwargs["distributed_executor_backend"] = SINGLE_PROCESS_EXECUTOR
    core = slot_core() if cpu_core is None else cpu_core
    # one thread (read by the engine core's process as it starts); an engine inside the caller's
    # process runs on the caller's threads and binds nothing
    return EngineSettings(kwargs, {**env, "OMP_NUM_THREADS": "1"}, core if own_process else None)


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def write_checkpoint(model: torch.nn.Module, folder: str) -> None:
    """The model as a Hugging Face checkpoint folder for the engine to start from.

    Not `save_pretrained`: under torch.distributed transformers writes only on rank 0, and every
    generator rank needs its own folder. Tensors are copied out because a flattened model's
    parameters share one buffer, which safetensors refuses; a tied head is the embedding's. The
    config names the model class, as `save_pretrained` would: without it vLLM takes the folder for a
    pooling (embedding) model.
    """
    config = copy.deepcopy(model.config)
    config.architectures = [type(model).__name__]
    config.save_pretrained(folder)
    write_weights(model, os.path.join(folder, "model.safetensors"))


def write_weights(model: torch.nn.Module, path: str, *, tied_head: bool = False) -> None:
    """The model's state as one safetensors file, checkpoint-named. A tied head is left to the
    embedding unless `tied_head`: a reload needs it, since on CPU vLLM repacks the head's weight
    into a GEMM layout of its own, which reloading the embedding alone leaves stale."""
    from safetensors.torch import save_file

    tied = not tied_head and bool(getattr(model.config, "tie_word_embeddings", False))
    state = {n: t.detach().clone().contiguous() for n, t in model.state_dict().items()
             if not (tied and n == "lm_head.weight")}
    save_file(state, path, metadata={"format": "pt"})


def start_engine(model: torch.nn.Module, folder: str, settings: EngineSettings, **engine_kwargs: Any) -> Any:
    """A `vllm.LLM` on a checkpoint of `model` written to `folder`, with `settings` (environment first:
    vLLM reads it as the engine starts, in this process), its process bound to the settings' core
    (the engine needs WORKER_EXTENSION for that)."""
    os.environ.update(settings.env)
    from vllm import LLM

    from hetprof.runtime.vllm_worker import quiet_known_noise

    quiet_known_noise()  # the engine's front end starts here (its chat-template warm-up logs here)

    write_checkpoint(model, folder)
    llm = LLM(model=folder, **{**settings.kwargs, **engine_kwargs})
    if settings.core is not None:
        llm.collective_rpc("hetprof_bind_to_core", args=(settings.core,))
    return llm


def reload_weights(llm: Any, model: torch.nn.Module, folder: str) -> None:
    """Push `model`'s weights into a running engine started with WORKER_EXTENSION: a safetensors file
    in `folder`, reloaded in place by every engine worker; the prompt cache is dropped, since its KV
    was computed with the old weights."""
    path = os.path.join(folder, "sync.safetensors")
    write_weights(model, path, tied_head=True)
    llm.collective_rpc("hetprof_load_weights", args=(path,))
    llm.reset_prefix_cache()


def probe_logprobs(llm: Any, ids: list[int]) -> list[float]:
    """The engine's log-prob of each token of `ids` after the first (prompt log-probs, temperature 1)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out = llm.generate([TokensPrompt(prompt_token_ids=list(ids))],
                       SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False), use_tqdm=False)[0]
    return [float(step[t].logprob) for step, t in zip(out.prompt_logprobs[1:], ids[1:], strict=True)]
