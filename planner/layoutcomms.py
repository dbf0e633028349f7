"""The collectives and optimizer updates a task layout adds to its replicas' passes.

Data-parallel gradient (and shard) traffic, the learner's small all-reduces, Ulysses all-to-alls,
context parallelism's ring passes and the Adam steps depend on the
whole layout (its slowest link, its largest share), not on one replica, so they are charged once per
layout on top of the replicas' time (planner/taskcosts.py).
"""

from __future__ import annotations

import math
from collections import Counter

from hetprof.costmodels import LinkSpec, Placement, comm
from hetprof.planner.basis import PricingBasis
from hetprof.specs.layout import TaskLayout
from hetprof.specs.vocabulary import TaskKind


def optimizer_steps(basis: PricingBasis, layout: TaskLayout) -> float:
    """The step's Adam updates (one per mini-batch and epoch) on the slowest GPU type of the layout,
    each over the optimizer shard its sharding leaves a rank."""
    work = basis.work(layout.task, 1)
    types = {basis.devices[d].type for d in layout.devices()}
    dp = min(layout.dp, basis.workload.training.shard_group or layout.dp)
    one = max(basis.cm.optimizer_step_time(work, Placement(t, layout.tp, layout.pp, dp=dp,
                                                           sharding=layout.sharding, ep=layout.ep)) for t in types)
    return one * basis.workload.ppo_epochs * basis.workload.mini_batches


def learner_collectives(basis: PricingBasis, layout: TaskLayout) -> float:
    """The learner's own all-reduces across its data-parallel replicas, once an update: every
    mini-batch's loss-denominator token count (fp32), and with a token budget every mini-batch's
    pack count (int64, the most any replica needs) — latency-bound messages over the slowest link.
    Why priced: each is a collective every replica waits at (executor/algorithms/learner.py)."""
    if layout.dp <= 1:
        return 0.0
    hosts = {basis.devices[d].host for d in layout.devices()}
    link = basis.links.slowest(hosts) or basis.links.between(*(2 * sorted(hosts)[:1]))
    minis = basis.workload.ppo_epochs * basis.workload.mini_batches
    seconds = basis.cm.collective_time("all_reduce", 4 * minis, layout.dp, link)
    if basis.workload.training.max_tokens_per_microbatch is not None:
        seconds += basis.cm.collective_time("all_reduce", 8 * minis, layout.dp, link)
    return seconds


def ulysses_seconds(basis: PricingBasis, layout: TaskLayout, sp: int, problems: list[str]) -> float:
    """Ulysses all-to-alls of the busiest replica's tokens (every epoch's) over its host's GPU link."""
    if layout.dp % sp:
        problems.append(f"{layout.task}: training.sequence_parallel {sp} does not divide its {layout.dp} replicas")
    first = basis.devices[layout.replicas[0][0]]
    batch = max(1, round(max(layout.shares) * basis.sequences))
    epochs = basis.workload.ppo_epochs if basis.graph.kind_of(layout.task) == TaskKind.TRAINING else 1
    work = basis.work(layout.task, batch, None, basis.sequence_response, basis.sequence_prompt)
    link = basis.links.between(first.host, first.host)
    return epochs * basis.cm.sequence_parallel_time(work, Placement(first.type, layout.tp, layout.pp), sp, link)


def ring_seconds(basis: PricingBasis, layout: TaskLayout) -> float:
    """Context parallelism's ring passes of keys and values (every epoch's) for the busiest replica,
    over the slowest link among a stage's cp TP groups (its host's GPU link when they share one)."""
    i = max(range(layout.dp), key=lambda r: layout.shares[r])
    stage = layout.stage_devices(i, 0)
    hosts = {basis.devices[d].host for d in stage}
    link = basis.links.slowest(hosts) or basis.links.between(*(2 * sorted(hosts)[:1]))
    batch = max(1, round(layout.shares[i] * basis.sequences))
    epochs = basis.workload.ppo_epochs if basis.graph.kind_of(layout.task) == TaskKind.TRAINING else 1
    work = basis.work(layout.task, batch, None, basis.sequence_response, basis.sequence_prompt, cp=layout.cp)
    first = basis.devices[stage[0]]
    return epochs * basis.cm.context_parallel_time(work, Placement(first.type, layout.tp, layout.pp), layout.cp, link)


def expert_groups(layout: TaskLayout) -> list[tuple[str, ...]]:
    """The devices of each expert-parallel all-to-all: one pipeline stage of `ep` consecutive replicas
    (Megatron's and vLLM's EP ranks are consecutive data-parallel ranks, the layout orders replicas
    locality first, and a stage's MoE layers exchange tokens with the same stage of the others).
    With whole experts (etp 1) every TP rank of those stages is in it, as in vLLM's EP over DP × TP;
    with experts sliced over TP a Megatron task has one group per TP (× CP) position, the ranks
    holding the same slice of the experts."""
    ep = max(1, layout.ep)
    whole = layout.folded or layout.kind == TaskKind.GENERATION
    out: list[tuple[str, ...]] = []
    for g in range(0, layout.dp, ep):
        for s in range(layout.pp):
            stages = [layout.stage_devices(r, s) for r in range(g, min(g + ep, layout.dp))]
            if whole:
                out.append(tuple(d for stage in stages for d in stage))
            else:
                out.extend(tuple(stage[i] for stage in stages) for i in range(min(len(st) for st in stages)))
    return out


def expert_link(basis: PricingBasis, layout: TaskLayout) -> LinkSpec | None:
    """The link an MoE layer's dispatch and combine all-to-alls cross, as one GPU's goodput: the host's
    own GPU link when a group sits on one host; across hosts the other hosts' share of the bytes over
    the slowest link among the group's hosts, beside the rest over the GPU link (comm.all_to_all_Bps),
    each host's network shared by every GPU of the layout on it whose group spans hosts (the groups of
    other replicas and pipeline stages exchange at the same time); the slowest group's, at its most
    loaded host; None without expert parallelism. Looked up in the layout's LinkTable like every
    other collective's."""
    if layout.expert_ranks <= 1:
        return None
    groups = [[basis.devices[d].host for d in group] for group in expert_groups(layout)]
    crossing = Counter(h for hosts in groups if len(set(hosts)) > 1 for h in hosts)
    worst: LinkSpec | None = None
    for hosts in groups:
        network = basis.links.slowest(set(hosts))
        for host in set(hosts):
            link = basis.links.between(host, host)
            if network is not None:
                link = LinkSpec(network.alpha_s, comm.all_to_all_Bps(link.beta_Bps, network.beta_Bps, len(hosts),
                                                                     hosts.count(host), crossing[host]))
            worst = link if worst is None or link.beta_Bps < worst.beta_Bps else worst
    return worst


def dp_traffic(basis: PricingBasis, layout: TaskLayout, seconds: float) -> float:
    """Data-parallel traffic over the slowest link among the replicas. Training: per optimizer step
    (gradients; parameters too when sharded), FSDP's overlapping the step's compute (`seconds` over
    all steps). A forward-only pass on FSDP shards (the log-prob pass): one pass's gathers."""
    hosts = {basis.devices[d].host for d in layout.devices()}
    link = basis.links.slowest(hosts) or basis.links.between(*(2 * sorted(hosts)[:1]))
    place = Placement(basis.devices[layout.replicas[0][0]].type, layout.tp, layout.pp, ep=layout.ep)
    training = basis.graph.kind_of(layout.task) == TaskKind.TRAINING
    steps = basis.workload.ppo_epochs * basis.workload.mini_batches if training else 1
    per_call = basis.workload.mini_batches if training else 1  # sequences of one optimizer step, or the pass
    batch = max(1, round(max(layout.shares) * basis.sequences / per_call))
    work = basis.work(layout.task, batch, None, basis.sequence_response, basis.sequence_prompt)
    compute = seconds / steps if math.isfinite(seconds) else 0.0
    if not training:
        return basis.cm.fsdp_gather_time(work, place, layout.dp, link, compute)
    # context-parallel ranks hold partial gradients of the same weights: they reduce with the replicas
    return basis.cm.dp_grad_sync_time(work, place, layout.dp * layout.cp, link, layout.sharding, compute) * steps
