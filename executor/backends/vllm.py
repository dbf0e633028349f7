"""Generation with the vLLM engine (optional extra: `pip install hetprof[vllm]`, GPU only).

vLLM is imported only when this backend is constructed, so the package and its registry import on
machines without it; constructing it there raises a clear ExecutionError instead.

The engine is built from a local directory: the caller's model is written there with
`save_pretrained` (shapes and weights exactly as the trainer has them). Prompts go in as token ids
(`skip_tokenizer_init`), so the char tokenizer of the tiny presets works unchanged. Weights are
pushed through vLLM's worker-extension RPC (`collective_rpc`), which hands each bucket to the
model's own `load_weights` — vLLM's supported path for RL weight updates — on every TP worker.

Behaviour log-probs come from vLLM's sampler in `processed_logprobs` mode: after temperature (and
top-p, when it is below 1), which at temperature 1 and top-p 1 equals the trainer's recompute.
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from hetprof.errors import ExecutionError
from hetprof.executor.backends import register_backend
from hetprof.executor.backends.base import GenerationBackend, Rollout, check_sampling
from hetprof.executor.modeling import unwrap
from hetprof.executor.tokenizer import Tokenizer
from hetprof.generation import pad_left

WORKER_EXTENSION = "hetprof.executor.backends.vllm_worker.WeightUpdateExtension"


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


@register_backend("vllm")
class VLLMBackend(GenerationBackend):
    """One vLLM engine (TP over `tensor_parallel_size` GPUs) serving one generation replica."""

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, device: torch.device | str = "cuda",
                 tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.5,
                 dtype: str = "auto", seed: int = 0, enforce_eager: bool = True, **engine_kwargs):
        if not vllm_available():
            raise ExecutionError("backend 'vllm' needs vLLM (pip install 'hetprof[vllm]'); "
                                 "use --backend hf on machines without it")
        if not torch.cuda.is_available():
            raise ExecutionError("backend 'vllm' needs a CUDA GPU; use --backend hf on CPU workers")
        from vllm import LLM

        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self._dir = tempfile.TemporaryDirectory(prefix="hetprof-vllm-")
        unwrap(model).save_pretrained(self._dir.name)
        self.llm = LLM(model=self._dir.name, skip_tokenizer_init=True, tensor_parallel_size=tensor_parallel_size,
                       gpu_memory_utilization=gpu_memory_utilization, dtype=dtype, seed=seed,
                       enforce_eager=enforce_eager, logprobs_mode="processed_logprobs",
                       worker_extension_cls=WORKER_EXTENSION, **engine_kwargs)

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

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        items = [(n[len("module."):] if n.startswith("module.") else n, t.detach())
                 for n, t in named_tensors.items()]
        self.llm.collective_rpc("hetprof_load_weights", args=(items,))

    def close(self) -> None:
        del self.llm
        self._dir.cleanup()
