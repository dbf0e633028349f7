"""The code vLLM runs inside its workers to take new weights (named by import path, as vLLM asks).

Kept apart from `vllm_engine.py` and the executor's backend so that vLLM's worker processes import only this small module.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time

import torch

from hetprof.safety.process_guard import proc_stat

PARENT_POLL_S = 0.5
MAX_CHAIN = 4  # processes from the model runner up to the worker, the worker excluded

# vLLM log lines that tell a run's user nothing, each named by logger, message template and
# arguments (None: any) — never a whole logger or level, so every other warning still shows.
KNOWN_NOISE: tuple[tuple[str, str, tuple | None], ...] = (
    # every weight reload, per engine: the tied LM head loads nothing of its own (its weight is the
    # embedding's); the log-prob probe after every sync proves the weights arrived
    ("vllm.model_executor.model_loader.reload.layerwise", "%s: Failed to load weights", ("ParallelLMHead",)),
    # ...and the rotary embedding: its cos/sin cache is computed from the config, in no checkpoint,
    # and vLLM keeps it (seen on every sync with vLLM 0.32's CPU build)
    ("vllm.model_executor.model_loader.reload.layerwise", "%s: Failed to load weights", ("RotaryEmbedding",)),
    # engine start: prompts go in as token ids (skip_tokenizer_init), so there is no chat template to warm
    # up, and the failure's traceback is printed in full
    ("vllm.renderers.base", "Chat template warmup failed", None),
)


class _KnownNoise(logging.Filter):
    """Drops one logger's records whose (template, arguments) KNOWN_NOISE lists."""

    def __init__(self, lines: list[tuple[str, tuple | None]]) -> None:
        super().__init__()
        self.lines = lines

    def filter(self, record: logging.LogRecord) -> bool:
        args = tuple(record.args) if isinstance(record.args, tuple) else None
        return not any(record.msg == msg and (want is None or args == want) for msg, want in self.lines)


def quiet_known_noise() -> None:
    """Filter KNOWN_NOISE out of vLLM's loggers in this process (once; a second call adds nothing)."""
    lines: dict[str, list[tuple[str, tuple | None]]] = {}
    for name, msg, args in KNOWN_NOISE:
        lines.setdefault(name, []).append((msg, args))
    for name, wanted in lines.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _KnownNoise) for f in logger.filters):
            logger.addFilter(_KnownNoise(wanted))


def _redo_cpu_expert_setup(model: torch.nn.Module) -> None:
    """Make the next reload set up each fused-MoE layer's CPU kernel as the first load did.

    vLLM (0.32, CPU build) treats a reload as a weight update once a layer's MoE kernel exists, and
    its update path skips the CPU experts' own post-load step: padding the expert width to the
    kernel's alignment and prepacking it. The reload's copy back into the kernel's (padded, packed)
    tensors then fails or leaves the old experts. Forgetting the kernel sends the reload through the
    first-load path again; on CPU no CUDA graph holds the old kernel, so nothing else refers to it.
    """
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        kernel = getattr(method, "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is not None and hasattr(experts, "_pad_moe_intermediate"):  # the CPU experts' step
            method.moe_kernel = None


class WeightUpdateExtension:
    """Mixed into vLLM's worker class through `worker_extension_cls`."""

    def hetprof_load_weights(self, path: str) -> None:
        """Take a full set of checkpoint-named tensors from a safetensors file the worker wrote.

        A file, not tensors in the call: the call reaches this process through vLLM's engine core,
        and its second hop (shared-memory broadcast to the model runners) cannot carry tensors. Through
        vLLM's in-place reload rather than the model's `load_weights`: on CPU vLLM repacks each linear
        layer's weight into its GEMM kernel's layout after loading and frees the original, so only a
        reload (which re-runs that step) reaches the weights the kernels read.
        """
        from safetensors.torch import load_file

        quiet_known_noise()  # in the engine's process, where the reload logs
        device = self.device
        if device.type == "cpu":
            _redo_cpu_expert_setup(self.model_runner.model)
        self.reload_weights(weights_iterator=[(n, t.to(device)) for n, t in load_file(path).items()])
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def hetprof_bind_to_core(self, core: int) -> None:
        """Keep every thread of this process (the engine's) on one CPU core: a `cpu` slot's. Threads
        started later inherit it from the thread that starts them."""
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(tid), {core})

    def hetprof_exit_with_parent(self, parent: int) -> int:
        """Make the engine's processes end when the run's worker that started them dies (even by
        SIGKILL, which runs no clean-up in the worker). The model runner (where this runs) is the
        engine core's process, a child of the worker, or with vLLM's multi-process executor a child of
        that: a watch here checks every link of that chain, and once one breaks kills the processes
        between here and the worker and exits. Returns this process's pid."""
        me = os.getpid()
        if me == parent:  # an engine inside the caller's own process needs no watch
            return me
        chain = [me]  # this process, then its ancestors below the worker
        while (up := parent_of(chain[-1])) != parent:
            if up is None or up <= 1 or len(chain) >= MAX_CHAIN:
                raise RuntimeError(f"vLLM's model runner (pid {me}) does not descend from the worker (pid {parent})")
            chain.append(up)
        links = {pid: parent_of(pid) for pid in chain}

        def watch() -> None:
            while all(parent_of(pid) == up for pid, up in links.items()):
                time.sleep(PARENT_POLL_S)
            for pid in chain[1:]:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            os._exit(1)

        threading.Thread(target=watch, name="hetprof-parent-watch", daemon=True).start()
        return me


def parent_of(pid: int) -> int | None:
    """The parent pid of `pid` (None when it is gone or cannot be read: not Linux)."""
    if pid == os.getpid():
        return os.getppid()
    fields = proc_stat(pid)
    return None if fields is None else int(fields[1])
