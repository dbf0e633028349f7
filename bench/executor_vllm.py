"""The executor bench's vLLM rows (`executor_bench.py --vllm`): the demo's job planned and run with
`--backend vllm`, and vLLM's generation rate against `hf`'s on one replica's batch."""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from pathlib import Path

import torch
from executor_run import ROOT, console, hetprof, run_and_read, truthful_workload
from rich.table import Table

# ---- the vLLM rows ----------------------------------------------------------------------------
VLLM_WORKLOAD = ROOT / "examples" / "workloads" / "grpo-tiny-vllm.yaml"


# Runs of the vLLM plan the rows take the median of: one run's median iteration swings between runs
# (each starts its own engines) by more than the goal's width on a shared 2-core machine.
VLLM_RUNS = 3


def vllm_run(work: Path, iterations: int, slots: int, quick: bool, runs: int = VLLM_RUNS) -> list[dict]:
    """Profile (with vLLM's own calls) → fit → plan for `--backend vllm` → run it `runs` times."""
    db, cluster = work / "profiles.db", work / "cluster.yaml"
    cluster.write_text(f"name: bench-cpu\nhosts:\n  - name: localhost\n    gpus: {{type: cpu, count: {slots}}}\n")
    workload = truthful_workload(work, slots, VLLM_WORKLOAD)
    job = ("--workload", str(workload), "--cluster", str(cluster))
    t0 = time.perf_counter()
    grid = ("--quick",) if quick else ()
    hetprof("profile", "--suite", "tasks", "--suite", "dptrain", "--suite", "vllmgen", "--models", "tiny-2x", *grid,
            *job, db=db, cwd=work)
    hetprof("profile", "--quick", "--suite", "collectives", "--models", "tiny-2x", db=db, cwd=work)
    hetprof("fit", "--stat", "median", db=db, cwd=work)
    hetprof("plan", "--cluster", str(cluster), "--workload", str(workload), "--cost-model", "fitted", "--backend",
            "vllm", "--search", "hetrl", "--seed", "0", "--max-tp", "1", "--max-pp", "1",
            "--out", str(work / "plan.json"), db=db, cwd=work)
    prep = time.perf_counter() - t0
    return [run_and_read(work, db, iterations, "profile (vLLM calls included)", prep) for _ in range(runs)]


def generation_rates(workload: Path, slots: int, rounds: int) -> dict[str, float]:
    """Generated tokens/s of each engine on the job's per-replica batch (its prompts, its response
    cap), calls alternated so both see the same machine; vLLM's engine core in its own process, as
    in a run. Also `vllm_call_s`: vLLM's median call, the run's generation call made alone."""
    from hetprof.executor.backends import get_backend
    from hetprof.executor.models.modeling import build_causal_lm
    from hetprof.executor.models.tokenizer import CharTokenizer
    from hetprof.executor.prompts.data import PromptSource
    from hetprof.specs import WorkloadSpec

    spec = WorkloadSpec.load(workload)
    tok = CharTokenizer()
    batch = -(-spec.sequences_per_step // slots)
    prompts = [tok.encode(p.text) for p in PromptSource.builtin(-(-batch // spec.responses_per_prompt)).batch(0)]
    prompts = [p for p in prompts for _ in range(spec.responses_per_prompt)][:batch]
    model = build_causal_lm(spec.models.actor, seed=0)
    torch.set_num_threads(1)  # a cpu slot is one core; the engine binds its threads to one
    engines = {"hf": get_backend("hf")(model, tok), "vllm": get_backend("vllm")(model, tok, device="cpu", own_process=True)}
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    tokens: dict[str, int] = dict.fromkeys(engines, 0)
    for i in range(rounds + 1):  # the first round warms up
        for name in (list(engines) if i % 2 else list(engines)[::-1]):
            t0 = time.perf_counter()
            out = engines[name].generate(prompts, spec.response_len.cap, generator=torch.Generator().manual_seed(i))
            if i:
                seconds[name].append(time.perf_counter() - t0)
                tokens[name] += int(out.lengths.sum())
    engines["vllm"].close()
    return {**{name: tokens[name] / sum(seconds[name]) for name in engines},
            "vllm_call_s": statistics.median(seconds["vllm"])}


def median_and_spread(values: list[float]) -> tuple[float, str]:
    """The median of per-run ratios, and their range as text ("—" for a single run)."""
    return statistics.median(values), (f"{min(values):.2f}–{max(values):.2f}" if len(values) > 1 else "—")


def vllm_rows(args: argparse.Namespace, work: Path, iterations: int) -> None:
    console.print(f"vLLM: profile → fit → plan --backend vllm → run ({args.vllm_runs} × {iterations} iterations)…")
    runs = vllm_run(work, iterations, args.slots, args.quick, args.vllm_runs)
    rates = generation_rates(work / f"workload-{VLLM_WORKLOAD.stem}.yaml", args.slots, 5 if args.quick else 15)
    table = Table(title=f"executor benchmark, vLLM rows ({'quick' if args.quick else 'full'}; {os.cpu_count()} cores; "
                        f"median of {len(runs)} runs, their range in brackets)")
    for col in ("ratio", "value", "goal", "measured from"):
        table.add_column(col, justify="left" if col in ("ratio", "measured from") else "right")
    pred = runs[0]["predicted"]
    value, spread = median_and_spread([r["measured"] / pred for r in runs] if pred else [math.nan])
    table.add_row("measured / predicted iteration, --backend vllm", f"{value:.2f} ({spread})", "0.85–1.15",
                  f"median {statistics.median(r['measured'] for r in runs) * 1e3:.1f} ms vs plan "
                  f"{pred * 1e3 if pred else math.nan:.1f} ms")
    for task, label in (("actor_gen", "generation stage"), ("weight_sync", "weight sync (with vLLM's reload)")):
        measured = [r["per_task"][task][0] for r in runs if task in r["per_task"]]
        predicted = runs[0]["per_task"].get(task, (None, None))[1]
        if not measured or not predicted:
            table.add_row(f"  its {label}, measured / predicted", "—", "0.85–1.15", "not in the run's records")
            continue
        value, spread = median_and_spread([m / predicted for m in measured])
        table.add_row(f"  its {label}, measured / predicted", f"{value:.2f} ({spread})", "0.85–1.15",
                      f"{statistics.median(measured) * 1e3:.1f} vs {predicted * 1e3:.1f} ms")
    gen = [r["per_task"]["actor_gen"][0] for r in runs if "actor_gen" in r["per_task"]]
    if gen:  # the run's generation against the same call made alone minutes later: no pricing in it
        value, spread = median_and_spread([g / rates["vllm_call_s"] for g in gen])
        table.add_row("  its generation stage / the same call alone", f"{value:.2f} ({spread})", "≈ 1",
                      f"{statistics.median(gen) * 1e3:.1f} vs {rates['vllm_call_s'] * 1e3:.1f} ms, the job's batch "
                      "on one engine after the runs")
    table.add_row("vLLM / hf generation tokens/s", f"{rates['vllm'] / rates['hf']:.2f}", "—",
                  f"{rates['vllm']:.0f} vs {rates['hf']:.0f} tokens/s, one replica's batch, alternated")
    console.print(table)
    walls = " + ".join(f"{r['run_s']:.0f}" for r in runs)
    console.print(f"reward {runs[0]['reward_first']:.3f} → {runs[0]['reward_last']:.3f}; profile+fit+plan "
                  f"{runs[0]['prep_s']:.0f} s, runs {walls} s")
