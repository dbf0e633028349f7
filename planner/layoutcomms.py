"""The collectives and optimizer updates a task layout adds to its replicas' passes.

Data-parallel gradient (and shard) traffic, the learner's small all-reduces, Ulysses all-to-alls and
the Adam steps depend on the
whole layout (its slowest link, its largest share), not on one replica, so they are charged once per
layout on top of the replicas' time (planner/taskcosts.py).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from hetprof.costmodels import Placement, Work
from hetprof.planner.graph import RLGraph
from hetprof.planner.links import LinkTable
from hetprof.specs import Device, WorkloadSpec
from hetprof.specs.layout import TaskLayout
from hetprof.specs.vocabulary import TaskKind


class LayoutPricing(Protocol):
    """What these charges read of a task's pricing (planner.taskcosts.TaskCosts provides it)."""

    cm: Any
    graph: RLGraph
    workload: WorkloadSpec
    devices: dict[str, Device]
    links: LinkTable
    sequences: int
    sequence_prompt: float
    sequence_response: float

    def work(self, task: str, batch: int, layers: int | None = None, response_len: float | None = None,
             prompt_len: float | None = None) -> Work: ...


def optimizer_steps(costs: LayoutPricing, layout: TaskLayout) -> float:
    """The step's Adam updates (one per mini-batch and epoch) on the slowest GPU type of the layout,
    each over the optimizer shard its sharding leaves a rank."""
    work = costs.work(layout.task, 1)
    types = {costs.devices[d].type for d in layout.devices()}
    dp = min(layout.dp, costs.workload.training.shard_group or layout.dp)
    one = max(costs.cm.optimizer_step_time(work, Placement(t, layout.tp, layout.pp, dp=dp,
                                                           sharding=layout.sharding)) for t in types)
    return one * costs.workload.ppo_epochs * costs.workload.mini_batches


def learner_collectives(costs: LayoutPricing, layout: TaskLayout) -> float:
    """The learner's own all-reduces across its data-parallel replicas, once an update: every
    mini-batch's loss-denominator token count (fp32), and with a token budget every mini-batch's
    pack count (int64, the most any replica needs) — latency-bound messages over the slowest link.
    Why priced: each is a collective every replica waits at (executor/algorithms/learner.py)."""
    if layout.dp <= 1:
        return 0.0
    hosts = {costs.devices[d].host for d in layout.devices()}
    link = costs.links.slowest(hosts) or costs.links.between(*(2 * sorted(hosts)[:1]))
    minis = costs.workload.ppo_epochs * costs.workload.mini_batches
    seconds = costs.cm.collective_time("all_reduce", 4 * minis, layout.dp, link)
    if costs.workload.training.max_tokens_per_microbatch is not None:
        seconds += costs.cm.collective_time("all_reduce", 8 * minis, layout.dp, link)
    return seconds


def ulysses_seconds(costs: LayoutPricing, layout: TaskLayout, sp: int, problems: list[str]) -> float:
    """Ulysses all-to-alls of the busiest replica's tokens (every epoch's) over its host's GPU link."""
    if layout.dp % sp:
        problems.append(f"{layout.task}: training.sequence_parallel {sp} does not divide its {layout.dp} replicas")
    first = costs.devices[layout.replicas[0][0]]
    batch = max(1, round(max(layout.shares) * costs.sequences))
    epochs = costs.workload.ppo_epochs if costs.graph.kind_of(layout.task) == TaskKind.TRAINING else 1
    work = costs.work(layout.task, batch, None, costs.sequence_response, costs.sequence_prompt)
    link = costs.links.between(first.host, first.host)
    return epochs * costs.cm.sequence_parallel_time(work, Placement(first.type, layout.tp, layout.pp), sp, link)


def dp_traffic(costs: LayoutPricing, layout: TaskLayout, seconds: float) -> float:
    """Data-parallel traffic over the slowest link among the replicas. Training: per optimizer step
    (gradients; parameters too when sharded), FSDP's overlapping the step's compute (`seconds` over
    all steps). A forward-only pass on FSDP shards (the log-prob pass): one pass's gathers."""
    hosts = {costs.devices[d].host for d in layout.devices()}
    link = costs.links.slowest(hosts) or costs.links.between(*(2 * sorted(hosts)[:1]))
    place = Placement(costs.devices[layout.replicas[0][0]].type, layout.tp, layout.pp)
    training = costs.graph.kind_of(layout.task) == TaskKind.TRAINING
    steps = costs.workload.ppo_epochs * costs.workload.mini_batches if training else 1
    per_call = costs.workload.mini_batches if training else 1  # sequences of one optimizer step, or the pass
    batch = max(1, round(max(layout.shares) * costs.sequences / per_call))
    work = costs.work(layout.task, batch, None, costs.sequence_response, costs.sequence_prompt)
    compute = seconds / steps if math.isfinite(seconds) else 0.0
    if not training:
        return costs.cm.fsdp_gather_time(work, place, layout.dp, link, compute)
    return costs.cm.dp_grad_sync_time(work, place, layout.dp, link, layout.sharding, compute) * steps
