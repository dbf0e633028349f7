"""Executor benchmark: how close a real run comes to its plan, what the runtime adds, how fast sync is.

Three ratios, each measured side by side in this one run:
- measured / predicted iteration time of a CPU plan, after `hetprof profile` (the task and
  data-parallel training suites in full at the job's shapes, the collectives quick; tiny model) and
  `hetprof fit` have fed the fitted cost model the planner predicts with (goal 0.85–1.15) — and again after that run's own records went back into `hetprof fit` and the
  job was re-planned and run a second time (the loop `hetprof run --db` exists for);
  The run's own prefill, decode and training shapes (profiled exactly, thanks to --workload),
  re-timed right around each run, also give the ratio with the machine's drift since profiling taken out;
  and the refit's plan over the very run it learned from (same layouts) checks that a run's records
  and the plan's pricing describe the same work, with no drift between runs in it;
- executor overhead = measured iteration / sum of the measured stage times (goal ≤ 1.10), i.e. what
  message passing, batching and bookkeeping add to generation, inference, training and sync;
- weight-sync effective bandwidth / a plain gloo broadcast of the same bytes over the same group
  (goal ≥ 0.8): what bucketing, flattening and unflattening cost.

    .venv/bin/python bench/executor_bench.py            # 12 iterations, 64 MB sync model
    .venv/bin/python bench/executor_bench.py --quick    # 6 iterations, 16 MB
    .venv/bin/python bench/executor_bench.py --tensorboard-ab   # the overhead with TensorBoard on vs off
    .venv/bin/python bench/executor_bench.py --vllm     # only the vLLM rows (needs make install-vllm)
    .venv/bin/python bench/executor_bench.py --max-tokens 512   # packed micro-batches of ≤ 512 tokens

The vLLM rows (`--vllm`): measured / predicted iteration of the demo's GRPO job on tiny-2x run with
`--backend vllm` (and of its generation stage and weight sync, which includes the engine's reload), after `hetprof profile --workload` (tasks, dptrain, and vLLM's own calls: vllmgen)
and `hetprof fit`; the run's generation stage over the same call made alone on one engine just
after; and vLLM's generation tokens/s over `hf`'s on that job's per-replica batch, the two engines'
calls alternated in this one process. The planned job is run `--vllm-runs` times (default 3): each
row is the median over the runs, with their range beside it, since one run swings by more than the
goal's width.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from executor_run import console, hetprof, planned_run, truthful_workload
from executor_vllm import VLLM_RUNS, vllm_rows
from rich.table import Table
from weightsync_rows import SYNC_WORLD, sync_bandwidth

from hetprof.executor.parallel.weightsync import DEFAULT_BUCKET_MB
from hetprof.executor.records.run_log import read_log


# ---- 2b: the same overhead with TensorBoard on and off ----------------------------------------
def tensorboard_ab(work: Path, iterations: int, slots: int, pairs: int) -> dict[str, dict[str, float]]:
    """Overhead and iteration time of one data-parallel plan run with TensorBoard on, then off, `pairs`
    times in alternating order (a shared machine's drift falls on both arms alike)."""
    from hetprof.executor.launch.handwritten_plan import handwritten_plan
    from hetprof.specs import ClusterSpec, WorkloadSpec

    cluster = ClusterSpec.from_dict({"name": "bench-cpu", "hosts": [{"name": "localhost",
                                                                     "gpus": {"type": "cpu", "count": slots}}]})
    devices = [f"localhost:{i}" for i in range(slots)]
    workload = WorkloadSpec.load(truthful_workload(work, slots)).to_dict()
    plan = work / "ab-plan.json"
    handwritten_plan(cluster, workload, {"actor_gen": devices, "ref_infer": devices, "actor_train": devices}).save(plan)
    arms: dict[str, list[dict]] = {"on": [], "off": []}
    for i in range(2 * pairs):
        arm = ("on", "off")[(i + i // 2) % 2]  # on off off on on off ...
        log = work / f"ab-{i}-{arm}.jsonl"
        hetprof("run", str(plan), "--iterations", str(iterations), "--log", str(log), "--seed", "0", "--quiet",
                *(() if arm == "on" else ("--no-tensorboard",)), db=work / "ab.db", cwd=work)
        if arm == "on" and not any((work / "tensorboard").rglob("events.out.tfevents.*")):
            raise SystemExit("the TensorBoard arm wrote no event file")
        records = read_log(log)
        arms[arm] += records[2:] if len(records) > 4 else records[1:]
    return {arm: {"overhead": statistics.median(r["iteration_s"] / sum(r["stages"].values()) for r in recs),
                  "iteration_s": statistics.median(r["iteration_s"] for r in recs), "n": len(recs)}
            for arm, recs in arms.items()}


def print_tensorboard_ab(ab: dict[str, dict[str, float]], iterations: int, pairs: int) -> None:
    table = Table(title=f"executor overhead with TensorBoard on vs off ({pairs} pairs of {iterations}-iteration "
                        f"runs, alternated; {os.cpu_count()} cores)")
    for col in ("ratio", "value", "goal", "measured from"):
        table.add_column(col, justify="left" if col in ("ratio", "measured from") else "right")
    for arm in ("on", "off"):
        table.add_row(f"executor overhead, TensorBoard {arm}", f"{ab[arm]['overhead']:.3f}", "≤ 1.10",
                      f"iteration / sum of stage times, median of {ab[arm]['n']} steady iterations")
    table.add_row("iteration time, on / off", f"{ab['on']['iteration_s'] / ab['off']['iteration_s']:.3f}", "≈ 1",
                  f"medians {ab['on']['iteration_s'] * 1e3:.1f} vs {ab['off']['iteration_s'] * 1e3:.1f} ms")
    console.print(table)


def _task_ratio(runs: list[dict], task: str) -> str:
    """One task's time in the refit plan over its measured time in the run the refit learned from."""
    measured, _ = runs[0]["per_task"].get(task, (None, None))
    _, predicted = runs[1]["per_task"].get(task, (None, None))
    return f"{predicted / measured:.2f}" if measured and predicted else "—"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations and a smaller sync model")
    parser.add_argument("--slots", type=int, default=2, help="CPU worker slots of the planned cluster")
    parser.add_argument("--sync-mb", type=float, help="size of the weight-sync model (default 64, quick 16)")
    parser.add_argument("--bucket-mb", type=float, default=DEFAULT_BUCKET_MB, help="weight-sync bucket size")
    parser.add_argument("--sync-only", action="store_true", help="only the weight-sync ratio")
    parser.add_argument("--sync-world", type=int, help=f"processes in the sync group (default {SYNC_WORLD})")
    parser.add_argument("--tensorboard-ab", action="store_true",
                        help="only the executor overhead with TensorBoard on vs off (no profiling)")
    parser.add_argument("--ab-pairs", type=int, default=2, help="on/off run pairs of --tensorboard-ab")
    parser.add_argument("--vllm", action="store_true", help="only the vLLM rows (needs make install-vllm)")
    parser.add_argument("--vllm-runs", type=int, default=VLLM_RUNS,
                        help=f"runs of the vLLM plan its rows take the median of (default {VLLM_RUNS})")
    parser.add_argument("--max-tokens", type=int, help="run packed: the workload's training.max_tokens_per_microbatch")
    parser.add_argument("--keep", type=Path, help="work in this new or empty folder and keep it (database, plans, run logs)")
    args = parser.parse_args()
    iterations, mb, repeats = (6, 16.0, 5) if args.quick else (12, 64.0, 15)
    mb = args.sync_mb or mb
    with tempfile.TemporaryDirectory(prefix="hetprof-executor-bench-") as tmp:
        work = Path(tmp)
        if args.keep:
            work = args.keep.resolve()
            if work.exists() and any(work.iterdir()):
                # an old profiles.db would be fitted together with this run's profile
                parser.error(f"--keep {work}: the folder is not empty; give a new or empty one")
            work.mkdir(parents=True, exist_ok=True)
        if args.tensorboard_ab:
            print_tensorboard_ab(tensorboard_ab(work, iterations, args.slots, args.ab_pairs), iterations,
                                 args.ab_pairs)
            return
        if args.vllm:
            return vllm_rows(args, work, iterations)
        world = args.sync_world or SYNC_WORLD
        console.print(f"weight sync vs plain broadcast ({mb:.0f} MB, 1 sender → {world - 1} receiver(s), gloo)…")
        bw = sync_bandwidth(mb, repeats, work, args.bucket_mb, world)
        if args.sync_only:
            console.print(f"sync {bw['sync_Bps'] / 1e9:.2f} GB/s, plain {bw['plain_Bps'] / 1e9:.2f} GB/s, ratio "
                          f"{bw['sync_Bps'] / bw['plain_Bps']:.2f} ({bw['buckets']} buckets)")
            return
        console.print(f"profile → fit → plan → run ({iterations} iterations, {args.slots} CPU slots)…")
        runs = planned_run(work, iterations, args.slots, args.max_tokens)
    print_run_rows(runs, bw, args.quick, args.max_tokens)


def print_run_rows(runs: list[dict], bw: dict, quick: bool, max_tokens: int | None) -> None:
    """The bench's table of ratios, then each task's and each replica's times per run."""
    packed = f"; packed ≤ {max_tokens} tokens" if max_tokens else ""
    table = Table(title=f"executor benchmark ({'quick' if quick else 'full'}; {os.cpu_count()} cores{packed})")
    for col in ("ratio", "value", "goal", "measured from"):
        table.add_column(col, justify="left" if col in ("ratio", "measured from") else "right")
    for run in runs:
        pred = run["predicted"]
        table.add_row(f"measured / predicted iteration (fitted on {run['fitted_on']})",
                      f"{run['measured'] / pred:.2f}" if pred else "—", "0.85–1.15",
                      f"median {run['measured'] * 1e3:.1f} ms vs plan {pred * 1e3 if pred else float('nan'):.1f} ms")
        table.add_row("  the same, machine drift taken out", f"{run['measured'] / pred / run['drift']:.2f}" if pred else "—",
                      "0.85–1.15", f"profiled kernels re-timed around the run: {run['drift']:.2f}× "
                      f"their rows")
    if len(runs) == 2 and runs[0]["layouts"] == runs[1]["layouts"] and runs[1]["predicted"]:
        # the refit learned from run 1 and planned the same layouts: pricing run 1 back is a check of
        # recording against pricing that no drift between runs enters
        table.add_row("refit plan / run 1 it learned from", f"{runs[1]['predicted'] / runs[0]['measured']:.2f}",
                      "0.85–1.15", f"{runs[1]['predicted'] * 1e3:.1f} vs {runs[0]['measured'] * 1e3:.1f} ms; "
                      + ", ".join(f"{task} {_task_ratio(runs, task)}" for task in runs[0]["per_task"]
                                  if _task_ratio(runs, task) != "—"))
    table.add_row("executor overhead", f"{runs[0]['overhead']:.3f}", "≤ 1.10",
                  "iteration / sum of stage times (median, run 1)")
    table.add_row("weight-sync / plain broadcast bandwidth", f"{bw['sync_Bps'] / bw['plain_Bps']:.2f}", "≥ 0.8",
                  f"{bw['sync_Bps'] / 1e9:.2f} vs {bw['plain_Bps'] / 1e9:.2f} GB/s, {bw['bytes'] / 1e6:.0f} MB "
                  f"in {bw['buckets']} buckets, 1 → {bw['world'] - 1}")
    console.print(table)
    # the drift-free column divides by the run's drift probe: how far the model is off, not the machine
    # a row per (task, fit), so the table stays readable in an 80-column terminal
    tasks = Table(title="per task: measured (median) vs predicted ms, each fit (goal 0.80–1.25 each)")
    tasks.add_column("task", no_wrap=True)
    tasks.add_column("fitted on", no_wrap=True)
    for col in ("measured", "predicted", "ratio", "drift out"):
        tasks.add_column(col, justify="right")
    for task in runs[0]["per_task"]:
        for run in runs:
            measured, predicted = run["per_task"].get(task, (None, None))
            known = bool(predicted) and measured is not None
            tasks.add_row(task, run["fitted_on"], f"{measured * 1e3:.1f}" if measured is not None else "—",
                          f"{predicted * 1e3:.1f}" if predicted else "—",
                          f"{measured / predicted:.2f}" if known else "—",
                          f"{measured / predicted / run['drift']:.2f}" if known else "—")
    console.print(tasks)
    for run in runs:
        console.print(f"fit on {run['fitted_on']}: layouts {run['layouts']}; reward {run['reward_first']:.3f} → "
                      f"{run['reward_last']:.3f}; profile+fit+plan {run['prep_s']:.0f} s, run {run['run_s']:.0f} s")
        steps = run["iterations"] - (2 if run["iterations"] > 4 else 1)
        console.print("  per replica, median ms (replica 0 the slowest in k of the steady steps): " + "; ".join(
            f"{task} {' / '.join(f'{m * 1e3:.1f}' for m in medians)} ({k}/{steps})"
            for task, (medians, k) in run["replicas"].items()))


if __name__ == "__main__":
    main()
