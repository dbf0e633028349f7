"""hetrl's search speed, this checkout against another, side by side in one run (DESIGN §9).

Each measurement is one hetrl search at a fixed seed and `--max-evals`, run in a fresh subprocess
of a given interpreter: `--old-python` (default: the main checkout's virtualenv, which imports the
main checkout's code) and this interpreter (this checkout). The two alternate, so machine load
hits both alike, and the table gives evaluations per CPU-second of the search process (its
process time: load from other processes slows the wall clock, not the CPU seconds the search
spends), their ratio, and whether both picked the same plan — a speed-up must not change the
search's answers, nor the number of evaluations it makes. This checkout runs with the arms the
baseline lacks switched off (like for like); `--all-arms` adds its answer with every arm on.

    .venv/bin/python bench/search_speed_bench.py                       # multi-region 8B GRPO sync, 2000 evals
    .venv/bin/python bench/search_speed_bench.py --rows multi-continent:8b:ppo:async --max-evals 1000
    .venv/bin/python bench/search_speed_bench.py --old-python /path/to/other/.venv/bin/python --repeats 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OLD_PYTHON = Path("/work/main/.venv/bin/python")
ROWS = ["multi-region:8b:grpo:sync"]


def child(row: str, evals: int, seed: int, like_old: bool) -> dict:
    """One search in this process (whichever checkout this interpreter imports): its speed and its
    plan. `like_old` switches off the arms the baseline checkout does not have (pairs of pools) and
    the screening of arms, so both walk the same space in the same order and must agree on every plan."""
    from hetprof.costmodels import get_cost_model
    from hetprof.planner.search import SearchContext, get_search
    from hetprof.planner.search.hetrl import HetRLConfig
    from hetprof.planner.search.space import encode_candidate
    from hetprof.planner.simulator import Simulator
    from hetprof.specs import ClusterSpec, WorkloadSpec

    scenario, model, algorithm, mode = row.split(":")
    cluster = ClusterSpec.load(ROOT / "examples" / "clusters" / f"hetrl-{scenario}.yaml")
    workload = WorkloadSpec.load(ROOT / "examples" / "workloads" / f"qwen3-{model}-{algorithm}-{mode}.yaml")
    sim = Simulator(cluster, workload, get_cost_model("analytical"), seed=seed)
    search = get_search("hetrl")
    import optuna  # noqa: F401  (imported before the clock starts, as every search needs it)

    knobs = {f.name for f in dataclasses.fields(HetRLConfig)}
    off = {k: v for k, v in (("pool_pairs", False), ("screen_arms", 0)) if k in knobs}
    config = HetRLConfig(**off) if like_old and off else None
    # a checkout from before the planning context takes the simulator itself
    given = {"planning": sim.planning} if "planning" in {f.name for f in dataclasses.fields(SearchContext)} \
        else {"sim": sim}
    ctx = SearchContext(**given, seed=seed, time_budget_s=3600.0, workers=1, max_evals=evals, config=config)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    res = search(ctx).run()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"evaluations": res.evaluations, "cpu_s": cpu, "wall_s": wall, "iteration_s": res.score.iteration_s,
            "plan": encode_candidate(res.candidate), "module": sys.modules["hetprof"].__file__}


def measure(python: str, row: str, evals: int, seed: int, like_old: bool = True) -> dict:
    """`child` in a subprocess of `python`, run from this checkout's bench folder."""
    cmd = [python, str(Path(__file__).resolve()), "--child", row, "--max-evals", str(evals), "--seed", str(seed)]
    cmd += ["--like-old"] if like_old else []
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd="/")
    if out.returncode != 0:
        raise SystemExit(f"{python}: the search failed on {row}:\n{out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="*", default=ROWS, help="scenario:model:algorithm:mode (default %(default)s)")
    ap.add_argument("--max-evals", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1, help="alternating old/new runs per row (median reported)")
    ap.add_argument("--all-arms", action="store_true",
                    help="also run this checkout with every arm on (its answer, beside the like-for-like one)")
    ap.add_argument("--old-python", default=str(OLD_PYTHON),
                    help="interpreter whose installed checkout is the baseline (default %(default)s)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--like-old", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.max_evals, args.seed, args.like_old)))
        return
    if not Path(args.old_python).exists():
        print(f"--old-python {args.old_python} does not exist: this checkout against itself")
        args.old_python = sys.executable
    print(f"load average before: {load_average()}")
    header = f"{'row':34} {'evals old/new':>13} {'eval/CPU-s old':>14} {'new':>8} {'new÷old':>8} " \
             f"{'s/iter old':>10} {'new':>8}  same plan  {'s/iter, new with all its arms':>29}"
    print(header)
    failed = False
    for row in args.rows:
        runs: dict[str, list[dict]] = {"old": [], "new": []}
        for _ in range(args.repeats):
            runs["old"].append(measure(args.old_python, row, args.max_evals, args.seed))
            runs["new"].append(measure(sys.executable, row, args.max_evals, args.seed))
        speed = {k: statistics.median(r["evaluations"] / r["cpu_s"] for r in v) for k, v in runs.items()}
        old, new = runs["old"][0], runs["new"][0]
        same = all(r["plan"] == old["plan"] for r in runs["old"] + runs["new"])
        more = new["evaluations"] >= old["evaluations"]
        failed |= not same or not more
        full = measure(sys.executable, row, args.max_evals, args.seed, like_old=False) if args.all_arms else None
        print(f"{row:34} {old['evaluations']:>6}/{new['evaluations']:<6} {speed['old']:>14.1f} "
              f"{speed['new']:>8.1f} {speed['new'] / speed['old']:>7.2f}× {old['iteration_s']:>10.2f} "
              f"{new['iteration_s']:>8.2f}  {'yes' if same else 'NO':9}  "
              f"{full['iteration_s'] if full else math.nan:>29.2f}")
    print(f"load average after: {load_average()} (old: {args.old_python}; new: {sys.executable})")
    if failed:
        raise SystemExit("the checkouts disagree: a different plan or fewer evaluations")


if __name__ == "__main__":
    main()
