"""The search's speed-ups change no answer: shares rounding and shared time curves are exact."""

from __future__ import annotations

import math

import numpy as np

from hetprof.costmodels import get_cost_model
from hetprof.planner.balance import Curve, balance_shares
from hetprof.planner.search import layouts
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec


def _old_balance_shares(curves, total):
    """balance_shares as it was before its heaps: the same bisection, rounded by a linear scan per sequence."""
    n = len(curves)
    distinct = {id(c): c for c in curves}.values()
    lo, hi = 0.0, max(c.at(c.most) for c in distinct if c.most)
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(c.capacity(mid) for c in curves) >= total:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-9 * hi:
            break
    counts = [c.capacity(hi) for c in curves]
    while sum(counts) < total:
        i = min(range(n), key=lambda j: (curves[j].at(counts[j] + 1), j))
        counts[i] += 1
    surplus = sum(counts) - total
    while surplus > 0:
        i = max((j for j in range(n) if counts[j] > 0), key=lambda j: (curves[j].at(counts[j]), -j))
        counts[i] -= 1
        surplus -= 1
    return counts


def test_heap_rounding_matches_the_linear_scan():
    rng = np.random.default_rng(3)
    checked = 0
    for _ in range(300):
        total = int(rng.integers(1, 300))
        kinds = []
        for _ in range(int(rng.integers(1, 5))):
            rate, fixed, most = float(rng.uniform(0.5, 4)), float(rng.uniform(0, 2)), int(rng.integers(1, 200))
            kinds.append(Curve(lambda b, r=rate, f=fixed, m=most: math.inf if b > m else f + b / r + 0.01 * b * b,
                               total))
        curves = [kinds[int(rng.integers(0, len(kinds)))] for _ in range(int(rng.integers(1, 40)))]
        if sum(c.most for c in curves) < total:
            assert balance_shares(curves, total) is None
            continue
        assert balance_shares(curves, total) == _old_balance_shares(curves, total)
        checked += 1
    assert checked > 100


def _sim() -> Simulator:
    """One region, one link speed: replicas of one kind are priced exactly alike, so every layout
    is the same whatever the memo held before."""
    cluster = ClusterSpec.from_dict({
        "name": "uniform", "hosts": [{"name": f"h{i}", "gpus": {"type": t, "count": 4}, "region": "us"}
                                     for i, t in enumerate(["A100-40GB", "L4", "A100-40GB", "L40S"])],
        "network": {"intra_region": {"latency": "0.2ms", "bandwidth": "10Gbps"},
                    "inter_region": {"latency": "30ms", "bandwidth": "1Gbps"}}})
    work = WorkloadSpec.from_dict({
        "name": "w", "algorithm": "grpo", "mode": "sync", "models": {"actor": "qwen3-0.6b"}, "prompts_per_step": 16,
        "responses_per_prompt": 4, "prompt_len": {"mean": 128}, "response_len": {"mean": 192}})
    return Simulator(cluster, work, get_cost_model("analytical"))


def test_a_shared_memo_builds_the_layouts_a_fresh_one_does():
    sim = _sim()
    devices = sorted(sim.devices)
    rng = np.random.default_rng(5)
    shared: dict = {}
    for _ in range(40):
        order = tuple(rng.permutation(devices)[:int(rng.integers(2, len(devices) + 1))])
        task = ("actor_gen", "actor_train", "ref_infer")[int(rng.integers(0, 3))]
        for shape in ((1, 1), (1, 2), (2, 1)):
            got = layouts.build_layout(sim.planning, task, order, *shape, memo=shared)
            assert got == layouts.build_layout(sim.planning, task, order, *shape, memo={}), (task, order, shape)
    assert any(k[0] == "exact-curve" for k in shared)
    assert sum(k[0] == "exact-curve" for k in shared) < sum(k[0] == "curve" for k in shared)
