"""What the catalog's efficiency curves change, measured side by side with another checkout in one run.

The same questions go to this checkout's cost model and simulator and to a baseline interpreter's
(e.g. the previous release's virtualenv, whose code used flat 70 % / 85 % / 80 % / 100 %
efficiencies): phase times on datasheet numbers, and the predicted iteration time of the verl-like
baseline plan (a deterministic search, any layout) on the example clusters. The table prints new/old ratios,
and how long each side took to answer (simulator set-up plus the search, fastest of 5), as a ratio too.

    .venv/bin/python bench/catalog_bench.py --baseline /work/main/.venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHASES = [  # (label, kind, model, layers, batch, tokens, device)
    ("decode b1 ctx1k", "decode", "qwen3-8b", 36, 1, 1024, "H100-SXM"),
    ("decode b64 ctx1k", "decode", "qwen3-8b", 36, 64, 1024, "H100-SXM"),
    ("prefill 8x2048", "prefill", "qwen3-8b", 36, 8, 2048, "H100-SXM"),
    ("train 4x4096", "train", "qwen3-8b", 36, 4, 4096, "H100-SXM"),
    ("prefill 8x2048", "prefill", "qwen3-8b", 36, 8, 2048, "A100-80GB"),
    ("prefill 8x2048", "prefill", "qwen3-8b", 36, 8, 2048, "L40S"),
]
REPEATS = 5
PLANS = [("hetrl-multi-region", "qwen3-8b-ppo-sync"), ("hetrl-single-region", "qwen3-4b-grpo-sync"),
         ("hetrl-multi-continent", "qwen3-14b-grpo-async")]


def measure() -> dict:
    """This interpreter's answers: phase seconds, and per plan case the verl plan's iteration seconds."""
    from hetprof.costmodels import get_cost_model
    from hetprof.costmodels.data import Phase
    from hetprof.planner.search import SearchContext, get_search
    from hetprof.planner.simulator import Simulator
    from hetprof.specs import ClusterSpec, WorkloadSpec
    from hetprof.specs.models import PRESETS

    cm = get_cost_model("analytical")
    out: dict = {"phases": [], "plans": []}
    for _label, kind, model, layers, batch, tokens, device in PHASES:
        ph = Phase(kind, PRESETS[model], layers, batch, tokens, recompute=kind == "train")
        out["phases"].append(cm.phase_time(ph, device).seconds)
    for cluster, workload in PLANS:
        walls = []
        for _ in range(REPEATS):  # the fastest repeat: the machine is shared
            started = time.perf_counter()
            sim = Simulator(ClusterSpec.load(ROOT / "examples" / "clusters" / f"{cluster}.yaml"),
                            WorkloadSpec.load(ROOT / "examples" / "workloads" / f"{workload}.yaml"),
                            get_cost_model("analytical"), executable=False)
            res = get_search("verl")(SearchContext(planning=sim.planning, objective="throughput", seed=0, time_budget_s=60)).run()
            walls.append(time.perf_counter() - started)
        out["plans"].append({"iteration_s": res.score.iteration_s if res.score else float("nan"),
                             "wall_s": min(walls)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=False, help="python of the checkout to compare with")
    ap.add_argument("--emit", action="store_true", help=argparse.SUPPRESS)  # the baseline's side
    args = ap.parse_args()
    if args.emit:
        print(json.dumps(measure()))
        return 0
    from rich.console import Console
    from rich.table import Table

    new = measure()
    old = None
    if args.baseline:
        done = subprocess.run([args.baseline, __file__, "--emit"], capture_output=True, text=True, check=True)
        old = json.loads(done.stdout.strip().splitlines()[-1])
    console = Console(width=120)
    table = Table(title="phase seconds on datasheet numbers (analytical model)")
    for col in ("phase", "GPU", "old s", "new s", "new/old"):
        table.add_column(col, justify="left" if col in ("phase", "GPU") else "right")
    for i, (label, *_, device) in enumerate(PHASES):
        n = new["phases"][i]
        o = old["phases"][i] if old else float("nan")
        table.add_row(label, device, f"{o:.4g}", f"{n:.4g}", f"{n / o:.2f}" if old else "-")
    console.print(table)
    table = Table(title="verl-like plan (seed 0): predicted iteration and time to answer")
    for col in ("cluster", "workload", "old iter s", "new iter s", "new/old", "old wall s", "new wall s", "wall new/old"):
        table.add_column(col, justify="left" if col in ("cluster", "workload") else "right")
    for i, (cluster, workload) in enumerate(PLANS):
        n = new["plans"][i]
        o = old["plans"][i] if old else {"iteration_s": float("nan"), "wall_s": float("nan")}
        table.add_row(cluster, workload, f"{o['iteration_s']:.2f}", f"{n['iteration_s']:.2f}",
                      f"{n['iteration_s'] / o['iteration_s']:.2f}", f"{o['wall_s']:.2f}", f"{n['wall_s']:.2f}",
                      f"{n['wall_s'] / o['wall_s']:.2f}")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
