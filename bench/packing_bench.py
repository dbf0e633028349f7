"""Packed token-budget micro-batches against padded ones: one learner update on long-tailed lengths.

Responses are drawn lognormal (reasoning RL's long tail), so a padded batch is as wide as its
longest response. Both sides run the same `Learner.update` (log-prob recompute pass, forward,
backward, optimizer step) on the same samples, alternating so load changes hit both alike. The
table gives the token ratio packing saves (padded tokens / real tokens) beside the time ratio it
achieves (padded seconds / packed seconds); the goal is a time ratio within 15% of the token ratio.

    .venv/bin/python bench/packing_bench.py [--quick] [--threads 1] [--budget 2048]

`--plans CLUSTER` instead plans the repository's async example workloads on CLUSTER with and
without `training.max_tokens_per_microbatch` (`--plan-budget` tokens; `hetprof plan`, the same
seed and evaluation budget on both sides) and prints the predicted iteration of each:

    .venv/bin/python bench/packing_bench.py --plans examples/clusters/hetrl-multi-region.yaml
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import click
from executor_lib_bench import _paired_seconds

ROOT = Path(__file__).resolve().parents[1]


def _ragged_batch(sequences: int, prompt: int, response_mean: float, response_cap: int, vocab: int, seed: int):
    """A scored GRPO batch: fixed prompts, lognormal responses, left-padded prompts, right-padded answers."""
    import numpy as np
    import torch

    from hetprof.executor.algorithms import RLBatch, get_algorithm
    from hetprof.specs.workload import LengthDist

    lengths = LengthDist(mean=response_mean, max=response_cap, dist="lognormal",
                         std=response_mean).sample(sequences, np.random.default_rng(seed))
    gen = torch.Generator().manual_seed(seed)
    width = prompt + int(lengths.max())
    ids = torch.randint(0, vocab, (sequences, width), generator=gen)
    attn = torch.zeros(sequences, width, dtype=torch.long)
    for i, r in enumerate(lengths.tolist()):
        attn[i, :prompt + r] = 1
    mask = attn[:, 1:].clone()
    mask[:, :prompt - 1] = 0
    batch = RLBatch(input_ids=ids, attention_mask=attn, mask=mask, rewards=torch.rand(sequences, generator=gen),
                    behaviour_logprobs=-3.0 * mask.float(), group_size=4)
    get_algorithm("grpo")().advantages(batch)
    return batch


@click.command()
@click.option("--quick", is_flag=True, help="Fewer repeats and a smaller batch.")
@click.option("--threads", default=1, show_default=True, help="torch intra-op threads.")
@click.option("--budget", default=1056, show_default=True, help="max_tokens_per_microbatch of the packed side (default: prompt + response cap, the least a spec allows).")
@click.option("--seed", default=0, show_default=True)
@click.option("--plans", "cluster", type=click.Path(exists=True, dir_okay=False),
              help="Plan the async example workloads on this cluster, packed and padded, instead.")
@click.option("--plan-budget", default=16384, show_default=True, help="max_tokens_per_microbatch of the packed plans.")
@click.option("--max-evals", default=2000, show_default=True, help="Evaluations per search (--plans).")
def main(quick: bool, threads: int, budget: int, seed: int, cluster: str | None, plan_budget: int,
         max_evals: int) -> None:
    if cluster:
        planned_iterations(Path(cluster), plan_budget, max_evals, seed)
        return
    import torch
    from rich.console import Console
    from rich.table import Table

    from hetprof.executor.algorithms import get_algorithm
    from hetprof.executor.algorithms.learner import Learner
    from hetprof.executor.models.modeling import build_causal_lm
    from hetprof.specs.models import ModelShape

    torch.set_num_threads(threads)
    sequences, repeats = (16, 3) if quick else (32, 5)
    shape = ModelShape("bench-512", "qwen3", 2, 512, 1536, 8, 4, 64, 512, True, 4096, qk_norm=True)
    batch = _ragged_batch(sequences, 32, 96, 1024, shape.vocab, seed)
    real = int(batch.attention_mask.sum())
    padded_tokens = batch.attention_mask.numel()
    # the padded side splits its rows into as many micro-batches as the packed side fills
    packs = Learner(torch.nn.Linear(1, 1), None, get_algorithm("grpo")(),
                    max_tokens_per_microbatch=budget)._micro_counts(batch.attention_mask,
                                                                    [torch.arange(sequences)])[0]
    model = build_causal_lm(shape, seed=seed)

    def update(**kwargs):
        trainee = copy.deepcopy(model)
        learner = Learner(trainee, torch.optim.SGD(trainee.parameters(), lr=1e-4), get_algorithm("grpo")(),
                          **kwargs)
        return lambda: learner.update(copy.deepcopy(batch))

    t_padded, t_packed = _paired_seconds(update(micro_batches=packs),
                                         update(max_tokens_per_microbatch=budget), repeats)
    token_ratio, time_ratio = padded_tokens / real, t_padded / t_packed
    table = Table(title=f"packed vs padded update — {sequences} sequences, responses lognormal mean 96 cap 1024, "
                        f"budget {budget} tokens ({packs} micro-batches each side), {threads} thread(s)")
    for col in ("measurement", "ratio", "sides (measured in this run)"):
        table.add_column(col, justify="right" if col == "ratio" else "left")
    table.add_row("tokens: padded / packed", f"{token_ratio:.2f}×", f"{padded_tokens:,} vs {real:,}")
    table.add_row("update time: padded / packed", f"{time_ratio:.2f}×",
                  f"{t_padded * 1e3:.0f} ms vs {t_packed * 1e3:.0f} ms")
    table.add_row("time ratio / token ratio", f"{time_ratio / token_ratio:.2f}", "goal: within 0.85–1.15")
    Console().print(table)


def _planned(cluster: Path, workload: Path, out: Path, max_evals: int, seed: int) -> dict:
    hetprof = str(Path(sys.executable).with_name("hetprof"))
    done = subprocess.run([hetprof, "plan", "-c", str(cluster), "-w", str(workload), "--max-evals", str(max_evals),
                           "--seed", str(seed), "--out", str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        raise click.ClickException(f"hetprof plan -w {workload.name} failed: {done.stderr.strip()[-500:]}")
    return json.loads(out.read_text())["predicted"]


def planned_iterations(cluster: Path, budget: int, max_evals: int, seed: int) -> None:
    """Each async example workload's planned iteration, padded (as written) and packed."""
    import yaml
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"planned iteration on {cluster.stem}: padded vs packed (≤ {budget:,} tokens per micro-batch)")
    for col in ("workload", "padded s", "packed s", "padded / packed", "bottleneck padded → packed"):
        table.add_column(col, justify="left" if col in ("workload", "bottleneck padded → packed") else "right")
    with tempfile.TemporaryDirectory(prefix="hetprof-packing-plans-") as tmp:
        for path in sorted((ROOT / "examples" / "workloads").glob("*async*.yaml")):
            spec = yaml.safe_load(path.read_text())
            spec.setdefault("training", {})["max_tokens_per_microbatch"] = budget
            packed_path = Path(tmp) / path.name
            packed_path.write_text(yaml.safe_dump(spec))
            padded = _planned(cluster, path, Path(tmp) / "padded.json", max_evals, seed)
            packed = _planned(cluster, packed_path, Path(tmp) / "packed.json", max_evals, seed)
            table.add_row(path.stem, f"{padded['iteration_s']:.1f}", f"{packed['iteration_s']:.1f}",
                          f"{padded['iteration_s'] / packed['iteration_s']:.2f}×",
                          f"{padded.get('bottleneck')} → {packed.get('bottleneck')}")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
