"""The main job on this machine, end to end: profile -> fit -> plan -> run -> validate.

`make demo` runs this. It drives the same `hetprof` commands a user types, against a private
database under demo-out/ (so ~/.hetprof is never touched), and ends with the two things the demo is
meant to show: the reward rising over the run, and the plan's predicted iteration time next to the
measured one — before and after `hetprof fit` has learned from the run (the loop hetprof is built
around). Each step is timed; the whole job stays within a few minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
CLUSTER = HERE / "clusters" / "cpu-local.yaml"
WORKLOAD = HERE / "workloads" / "grpo-tiny.yaml"

console = Console()


def hetprof(*args: str, db: Path, cwd: Path) -> float:
    """Run one `hetprof` subcommand as a user would; stop the demo on the first failure."""
    exe = Path(sys.executable).with_name("hetprof")
    cmd = [str(exe), "--db", str(db), *args]
    console.rule(f"[bold]$ hetprof {' '.join(args)}")
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        console.print(f"[red]step failed (exit {done.returncode}): hetprof {' '.join(args)}")
        sys.exit(done.returncode)
    console.print(f"[dim]{elapsed:.1f} s")
    return elapsed


def iteration_rows(log: Path) -> list[dict]:
    """The per-iteration summaries of a run log (JSONL), in order."""
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("type", "iteration") == "iteration" and "iteration" in r]


def reward_of(row: dict) -> float:
    for key in ("reward_mean", "reward"):
        if key in row:
            return float(row[key])
    raise KeyError(f"no reward in run-log row {sorted(row)}")


def summarise(log: Path, timings: dict[str, float], after_run: float | None = None) -> None:
    rows = iteration_rows(log)
    rewards = [reward_of(r) for r in rows]
    table = Table(title="demo summary")
    table.add_column("what")
    table.add_column("value", justify="right")
    for step, seconds in timings.items():
        table.add_row(f"{step} wall time", f"{seconds:.1f} s")
    table.add_row("iterations", str(len(rows)))
    if len(rewards) >= 10:
        first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
        table.add_row("mean reward, first 5 iterations", f"{first:.3f}")
        table.add_row("mean reward, last 5 iterations", f"{last:.3f}")
    measured = [r["iteration_s"] for r in rows if "iteration_s" in r]
    predicted = [r["predicted_s"] for r in rows if r.get("predicted_s")]
    if measured and predicted:
        steady = sorted(measured[1:] or measured)[len(measured[1:] or measured) // 2]
        table.add_row("predicted iteration time", f"{predicted[0]:.2f} s")
        table.add_row("measured iteration time (median)", f"{steady:.2f} s")
        table.add_row("measured / predicted", f"{steady / predicted[0]:.2f}")
        if after_run:
            table.add_row("predicted after fit learned from this run (in-sample)", f"{after_run:.2f} s")
            table.add_row("measured / that prediction", f"{steady / after_run:.2f}")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo-out"), help="working folder (recreated)")
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()

    out = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    db = out / "profiles.db"
    plan, log, rescored = out / "plan.json", out / "run.jsonl", out / "plan-after-run.json"

    timings = {
        # the quick grid plus the shapes this job runs on this cluster (--workload/--cluster)
        "profile": hetprof("profile", "--quick", "--models", "tiny,tiny-2x", "--workload", str(WORKLOAD),
                           "--cluster", str(CLUSTER), db=db, cwd=out),
        # the summary compares the prediction with a median iteration: fit each shape's median repeat
        "fit": hetprof("fit", "--stat", "median", "--report", str(out / "fit.png"), db=db, cwd=out),
        "plan": hetprof("plan", "--cluster", str(CLUSTER), "--workload", str(WORKLOAD),
                        "--cost-model", "fitted", "--search", "hetrl", "--seed", "0",
                        # a 2-layer model gains nothing from TP or PP on CPU slots: plan data
                        # parallelism, the layout whose prediction the demo compares with the run
                        "--max-tp", "1", "--max-pp", "1",
                        "--out", str(plan), "--gantt", str(out / "plan.png"), db=db, cwd=out),
        "run": hetprof("run", str(plan), "--iterations", str(args.iterations), "--log", str(log),
                       "--checkpoint-dir", str(out / "ckpt"), "--seed", "0", db=db, cwd=out),
    }
    timings["validate"] = hetprof("validate", str(log), "--gantt", str(out / "run-timeline.png"), db=db, cwd=out)
    # the loop closes: fit learns each task's run factor from what the run recorded, and the same plan
    # is re-scored with it (no search) — the prediction the next plan of this job would start from
    timings["fit on the run"] = hetprof("fit", "--stat", "median", db=db, cwd=out)
    timings["re-score"] = hetprof("plan", "--cluster", str(CLUSTER), "--workload", str(WORKLOAD),
                                  "--cost-model", "fitted", "--evaluate", str(plan), "--out", str(rescored),
                                  db=db, cwd=out)
    summarise(log, timings, json.loads(rescored.read_text())["predicted"]["iteration_s"])
    for what, where in (("TensorBoard event files", out / "tensorboard"),
                        ("trained actor (Hugging Face)", out / "ckpt" / "hf" / f"iter-{args.iterations:06d}" / "actor"),
                        ("measured vs predicted timeline", out / "run-timeline.png")):
        console.print(f"{what}: {where}")
    console.print(f"everything the demo made is under {out}")


if __name__ == "__main__":
    main()
