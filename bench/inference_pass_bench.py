"""A run's packed inference pass against the profiler rows that price it, side by side in one process.

The reference and log-prob passes of `bench/executor_bench.py --quick --max-tokens 512` (one
replica's 32 sequences of the tiny GRPO job, ~70 tokens, packs of ≤ 512 tokens) are timed as a run
times them: once, right after other work (a generation call and a packed training step). Beside
them, each round and in the same process:
- the packed pass's pieces: packing, the forward, the response tokens' log-probs and the scatter back;
- the old prefill row: a padded forward of one pack's shape under `inference_mode`, back to back;
- the profiler's packed inference row: `packed_token_logprobs` on one pack under `no_grad`, after
  evicting the core's caches (`Flusher(cpu_caches=True)`), as `hetprof profile --workload` times it;
- the same row after evicting the last-level cache too (a buffer twice its size written first):
  whether the profiler's flush should reach past the core's own caches;
- the same row timed in turns with the prefill grid's other points (`measure_round_robin`: each
  repeat follows one call of every other point of the sweep), which the profiler does for calls a
  run makes once after other work (generation's prefill) but not for a pass's packs, which follow
  each other;
and generation's prefill after training steps against the same call after each of these
(`prefill_flushes`), and after the profiler's turns spaced out to a run's iteration, by training
steps or by sleep (a run's call comes round once an iteration, the profiler's once a grid turn).
The planner prices the pass as its whole packs, each at its own row (planner/taskcosts.py); the old
row is scaled as sequences / pack size, as it was priced. Times are the thread's
CPU seconds, so other tenants of a shared machine do not enter them; each ratio is the median of
per-round ratios.

    .venv/bin/python bench/inference_pass_bench.py [--rounds 60]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hetprof.executor.models.modeling import build_causal_lm
from hetprof.executor.models.tokenizer import CharTokenizer
from hetprof.executor.prompts.data import PromptSource
from hetprof.profiler import taskmodels
from hetprof.profiler.hostinfo import last_level_cache_bytes
from hetprof.profiler.suites.tasks import grid, response_columns
from hetprof.profiler.timing import Flusher
from hetprof.runtime.generation import sample_continuations
from hetprof.runtime.hostmemory import keep_freed_memory
from hetprof.runtime.packedpass import (
    logits_to_logprobs,
    pack,
    packed_token_logprobs,
    shifted_targets,
    unpack,
)
from hetprof.runtime.tokenbudget import micro_batches_by_tokens
from hetprof.specs.models import PRESETS

BUDGET, RESPONSE, SEQUENCES = 512, 3, 32
RUN_ITERATION_S = 0.38  # the executor bench's packed iteration: how long before a run's call comes round again


def grid_turn(model: torch.nn.Module, gen: torch.Generator):
    """One call of every point of the profile's CPU prefill grid (the sweep a row takes turns with)."""
    tm = taskmodels.plan_model(PRESETS["tiny"], "fp32", None)
    inputs = [taskmodels.inputs(tm, b, n, "cpu", gen) for b, n in grid("cpu", False, "prefill", tm.shape.max_position)]

    def turn() -> None:
        with torch.no_grad():
            for x in inputs:
                model(**x, use_cache=True)

    return turn


def replica_batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One replica's left-padded sequences: the built-in prompts, RESPONSE sampled tokens each."""
    tok = CharTokenizer()
    prompts = [tok.encode(p.text) for p in PromptSource.builtin(8, seed=0).batch(0)]
    rows = [p for p in prompts for _ in range(8)][:SEQUENCES]
    width = max(map(len, rows)) + RESPONSE
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask, response = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, p in enumerate(rows):
        ids[i, width - RESPONSE - len(p):width - RESPONSE] = torch.tensor(p)
        ids[i, width - RESPONSE:] = torch.randint(3, 60, (RESPONSE,), generator=gen)
        mask[i, width - RESPONSE - len(p):] = 1
        response[i, width - RESPONSE:] = 1
    return ids, mask, response[:, 1:]


def cpu_seconds(fn) -> float:
    start = time.thread_time()
    fn()
    return time.thread_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()
    gen = torch.Generator().manual_seed(0)
    ids, mask, needed = replica_batch(gen)
    model, actor = build_causal_lm("tiny", seed=0).eval(), build_causal_lm("tiny", seed=1)
    opt = torch.optim.AdamW(actor.parameters(), lr=1e-5)
    groups = [torch.tensor(g) for g in micro_batches_by_tokens(mask.sum(1).tolist(), BUDGET)]
    per = max(len(g) for g in groups)
    length = round(float(mask.sum(1).float().mean()))
    tm = taskmodels.plan_model(PRESETS["tiny"], "fp32", None)
    row_model = taskmodels.build(tm, "cpu").eval()
    padded = taskmodels.inputs(tm, per, length, "cpu", gen)
    sizes = sorted({len(g) for g in groups}, reverse=True)
    counts = {n: sum(len(g) == n for g in groups) for n in sizes}
    one_pack = {n: torch.randint(0, tm.shape.vocab, (n, length), generator=gen) for n in sizes}
    pack_needed = {n: response_columns(n, length, RESPONSE) for n in sizes}
    flush = Flusher(torch.device("cpu"), cpu_caches=True)
    llc = torch.empty(2 * (last_level_cache_bytes() or 64 * 1024**2) // 4, dtype=torch.float32)
    turn = grid_turn(row_model, gen)

    def other_work() -> None:  # what precedes an inference pass in a run: generation, then training
        with torch.no_grad():
            actor.eval()
            sample_continuations(actor, [r[m.bool()].tolist() for r, m in zip(ids, mask, strict=True)], RESPONSE,
                                 temperature=1.0, top_p=1.0, generator=gen, pad_id=0, eos_id=-1)
        actor.train()
        opt.zero_grad()
        lp = packed_token_logprobs(actor, ids, mask, max_tokens=BUDGET, needed=needed)
        (-(lp * needed).sum()).backward()
        opt.step()

    def run_pass() -> None:
        with torch.no_grad():
            packed_token_logprobs(model, ids, mask, max_tokens=BUDGET, needed=needed)

    def old_row() -> None:
        with torch.inference_mode():
            row_model(**padded, use_cache=True)

    def new_row(n: int) -> None:
        with torch.no_grad():
            packed_token_logprobs(row_model, one_pack[n], torch.ones_like(one_pack[n]), needed=pack_needed[n])

    def packed_rows(evict) -> float:
        """The whole packs' rows, each timed after `evict`, as the planner sums them."""
        total = 0.0
        for n in sizes:
            new_row(n)
            evict()
            total += cpu_seconds(lambda n=n: new_row(n)) * counts[n]
        return total

    packs = [pack(ids[g], mask[g]) for g in groups]
    targets = [shifted_targets(p, needed[g]) for p, g in zip(packs, groups, strict=True)]

    def pieces() -> dict[str, float]:
        with torch.no_grad():
            out = {"packing (pack, targets)": cpu_seconds(lambda: [shifted_targets(pack(ids[g], mask[g]), needed[g])
                                                                   for g in groups])}
            logits = []
            out["forward"] = cpu_seconds(lambda: logits.extend(
                model(input_ids=p.input_ids, position_ids=p.position_ids, use_cache=False,
                      logits_to_keep=w).logits[0] for p, (w, _) in zip(packs, targets, strict=True)))
            out["log-probs and scatter back"] = cpu_seconds(lambda: [
                unpack(logits_to_logprobs(lg, t), p, ids.shape[1] - 1, w)
                for lg, p, (w, t) in zip(logits, packs, targets, strict=True)])
        return out

    scale = SEQUENCES / per
    times: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        other_work()
        got = {"run's pass, after other work": cpu_seconds(run_pass)}
        got.update(pieces())
        old_row()
        got["old row (padded forward, inference_mode, warm) × packs"] = cpu_seconds(old_row) * scale
        got["packed inference rows (no_grad, core's caches evicted), whole packs"] = packed_rows(flush)
        got["the same, last-level cache evicted too"] = packed_rows(lambda: (flush(), llc.fill_(1.0)))
        got["the same, in turns with the prefill grid"] = packed_rows(lambda: (turn(), flush()))
        for key, seconds in got.items():
            times.setdefault(key, []).append(seconds)
    run = times["run's pass, after other work"]
    print(f"{SEQUENCES} sequences of {length} tokens in {len(groups)} packs of ≤ {BUDGET} tokens "
          f"({', '.join(f'{counts[n]} × {n}' for n in sizes)} sequences); CPU ms, medians of {args.rounds} rounds")
    parts = ("packing (pack, targets)", "forward", "log-probs and scatter back")
    for key, values in times.items():
        if key in parts:
            share = statistics.median(b / a for a, b in zip(run, values, strict=True))
            print(f"    {key:56s} {statistics.median(values) * 1e3:7.2f}   {share:5.1%} of the pass")
        else:
            ratio = statistics.median(a / b for a, b in zip(run, values, strict=True))
            print(f"  {key:58s} {statistics.median(values) * 1e3:7.2f}   run's pass / this {ratio:5.2f}")
    prefill_flushes(args.rounds)


def prefill_flushes(rounds: int) -> None:
    """Generation's prefill (one replica's 32 × 70 tokens, a fresh KV cache) after a run's training
    steps, against the same call after each flush a profiler could run before a repeat."""
    gen = torch.Generator().manual_seed(1)
    model, actor = build_causal_lm("tiny", seed=0).eval(), build_causal_lm("tiny", seed=1)
    opt = torch.optim.AdamW(actor.parameters(), lr=1e-5)
    ids = torch.randint(3, 60, (SEQUENCES, 70), generator=gen)
    mask = torch.ones_like(ids)
    core = Flusher(torch.device("cpu"), cpu_caches=True)
    llc = torch.empty(2 * (last_level_cache_bytes() or 64 * 1024**2) // 4, dtype=torch.float32)

    def prefill() -> None:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)

    def train() -> None:  # a learner's packed steps, as precede the next iteration's generation
        for _ in range(8):
            step()

    def step() -> None:
        opt.zero_grad()
        (-packed_token_logprobs(actor, ids, mask, max_tokens=BUDGET).sum()).backward()
        opt.step()

    turn = grid_turn(model, gen)
    t0 = time.perf_counter()
    step()
    gap_steps = max(1, round(RUN_ITERATION_S / (time.perf_counter() - t0)))
    evictions = {"warm (back to back)": lambda: None, "core's caches evicted": core,
                 "last-level cache evicted too": lambda: (core(), llc.fill_(1.0)),
                 "in turns with the prefill grid, core's caches evicted (the profiler's)": lambda: (turn(), core()),
                 # a run's call comes an iteration after its last: is the profiler's shorter spacing the gap?
                 f"the profiler's, then {gap_steps} training steps (an iteration's gap)":
                     lambda: (turn(), [step() for _ in range(gap_steps)], core()),
                 f"the profiler's, then {RUN_ITERATION_S * 1e3:.0f} ms asleep":
                     lambda: (turn(), time.sleep(RUN_ITERATION_S), core())}
    times: dict[str, list[float]] = {}
    for _ in range(rounds):
        train()
        times.setdefault("after 8 training steps (a run's)", []).append(cpu_seconds(prefill))
        for key, evict in evictions.items():
            prefill()
            evict()
            times.setdefault(key, []).append(cpu_seconds(prefill))
    run = times["after 8 training steps (a run's)"]
    print(f"generation's prefill, {SEQUENCES} × 70 tokens; CPU ms, medians of {rounds} rounds")
    for key, values in times.items():
        ratio = statistics.median(a / b for a, b in zip(run, values, strict=True))
        print(f"  {key:58s} {statistics.median(values) * 1e3:7.2f}   run's prefill / this {ratio:5.2f}")


if __name__ == "__main__":
    main()
