"""Whole vLLM generation calls: `task.generate` rows tagged `backend: vllm`, on request (`--suite vllmgen`).

The `hf` backend's calls are the tasks suite's `generate` rows; a vLLM engine runs the same call in
its own kernels, scheduler and sampler, at a different cost, so `hetprof fit` learns what a vLLM call
costs beyond the fitted phases from these rows alone (costmodels/calloverhead.py, per backend). The
engine is set up as the executor's `vllm` backend sets it up on a worker slot (hetprof.runtime.vllm_engine:
KV-cache size, one thread bound to one core, the model's dtype, the engine core in a process of
its own) and is started once per model;
each timed call generates GENERATE_NEW_TOKENS tokens for every prompt (no early stop), as the `hf`
rows do. Points: the tasks suite's `generate` grid plus the job's shapes (`--workload`).

It also times the engine's weight reload after a sync, as the backend does it (`task.weight_reload`
rows tagged `backend: vllm`, with the weights' bytes): write the weights, have the engine reload them
in place, and check one probe sequence's log-probs against a forward of the model. A run pays this
on every sync on top of moving the bytes, so `hetprof fit` learns it as its own term of the sync
(costmodels/enginereload.py) rather than inside the generation call.

Runs last: a CPU engine binds this process's threads to one core for the rest of the run.
"""

from __future__ import annotations

import statistics
import tempfile
from typing import Any

from hetprof.errors import ExecutionError
from hetprof.profiler import taskmodels
from hetprof.profiler.context import ProfileContext
from hetprof.profiler.registry import Suite, register_suite
from hetprof.profiler.suites.tasks import GENERATE_NEW_TOKENS, TIMERS, default_dtype
from hetprof.profiler.timing import measure

BENCHMARK = "task.generate"
RELOAD_BENCHMARK = "task.weight_reload"
BACKEND = "vllm"
PROBE_TOKENS = 32  # the backend's weight-sync probe: 24 prompt + 8 response tokens
KV_CACHE_GIB = 0.5  # room for the largest grid point (64 × 300 tokens of a tiny preset) many times over


def call_prompts(vocab: int, batch: int, length: int, gen: Any) -> list[list[int]]:
    """The prompts of one timed call: random ids, every other prompt an eighth shorter (the padded RL
    batch the `hf` rows time; vLLM itself pads nothing)."""
    import torch

    ids = torch.randint(3, vocab, (batch, length), generator=gen).tolist()
    return [row[length // 8:] if i % 2 and length >= 8 else row for i, row in enumerate(ids)]


def row_params(tm: taskmodels.TaskModel, batch: int, length: int, threads: int) -> dict:
    """A sample's params: the `hf` generate row's, plus the engine that made the call."""
    return {**tm.shape_params(), "batch": batch, "seq_len": length, "threads": threads,
            "new_tokens": GENERATE_NEW_TOKENS, "backend": BACKEND}


def reload_sample(tm: taskmodels.TaskModel, weight_bytes: int, threads: int, seconds: float) -> dict:
    """One timed weight reload: what `hetprof fit` reads from it (costmodels/enginereload.py)."""
    return {"params": {"model": tm.shape.name, "dtype": tm.dtype, "weight_bytes": weight_bytes, "threads": threads,
                       "backend": BACKEND}, "metrics": {"seconds": seconds}}


@register_suite
class VLLMGenerateSuite(Suite):
    name = "vllmgen"
    default = False
    help = "whole vLLM generation calls (task.generate rows, backend vllm; needs make install-vllm)"

    def _models(self, ctx: ProfileContext) -> list[taskmodels.TaskModel]:
        dtype = ctx.options.get("dtype") or default_dtype(ctx.device)
        tms = [taskmodels.plan_model(m, dtype, None) for m in ctx.models]
        return [tm for tm in tms if tm.with_head]

    def steps(self, ctx: ProfileContext) -> int:
        return sum(len(TIMERS["generate"].points(ctx, tm.shape.max_position)) for tm in self._models(ctx))

    def run(self, ctx: ProfileContext) -> None:
        from hetprof.runtime.vllm_engine import vllm_available

        if not vllm_available():
            ctx.note("vllmgen: vLLM is not installed (make install-vllm), nothing measured")
            return
        for tm in self._models(ctx):
            points = TIMERS["generate"].points(ctx, tm.shape.max_position)
            try:
                self._model(ctx, tm, points)
            except ExecutionError as exc:  # a shape the engine cannot run on this device
                ctx.note(f"vllmgen {tm.shape.name}: {exc}")
                ctx.advance(len(points))

    def _model(self, ctx: ProfileContext, tm: taskmodels.TaskModel, points: list[tuple[int, int]]) -> None:
        import torch

        from hetprof.runtime.vllm_engine import WORKER_EXTENSION, engine_settings, start_engine

        device = torch.device(ctx.device)
        model = taskmodels.build(tm, device)
        # the engine core in its own process, as in a run's worker: each call then pays the messages
        # between the two processes that the run's calls pay
        settings = engine_settings(model.config, next(model.parameters()).dtype, device, kv_cache_gib=KV_CACHE_GIB,
                                   own_process=True, worker_extension=WORKER_EXTENSION)
        with tempfile.TemporaryDirectory(prefix="hetprof-vllmgen-") as folder:
            llm = start_engine(model, folder, settings)
            reloads = measure(self._reload(llm, model, folder), device, ctx.policy)
            weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
            del model
            samples = []
            gen = torch.Generator().manual_seed(0)
            for batch, length in points:
                # an empty prefix cache before each call, as a run's call meets it (new prompts, and the
                # cache dropped at every weight sync): repeating the same prompts would hit the cache
                times = measure(self._call(llm, call_prompts(tm.shape.vocab, batch, length, gen)), device, ctx.policy,
                                setup=llm.reset_prefix_cache)
                samples += [{"params": row_params(tm, batch, length, ctx.threads), "metrics": {"seconds": t}}
                            for t in times]
                ctx.advance(1)
            del llm
        ctx.record(RELOAD_BENCHMARK, {"model": tm.shape.name, "dtype": tm.dtype, "threads": ctx.threads,
                                      "backend": BACKEND},
                   [reload_sample(tm, weight_bytes, ctx.threads, t) for t in reloads],
                   f"{tm.shape.name} on vLLM: weight reload and check {statistics.median(reloads) * 1e3:.2f} ms")
        med = statistics.median(s["metrics"]["seconds"] for s in samples)
        ctx.record(BENCHMARK, {"model": tm.shape.name, "dtype": tm.dtype, "layers_run": tm.layers_run,
                               "threads": ctx.threads, "backend": BACKEND}, samples,
                   f"{tm.shape.name} on vLLM: {len(points)} points, median call {med * 1e3:.2f} ms")

    @staticmethod
    def _reload(llm: Any, model: Any, folder: str):
        """What the backend does once a sync has landed: reload the weights, then check a probe."""
        import torch

        from hetprof.runtime.vllm_engine import probe_logprobs, reload_weights

        ids = (torch.arange(PROBE_TOKENS) % max(1, model.config.vocab_size - 3) + 3).tolist()

        def reload() -> None:
            reload_weights(llm, model, folder)
            probe_logprobs(llm, ids)
            with torch.no_grad():
                model(torch.tensor([ids]))

        return reload

    @staticmethod
    def _call(llm: Any, prompts: list[list[int]]):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        # one seed per request, as the executor's backend draws them: seeded sampling runs per request
        params = [SamplingParams(temperature=1.0, max_tokens=GENERATE_NEW_TOKENS, ignore_eos=True, logprobs=0,
                                 detokenize=False, seed=i) for i in range(len(prompts))]
        requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        return lambda: llm.generate(requests, params, use_tqdm=False)
