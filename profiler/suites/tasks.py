"""RL task kernels at small scale: prefill, one decode step, a fwd+bwd+Adam training step, and a
whole generation call (what a call costs beyond its prefill and decode steps: see hetprof/runtime/generation.py).

Each task timer times what an RL step really does, not just the model's forward: a decode step also
samples the next token with the executor's own sampling step (`hetprof.runtime.sampling`: fp32 log-softmax
at the last position, multinomial draw, the token's log-prob — every RL generator does this per
step, over the full vocabulary), and a training step
computes per-token log-probs and entropy in fp32 for a policy-gradient loss and clips the
gradient norm before Adam, as the executor's learner does. Why: time a row leaves out is a bias
no fit over the rows can recover.

These rows are what the fitted cost models learn from, so the sweep spans batch sizes and sequence
lengths wide enough for a regression to have range, and every point keeps all its repeats. On the
CPU the default is one thread, because a `cpu` worker slot of a cluster spec is one core and the
executor's CPU workers run single-threaded; the thread count is recorded with every sample.

Forward-only rows run under `torch.no_grad()`, the mode the executor's generation and inference
passes run in (`inference_mode` skips autograd's version counting, so it would time a small model's pass
faster than a run computes it; DESIGN §10 says why), and every repeat but a decode step's starts with the
core's caches evicted (`Flusher(cpu_caches=True)`): in a run a pass or a call follows other tasks'
work, never its own repeat, while a call's decode steps follow each other.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
from collections.abc import Iterator
from typing import Any

from hetprof.profiler import taskmodels
from hetprof.profiler.context import ProfileContext
from hetprof.profiler.registry import Suite, register_suite
from hetprof.profiler.timing import Flusher, Timed, measure, measure_round_robin
from hetprof.profiler.workloadgrid import PACKED_PREFILL, PACKED_TRAIN, PADDED_PREFILL, merge_points
from hetprof.runtime.cpuslots import on_slot_core
from hetprof.runtime.generation import sample_continuations
from hetprof.runtime.packedpass import packed_token_logprobs
from hetprof.runtime.paddedpass import token_logprobs
from hetprof.runtime.sampling import next_tokens

# (batch sizes, sequence/context lengths) per task, for (device kind, quick?)
GRIDS: dict[tuple[str, bool], dict[str, tuple[tuple[int, ...], tuple[int, ...]]]] = {
    # CPU grids reach the per-replica batches of a CPU RL run (tens of sequences): a fit is trusted
    # between its points, not beyond them (docs/DESIGN.md §10 says why).
    ("cpu", True): {"prefill": ((1, 4, 16, 32, 64), (16, 32, 64, 128)),
                    "decode": ((1, 4, 16, 32), (16, 64, 128, 256)),
                    "train": ((1, 4, 16), (32, 64, 128)),
                    "generate": ((1, 8, 32), (16, 64, 128))},
    ("cpu", False): {"prefill": ((1, 2, 4, 8, 16, 32, 64), (16, 32, 64, 128, 256)),
                     "decode": ((1, 2, 4, 8, 16, 32, 64), (16, 64, 128, 256, 384)),
                     "train": ((1, 2, 4, 8, 16, 32), (32, 64, 128, 256)),
                     "generate": ((1, 4, 16, 32, 64), (16, 64, 128, 256))},
    ("cuda", True): {"prefill": ((1, 8, 32), (256, 1024)), "decode": ((1, 16, 128), (256, 2048)),
                     "train": ((1, 4), (256, 1024)), "generate": ((1, 32), (256, 1024))},
    ("cuda", False): {"prefill": ((1, 2, 4, 8, 16, 32), (128, 256, 512, 1024, 2048)),
                      "decode": ((1, 4, 16, 64, 128, 256), (256, 512, 1024, 2048, 4096)),
                      "train": ((1, 2, 4, 8), (256, 512, 1024, 2048)),
                      "generate": ((1, 8, 32, 128), (128, 512, 2048))},
}
# New tokens per timed generation call: enough for the slow first steps after the prefill and a
# steady one, few enough that the call is mostly what the per-phase rows do not see.
GENERATE_NEW_TOKENS = 4


def default_dtype(device: str) -> str:
    return "fp32" if device == "cpu" else "bf16"


def grid(device: str, quick: bool, task: str, max_position: int) -> list[tuple[int, int]]:
    batches, lengths = GRIDS[("cpu" if device == "cpu" else "cuda", quick)][task]
    return [(b, s) for b, s in itertools.product(batches, lengths) if s + 1 <= max_position]


class TaskTimer:
    """How to time one kind of profiler task row (`task.<name>`) at one (batch, length) point: a procedure,
    not a `costmodels.data.Phase` (the unit of work that row prices)."""

    task: str = ""
    length_key = "seq_len"

    def variants(self, ctx: ProfileContext) -> list[dict]:
        return [{}]

    def applies(self, tm: Any) -> bool:
        """Whether this model can be timed by this timer (some need the LM head)."""
        return True

    def extra_params(self) -> dict:
        """Fixed settings of the timer that its rows record."""
        return {}

    def points(self, ctx: ProfileContext, max_position: int) -> list[tuple[int, int]]:
        """The device's grid, plus the shapes of the workload being profiled for (`--workload`)."""
        extra = (ctx.options.get("workload_points") or {}).get(self.task, [])
        return merge_points(grid(ctx.device, ctx.quick, self.task, max_position), extra, max_position)

    def in_turns(self, ctx: ProfileContext, batch: int, length: int) -> bool:
        """Whether this point is timed in turns with the sweep's other such points
        (`measure_round_robin`): a call a run makes once, after other work — a generation call, its
        prefill, a padded inference pass. A call a run makes several times in a row (decode steps,
        the packs of a packed pass, training's micro- and mini-batches) is timed back to back."""
        return False

    @contextlib.contextmanager
    def sweep(self, model: Any, variant: dict) -> Iterator[dict]:
        """The model's mode for the whole sweep, and state its points share (a train sweep's optimizer)."""
        model.eval()
        yield {}

    def prepare(self, ctx, model, tm, batch, length, variant, device, flush, gen, shared: dict) -> Timed:
        """The call that times this point, its inputs built."""
        raise NotImplementedError

    def time_point(self, ctx, model, tm, batch, length, variant, device, flush, gen) -> list[float]:
        """One point's repeats, timed alone."""
        with self.sweep(model, variant) as shared:
            call = self.prepare(ctx, model, tm, batch, length, variant, device, flush, gen, shared)
            return measure_round_robin([call], device, ctx.policy)[0]


class Prefill(TaskTimer):
    """A forward over whole prompts or sequences. At an inference point of `--workload` (a reference
    or log-prob pass) it times what that pass runs: padded, `hetprof.runtime.paddedpass.token_logprobs`
    over the replica's padded batch (no KV cache, fp32 log-probs of every column over the vocabulary);
    packed, `hetprof.runtime.packedpass.packed_token_logprobs` over one pack of `batch` sequences scoring
    their response tokens. Elsewhere a padded batch's forward, as generation's prefill runs it."""

    task = "prefill"

    def in_turns(self, ctx: ProfileContext, batch: int, length: int) -> bool:
        return (batch, length) not in packed_responses(ctx, PACKED_PREFILL)

    def prepare(self, ctx, model, tm, batch, length, variant, device, flush, gen, shared: dict) -> Timed:
        import torch

        response = packed_responses(ctx, PACKED_PREFILL).get((batch, length))
        if response is not None and tm.with_head:
            return _packed_pass(model, tm, batch, length, response, device, flush, gen)
        x = taskmodels.inputs(tm, batch, length, device, gen)
        # the run's padded reference or log-prob pass (a headless model has no log-probs to take)
        padded = tm.with_head and (batch, length) in map(tuple, (ctx.options.get("workload_points") or {})
                                                         .get(PADDED_PREFILL, []))

        def forward() -> Any:
            with torch.no_grad():
                if padded:
                    return token_logprobs(model, x["input_ids"], x["attention_mask"])
                return model(**x, use_cache=True)

        return Timed(forward, flush=flush)


def packed_responses(ctx: ProfileContext, key: str) -> dict[tuple[int, int], int]:
    """(batch, length) -> response tokens of the packed passes `--workload` asked for under `key`
    (`PACKED_PREFILL`: inference passes; `PACKED_TRAIN`: training micro-batches)."""
    points = (ctx.options.get("workload_points") or {}).get(key, [])
    return {(b, n): r for b, n, r in points}


def response_columns(batch: int, length: int, response: int) -> Any:
    """The shifted columns that score the last `response` tokens of each length-`length` sequence
    (column t scores token t+1): what a reference or log-prob pass reads."""
    import torch

    needed = torch.zeros(batch, length - 1, dtype=torch.long)
    needed[:, max(0, length - 1 - response):] = 1
    return needed


def _packed_pass(model, tm, batch, length, response, device, flush, gen) -> Timed:
    import torch

    ids = torch.randint(0, tm.shape.vocab, (batch, length), generator=gen).to(device)
    mask = torch.ones_like(ids)
    needed = response_columns(batch, length, response).to(device)

    def packed() -> Any:
        with torch.no_grad():
            return packed_token_logprobs(model, ids, mask, needed=needed)

    return Timed(packed, flush=flush)


class Decode(TaskTimer):
    task = "decode"
    length_key = "context_len"

    def time_point(self, ctx, model, tm, batch, length, variant, device, flush, gen) -> list[float]:
        import torch

        model.eval()
        with torch.no_grad():
            cache = model(**taskmodels.inputs(tm, batch, length, device, gen), use_cache=True).past_key_values
            step = taskmodels.inputs(tm, batch, 1, device, gen, padded=False)
            step["attention_mask"] = taskmodels.padding_mask(batch, length + 1).to(device)  # the prefill's rows, grown by one
            sample = _sampler(tm, batch, device, gen)

            def one_step() -> Any:
                out = model(**step, past_key_values=cache, use_cache=True)
                return sample(out)

            # each timed step appends one token; cropping back (untimed) keeps the context fixed. A
            # call's decode steps run back to back, each finding the last one's data in the core's
            # caches: no CPU eviction between them (the GPU's L2 flush stays, as for every row).
            cold = flush if device.type == "cuda" else None
            return measure(one_step, device, ctx.policy, setup=lambda: _crop(cache, length), flush=cold)


def _sampler(tm: Any, batch: int, device: Any, gen: Any):
    """Turn the step's logits into tokens as the executor's generator does (`hetprof.runtime.sampling`:
    fp32 log-softmax, a multinomial draw, the drawn token's log-prob, finished-row bookkeeping).
    Without a head (large models profiled on a few blocks) there are no logits to sample from."""
    import torch

    if not tm.with_head:
        return lambda out: out
    draw = torch.Generator(device=device).manual_seed(0)
    running = torch.zeros(batch, dtype=torch.bool, device=device)

    def sample(out: Any) -> Any:
        return next_tokens(out.logits[:, -1], running, 1.0, 1.0, draw, pad_id=0, eos_id=-1)

    return sample


class Generate(TaskTimer):
    """A whole generation call, as the executor's `hf` backend makes it (`hetprof.runtime.generation`): pad
    the prompts, prefill, sample GENERATE_NEW_TOKENS tokens. `hetprof fit` compares it with the
    prefill and decode rows to learn what a call costs beyond its phases; it needs the LM head."""

    task = "generate"

    def applies(self, tm: Any) -> bool:
        return tm.with_head

    def in_turns(self, ctx: ProfileContext, batch: int, length: int) -> bool:
        return True

    def extra_params(self) -> dict:
        return {"new_tokens": GENERATE_NEW_TOKENS}

    def prepare(self, ctx, model, tm, batch, length, variant, device, flush, gen, shared: dict) -> Timed:
        import torch

        ids = torch.randint(3, tm.shape.vocab, (batch, length), generator=gen).tolist()
        # the padded RL batch of `padding_mask`: every other prompt is an eighth shorter
        prompts = [row[length // 8:] if i % 2 and length >= 8 else row for i, row in enumerate(ids)]
        draw = torch.Generator(device=device).manual_seed(0)

        def call() -> Any:
            with torch.no_grad():
                return sample_continuations(model, prompts, GENERATE_NEW_TOKENS, temperature=1.0, top_p=1.0,
                                            generator=draw, pad_id=0, eos_id=-1, device=device)

        return Timed(call, flush=flush)


def _crop(cache: Any, length: int) -> None:
    """Back to `length` tokens; a negative count ("drop n") means the same in every transformers version."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


class Train(TaskTimer):
    task = "train"

    def variants(self, ctx: ProfileContext) -> list[dict]:
        return [{"recompute": False}] if ctx.quick else [{"recompute": False}, {"recompute": True}]

    @contextlib.contextmanager
    def sweep(self, model: Any, variant: dict) -> Iterator[dict]:
        """Training mode (and recomputation, for that variant) for the sweep; one AdamW for all its
        points, as a learner has one (a point each would hold its own moments)."""
        import torch

        model.train()
        recompute = bool(variant.get("recompute"))
        if recompute:
            _checkpointing(model, True)
        try:
            yield {"optimizer": torch.optim.AdamW(model.parameters(), lr=1e-5)}
        finally:
            if recompute:
                _checkpointing(model, False)
            model.eval()

    def prepare(self, ctx, model, tm, batch, length, variant, device, flush, gen, shared: dict) -> Timed:
        response = packed_responses(ctx, PACKED_TRAIN).get((batch, length))
        if response is not None and tm.with_head:  # a packed micro-batch: the learner's own packed pass
            import torch

            ids = torch.randint(0, tm.shape.vocab, (batch, length), generator=gen).to(device)
            needed = response_columns(batch, length, response).to(device)
            return Timed(packed_train_step(model, ids, needed, shared["optimizer"]), flush=flush)
        x = taskmodels.inputs(tm, batch, length, device, gen)
        return Timed(train_step(model, tm, x, shared.get("optimizer")), flush=flush)


def train_step(model: Any, tm: Any, x: dict, opt: Any = None) -> Any:
    """One optimizer step as the executor's learner takes it: forward, RL loss, backward, gradient
    clipping, AdamW. Shared with the data-parallel suite, which times it with and without DDP."""
    import torch

    opt = opt if opt is not None else torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        if tm.with_head:
            loss = _policy_loss(model(**x, use_cache=False).logits, x["input_ids"])
        else:
            loss = model(**x, use_cache=False).last_hidden_state.float().pow(2).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return step


def packed_train_step(model: Any, ids: Any, needed: Any, opt: Any) -> Any:
    """A packed micro-batch's optimizer step as the learner takes it with a token budget: the rows
    packed into one sequence, `packed_token_logprobs` with entropy on the `needed` (response) columns
    only, a policy-gradient loss over them, backward, gradient clipping, AdamW."""
    import torch

    mask = torch.ones_like(ids)
    weight = needed.float() / needed.sum().clamp(min=1)

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        lp, ent = packed_token_logprobs(model, ids, mask, with_entropy=True, needed=needed)
        ratio = torch.exp(lp - lp.detach())
        (-(ratio * 0.1 * weight).sum() - 0.001 * (ent * weight).sum()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return step


def _policy_loss(logits: Any, ids: Any) -> Any:
    """A policy-gradient loss with an entropy term over fp32 per-token log-probs: the vocabulary-wide
    work (log-softmax, gather, entropy) an RL learner does per step, at the same cost."""
    import torch

    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    taken = logprobs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(logprobs.exp() * logprobs).sum(-1)
    ratio = torch.exp(taken - taken.detach())
    return -(ratio * 0.1).mean() - 0.001 * entropy.mean()


def _checkpointing(model: Any, on: bool) -> None:
    """Activation recomputation on/off under either name transformers has used for it."""
    verb = "enable" if on else "disable"
    fn = getattr(model, f"activation_checkpointing_{verb}", None) or getattr(model, f"gradient_checkpointing_{verb}")
    fn()


TIMERS: dict[str, TaskTimer] = {p.task: p for p in (Prefill(), Decode(), Train(), Generate())}


@register_suite
class TasksSuite(Suite):
    name = "tasks"
    help = "prefill, decode-step, train-step and whole generation-call timings of transformer blocks per model preset"

    def timers(self, ctx: ProfileContext) -> list[TaskTimer]:
        return [TIMERS[t] for t in ctx.options.get("tasks") or TIMERS]

    def steps(self, ctx: ProfileContext) -> int:
        dtype = ctx.options.get("dtype") or default_dtype(ctx.device)
        return sum(len(p.points(ctx, m.max_position)) * len(p.variants(ctx))
                   for m in ctx.models for p in self.timers(ctx)
                   if p.applies(taskmodels.plan_model(m, dtype, ctx.options.get("layers_run"))))

    def run(self, ctx: ProfileContext) -> None:
        import torch

        dtype = ctx.options.get("dtype") or default_dtype(ctx.device)
        device = torch.device(ctx.device)
        # a slot's rows are timed on a core of their own, as a run's worker runs (hetprof/runtime/cpuslots.py)
        with on_slot_core(0, 1) if device.type == "cpu" else contextlib.nullcontext():
            self._models(ctx, dtype, device)

    def _models(self, ctx: ProfileContext, dtype: str, device: Any) -> None:
        import torch

        flush = Flusher(device, cpu_caches=True)  # a run's pass follows other work (timing.py)
        gen = torch.Generator().manual_seed(0)
        for shape in ctx.models:
            tm = taskmodels.plan_model(shape, dtype, ctx.options.get("layers_run"))
            model = taskmodels.build(tm, device)
            for timer in self.timers(ctx):
                if not timer.applies(tm):
                    continue
                for variant in timer.variants(ctx):
                    self._sweep(ctx, timer, model, tm, variant, device, flush, gen)
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()

    def _sweep(self, ctx, timer: TaskTimer, model, tm, variant, device, flush, gen) -> None:
        points = timer.points(ctx, tm.shape.max_position)
        timed = time_sweep(ctx, timer, model, tm, variant, points, device, flush, gen)
        samples: list[dict] = []
        for (batch, length), times in zip(points, timed, strict=True):
            params = {**tm.shape_params(), "batch": batch, timer.length_key: length, "threads": ctx.threads,
                      **timer.extra_params(), **variant}
            samples += [{"params": params, "metrics": {"seconds": t}} for t in times]
            ctx.advance(1)
        if samples:
            med = statistics.median(s["metrics"]["seconds"] for s in samples)
            extra = " recompute" if variant.get("recompute") else ""
            ctx.record(f"task.{timer.task}", {"model": tm.shape.name, "dtype": tm.dtype,
                                               "layers_run": tm.layers_run, "threads": ctx.threads, **variant},
                       samples, f"{tm.shape.name}{extra}: {len(points)} points, median {med * 1e3:.2f} ms")


def time_sweep(ctx, timer: TaskTimer, model, tm, variant: dict, points: list[tuple[int, int]], device, flush,
               gen) -> list[list[float]]:
    """Each point's timed repeats: the points a run reaches after other work (`TaskTimer.in_turns`)
    in turns with each other, the rest (and, where their inputs do not fit in the device's memory
    together, those too) each alone; a point that does not fit alone gets no samples and a note."""
    import torch

    turns = [i for i, (b, n) in enumerate(points) if timer.in_turns(ctx, b, n)]
    out: dict[int, list[float]] = {}
    if len(turns) > 1:
        try:
            with timer.sweep(model, variant) as shared:
                calls = [timer.prepare(ctx, model, tm, *points[i], variant, device, flush, gen, shared) for i in turns]
                out = dict(zip(turns, measure_round_robin(calls, device, ctx.policy), strict=True))
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
    return [out[i] if i in out else _alone(ctx, timer, model, tm, b, n, variant, device, flush, gen)
            for i, (b, n) in enumerate(points)]


def _alone(ctx, timer: TaskTimer, model, tm, batch, length, variant, device, flush, gen) -> list[float]:
    import torch

    try:
        return timer.time_point(ctx, model, tm, batch, length, variant, device, flush, gen)
    except torch.OutOfMemoryError:
        ctx.note(f"task.{timer.task} {tm.shape.name} batch={batch} {timer.length_key}={length}: "
                 "out of memory, skipped")
        torch.cuda.empty_cache()
        return []
