"""The planner bench's checks beyond the ratio table (issue 15): sub-pool costs, anytime quality, load.

- cost: hetrl's $/iteration on the whole cluster must be no worse than its own result on any one
  region or one GPU type of it (the subsets a user would try by hand, each searched alone with the
  same effort);
- anytime: hetrl at a short budget against a long one, median over seeds, optionally with a
  CPU-heavy process running beside it (`cpu_load`) to show what load does to a clock budget.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import statistics
from collections.abc import Callable, Iterator

from hetprof.planner.search.subpools import sub_clusters

SCENARIOS = ["single-region", "multi-region", "multi-country", "multi-continent"]
MODELS = ["4b", "8b", "14b"]
ALGORITHMS = ["ppo", "grpo"]
MODES = ["sync", "async"]
COST_TOLERANCE = 1e-6       # relative: equal plans priced twice may differ in the last digits


def full_grid() -> list[tuple[str, str, str, str]]:
    """The 48-row HetRL grid: network scenario × Qwen3 size × algorithm × mode."""
    return [(s, m, a, o) for s in SCENARIOS for m in MODELS for a in ALGORITHMS for o in MODES]


def subset12() -> list[tuple[str, str, str, str]]:
    """Every scenario × model once, the algorithm and mode cycling so each of the four (algorithm,
    mode) pairs appears three times: the rows the median-of-seeds and anytime checks run on."""
    rows = []
    for i, (s, m) in enumerate((s, m) for s in SCENARIOS for m in MODELS):
        rows.append((s, m, ALGORITHMS[i % 2], MODES[(i // 2) % 2]))
    return rows


def cost_check(sim, run: Callable[[object], object]) -> dict:
    """hetrl's $/iteration (objective cost) on the cluster and on each sub-cluster; `run(sim)` is
    one cost search returning a result or None. `worst` is the full result over the cheapest
    sub-pool result (≤ 1 + tolerance passes)."""
    full = run(sim)
    full_cost = full.score.cost_per_iteration if full is not None else math.inf
    subs: dict[str, float] = {}
    for name, cluster in sub_clusters(sim.cluster):
        res = run(sim.on_cluster(cluster))
        subs[name] = res.score.cost_per_iteration if res is not None else math.inf
    cheapest = min(subs.values(), default=math.inf)
    worst = full_cost / cheapest if math.isfinite(cheapest) else (1.0 if math.isfinite(full_cost) else math.inf)
    cheapest_name = min(subs, key=subs.get) if subs else "—"
    return {"cost_full": full_cost, "cost_subs": subs, "cost_cheapest_sub": cheapest_name,
            "cost_ratio": worst, "cost_ok": worst <= 1 + COST_TOLERANCE}


def median_of(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if len(finite) == len(values) and finite else math.inf


def _spin(stop) -> None:
    """A CPU-heavy loop (the load beside the search) until `stop` is set."""
    x = 0
    while not stop.is_set():
        for i in range(100_000):
            x = (x * 31 + i) % 1_000_003


@contextlib.contextmanager
def cpu_load(active: bool) -> Iterator[None]:
    """With `active`, one CPU-bound process runs beside the block and is stopped after it."""
    if not active:
        yield
        return
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    proc = ctx.Process(target=_spin, args=(stop,), daemon=True)
    proc.start()
    try:
        yield
    finally:
        stop.set()
        proc.join(timeout=10)
        if proc.is_alive():
            proc.terminate()
            proc.join()
