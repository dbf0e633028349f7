"""Cost-model accuracy on task rows profiled on this machine, side by side.

Profiles the RL task kernels here with the real profiler (`hetprof profile --suite tasks`, into a
temporary database), fits the per-task cost models, and prints per task type: the rows, the
held-out MAPE of the fitted model (folds hold out whole shape ranges), the analytical model's MAPE
on the same rows, and their ratio. It also times cache-cold cost-model queries of both models.

    .venv/bin/python bench/costmodel_bench.py            # full sweep (a few minutes on 2 cores)
    .venv/bin/python bench/costmodel_bench.py --quick    # small sweep (well under a minute)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def profile(db: Path, models: str, quick: bool, rounds: int) -> float:
    """Runs the profiler CLI `rounds` times; repeats accumulate, so min-of-repeats sees past bursts."""
    exe = str(Path(sys.executable).with_name("hetprof"))
    start = time.perf_counter()
    for r in range(rounds):
        cmd = [exe, "--db", str(db), "profile", "--suite", "tasks", "--models", models, *(["--quick"] if quick else [])]
        print(f"round {r + 1}/{rounds}: {' '.join(cmd[1:])}", flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"profiling failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def query_speed(db) -> tuple[float, float]:
    """Microseconds per cache-cold task_time query (distinct works) for analytical and fitted."""
    from hetprof.costmodels import Placement, Work, get_cost_model
    from hetprof.specs.models import PRESETS

    works = [Work(k, PRESETS["tiny-2x"], b, p, r, dtype="fp32") for k in ("generation", "inference", "training")
             for b in (1, 3, 8, 17, 64) for p in (16, 40, 100) for r in (8, 50, 200)]
    out = []
    for name in ("analytical", "fitted"):
        cm = get_cost_model(name, db=db)
        t = time.perf_counter()
        for w in works:
            cm.task_time(w, Placement("cpu"))
        out.append((time.perf_counter() - t) / len(works) * 1e6)
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="quick profiler sweep, one round")
    ap.add_argument("--models", default="tiny,tiny-2x", help="presets to profile (default: tiny,tiny-2x)")
    ap.add_argument("--rounds", type=int, help="profiler rounds (default: 2, quick: 1)")
    ap.add_argument("--db", type=Path, help="reuse/keep this database instead of a temporary one")
    ap.add_argument("--no-profile", action="store_true", help="fit the rows already in --db")
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    from hetprof.costmodels.fitting import fit_database
    from hetprof.profiles import ProfileDB

    rounds = args.rounds or (1 if args.quick else 2)
    with tempfile.TemporaryDirectory() as tmp:
        db_path = args.db or Path(tmp) / "bench.db"
        prof_s = 0.0 if args.no_profile else profile(db_path, args.models, args.quick, rounds)
        with ProfileDB(db_path) as db:
            t = time.perf_counter()
            fits = fit_database(db)
            fit_s = time.perf_counter() - t
            a_us, f_us = query_speed(db)
    table = Table(title=f"cost models on task rows profiled here ({args.models}, {'quick' if args.quick else 'full'} "
                        f"sweep × {rounds})")
    for col in ("task type", "device", "shapes", "samples", "fitted held-out MAPE", "analytical MAPE",
                "analytical/fitted", "repeat noise", "family", "folds"):
        table.add_column(col, justify="left" if col in ("task type", "device", "family") else "right")
    for f in fits:
        ok = f.heldout.mape <= 0.10
        table.add_row(f.task_type, f"{f.device_type} {f.dtype}", str(f.n_rows), str(f.n_samples),
                      f"[{'green' if ok else 'red'}]{f.heldout.mape:.1%}[/]", f"{f.analytical_mape:.1%}",
                      f"{f.analytical_mape / f.heldout.mape:.1f}×", f"{f.noise:.1%}", f.family,
                      str(f.heldout.n_folds))
    console = Console(width=max(Console().width, 150))  # a table of ratios is unreadable when wrapped
    console.print(table)
    console.print(f"profiling {prof_s:.0f} s, fitting {fit_s:.1f} s; cache-cold task_time query: analytical "
                  f"{a_us:.0f} µs, fitted {f_us:.0f} µs (fitted / analytical {f_us / a_us:.2f}×)")
    console.print("repeat noise: how far a shape's target moves between two profiler rounds (or halves of its "
                  "repeats) — the floor under any model's error on these rows")
    console.print("goal: fitted held-out MAPE ≤ 10% for every task type — "
                  + ("[green]met[/]" if all(f.heldout.mape <= 0.10 for f in fits) else "[red]not met[/]"))


if __name__ == "__main__":
    main()
