"""Side-by-side measurements of the executor's RL library on this machine (CPU is fine).

Every row is a ratio of two things measured in the same run, so a busy machine shifts both sides:
- our KV-cache decode loop against transformers' own `generate` (same model, same lengths);
- KV-cache decoding against recomputing the whole prefix every step (what the cache buys);
- the trainer's log-prob recompute against the generator's behaviour log-probs (max |Δ|, not a ratio);
- a learner update split into 4 accumulated micro-batches against one piece (accumulation overhead);
- GRPO on the tiny model: mean reward of the last iterations over the first ones.

    .venv/bin/python bench/executor_lib_bench.py [--quick] [--model tiny-2x] [--threads 1]
"""

from __future__ import annotations

import copy
import statistics
import time

import click


def _paired_seconds(fa, fb, repeats: int) -> tuple[float, float]:
    """Median seconds of two functions run in alternation, so load changes hit both sides alike."""
    fa(), fb()  # warm-up
    ta, tb = [], []
    for _ in range(repeats):
        for fn, times in ((fa, ta), (fb, tb)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(ta), statistics.median(tb)


@click.command()
@click.option("--quick", is_flag=True, help="Fewer repeats and iterations (about a minute on a laptop CPU).")
@click.option("--model", "model_name", default="tiny-2x", show_default=True, help="Preset to measure.")
@click.option("--threads", default=1, show_default=True, help="torch intra-op threads.")
@click.option("--seed", default=0, show_default=True)
def main(quick: bool, model_name: str, threads: int, seed: int) -> None:
    import torch
    from rich.console import Console
    from rich.table import Table

    from hetprof.executor.algorithms import RLBatch, get_algorithm
    from hetprof.executor.algorithms.learner import Learner
    from hetprof.executor.backends import get_backend
    from hetprof.executor.models.logprobs import token_logprobs
    from hetprof.executor.models.modeling import build_causal_lm
    from hetprof.executor.models.tokenizer import CharTokenizer
    from hetprof.executor.prompts.data import PromptSource
    from hetprof.runtime.generation import pad_left, position_ids

    torch.set_num_threads(threads)
    repeats = 3 if quick else 7
    batch, new_tokens = (8, 32) if quick else (16, 64)
    tok = CharTokenizer()

    class NoEosTokenizer(CharTokenizer):
        eos_id = -1  # never sampled: every row decodes exactly new_tokens, as generate() with min length

    model = build_causal_lm(model_name, seed=seed).eval()
    prompts = [tok.encode(p.text) for p in PromptSource.builtin(batch, seed=seed).next_batch()]
    ours = get_backend("hf")(model, NoEosTokenizer())
    ids, mask = pad_left(prompts, tok.pad_id)

    def our_loop():
        ours.generate(prompts, new_tokens, temperature=1.0, generator=torch.Generator().manual_seed(seed))

    def hf_generate():
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, pad_token_id=tok.pad_id, eos_token_id=None,
                           top_k=0, top_p=1.0, temperature=1.0)

    @torch.no_grad()
    def no_cache():
        seq, m = ids, mask
        gen = torch.Generator().manual_seed(seed)
        for _ in range(new_tokens):
            logits = model(input_ids=seq, attention_mask=m, position_ids=position_ids(m), use_cache=False).logits
            nxt = torch.multinomial(torch.softmax(logits[:, -1].float(), -1), 1, generator=gen)
            seq = torch.cat([seq, nxt], 1)
            m = torch.cat([m, torch.ones_like(nxt)], 1)

    t_ours, t_hf = _paired_seconds(our_loop, hf_generate, repeats)
    t_cached, t_nocache = _paired_seconds(our_loop, no_cache, max(1, repeats // 2))
    tokens = batch * new_tokens

    rollout = get_backend("hf")(model, tok).generate(prompts, new_tokens, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        recomputed = token_logprobs(model, rollout.input_ids, rollout.attention_mask)
    m = rollout.shifted_mask.bool()
    max_diff = float((recomputed - rollout.shifted_logprobs)[m].abs().max())

    scored = RLBatch.from_rollout(rollout, torch.rand(batch, generator=torch.Generator().manual_seed(2)), 2)
    algo = get_algorithm("grpo")(kl_coef=0.0)
    algo.advantages(scored)

    def update(micro: int):
        trainee = copy.deepcopy(model)
        learner = Learner(trainee, torch.optim.SGD(trainee.parameters(), lr=1e-3), algo, micro_batches=micro)
        return lambda: learner.update(copy.deepcopy(scored))

    t_one, t_four = _paired_seconds(update(1), update(4), repeats)

    first, last = _grpo_reward_rise(20, seed)

    table = Table(title=f"executor RL library — {model_name}, batch {batch} × {new_tokens} new tokens, "
                        f"{threads} thread(s)")
    table.add_column("measurement")
    table.add_column("ratio / value", justify="right")
    table.add_column("sides (measured in this run)")
    table.add_row("our decode loop vs transformers generate (tokens/s)", f"{t_hf / t_ours:.2f}×",
                  f"{tokens / t_ours:,.0f} vs {tokens / t_hf:,.0f} tok/s")
    table.add_row("KV cache vs recomputing the prefix (tokens/s)", f"{t_nocache / t_cached:.2f}×",
                  f"{tokens / t_cached:,.0f} vs {tokens / t_nocache:,.0f} tok/s")
    table.add_row("behaviour vs recomputed log-prob, max |Δ|", f"{max_diff:.1e}", f"{int(m.sum())} tokens")
    table.add_row("update time, 4 micro-batches / 1", f"{t_four / t_one:.2f}×",
                  f"{t_four * 1e3:.0f} ms vs {t_one * 1e3:.0f} ms")
    table.add_row("GRPO on tiny: reward last 5 / first 5 iterations", f"{last / max(first, 1e-9):.2f}×",
                  f"{first:.3f} → {last:.3f}")
    Console().print(table)


def _grpo_reward_rise(iterations: int, seed: int) -> tuple[float, float]:
    """The library's own loop, as the tests run it: tiny model, built-in arithmetic, GRPO."""
    import torch

    from hetprof.executor.algorithms import RLBatch, get_algorithm
    from hetprof.executor.algorithms.learner import Learner
    from hetprof.executor.backends import get_backend
    from hetprof.executor.models.modeling import build_causal_lm
    from hetprof.executor.models.tokenizer import CharTokenizer
    from hetprof.executor.prompts.data import PromptSource
    from hetprof.executor.runners.rewards import get_reward

    tok = CharTokenizer()
    actor = build_causal_lm("tiny", seed=seed)
    algo = get_algorithm("grpo")(kl_coef=0.0)  # no reference model: the rise alone is measured
    learner = Learner(actor, torch.optim.Adam(actor.parameters(), lr=1e-2), algo, ppo_epochs=4, mini_batches=2,
                      seed=seed)
    source = PromptSource.builtin(8, seed=seed, words=False)
    gen = get_backend("hf")(actor, tok)
    sampler = torch.Generator().manual_seed(seed)
    reward = get_reward("arithmetic")
    means = []
    for _ in range(iterations):
        prompts = [p for p in source.next_batch() for _ in range(8)]
        rollout = gen.generate([tok.encode(p.text) for p in prompts], 3, generator=sampler)
        texts = [tok.decode(r) for r in rollout.response_ids()]
        scores = reward([p.text for p in prompts], texts, [p.answer for p in prompts])
        learner.update(RLBatch.from_rollout(rollout, scores, 8))
        means.append(sum(scores) / len(scores))
    k = min(5, iterations // 2)
    return sum(means[:k]) / k, sum(means[-k:]) / k


if __name__ == "__main__":
    main()
