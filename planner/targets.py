"""`hetprof plan --target verl|areal`: search only plans that framework can express.

The rules are hetprof/specs/expressible.py's, the ones `hetprof export` refuses by. A search keeps
proposing what it proposes; the targeted simulator first projects each candidate onto what the
framework does by itself — an even batch split over replicas, Megatron's even layer split — and
then scores it, or refuses it naming the rule it breaks. The searches need no change: a plan they
return is projected once more (the same projection) before it is written, so the plan file holds
exactly what was scored.
"""

from __future__ import annotations

import dataclasses

from hetprof.planner.candidate import Candidate
from hetprof.planner.simulator import Score, Simulator
from hetprof.specs import ClusterSpec, expressible
from hetprof.specs.layout import TaskLayout

TARGETS = tuple(expressible.RULES)


def even(lay: TaskLayout, sequences: int) -> TaskLayout:
    """The layout as a framework runs it: equal batch shares (kept as they are where they already differ
    by at most one of the step's `sequences`), and Megatron's even layer split when it has one."""
    split = expressible.even_split(sum(lay.layer_splits[0]), lay.pp) if lay.layer_splits else None
    slack = expressible.SHARE_TOLERANCE + 1 / max(sequences, 1)
    shares = lay.shares if lay.shares and max(lay.shares) - min(lay.shares) <= slack else (1.0 / lay.dp,) * lay.dp
    return dataclasses.replace(lay, shares=shares, layer_splits=(split,) * lay.dp if split else lay.layer_splits)


def project(cand: Candidate, sequences: int) -> Candidate:
    """`cand` with every layout made even (what the target framework would run of it)."""
    return dataclasses.replace(cand, layouts=tuple((t, even(lay, sequences)) for t, lay in cand.layouts))


def arrangement_of(sim: Simulator, cand: Candidate) -> expressible.Arrangement:
    layouts, grouped = sim.with_followers(cand)
    groups = [(f"group{i}", tasks, devs) for i, (tasks, devs) in enumerate(zip(grouped, cand.group_devices,
                                                                              strict=True))]
    return expressible.arrangement(groups, layouts, sim.cluster.devices(), sim.workload.mode, sim.backend,
                                   sim.workload.sequences_per_step,
                                   [t for t in layouts if sim.graph.model_of(t).moe is not None])


def needs(sim: Simulator, target: str, cand: Candidate) -> list[str]:
    """The features of `target` that `cand` needs and the framework lacks (empty: it can run it)."""
    return [rule.feature for rule, _ in expressible.problems(target, arrangement_of(sim, cand))]


class TargetedSimulator(Simulator):
    """A simulator that scores only what `target` can express (set `target` after construction)."""

    target: str = ""

    def on_cluster(self, cluster: ClusterSpec) -> TargetedSimulator:
        sub = super().on_cluster(cluster)
        sub.target = self.target
        return sub

    def evaluate(self, candidate: Candidate) -> Score:
        cand = project(candidate, self.workload.sequences_per_step)
        # a malformed candidate is left to the simulator, which says why
        found = [] if self.structure_problems(cand) else expressible.problems(self.target, arrangement_of(self, cand))
        if found:
            price = sum(self.price.get(d, 0.0) for d in sorted(set(cand.devices())))
            return Score(float("inf"), False, tuple(expressible.refusal(self.target, r, w) for r, w in found),
                         price_per_hour=price)
        return super().evaluate(cand)


def baseline_searches(target: str) -> tuple[str, ...]:
    """Searches whose every plan `target` expresses, run beside the requested one (verl's own tuning)."""
    return ("verl",) if target == "verl" else ()
