"""The iteration record: every rank's report of one iteration turned into the run's durable record.

A pure function of the run's fixed facts (`RecordContext`, built once from the plan by the loop) and the ranks'
`IterationReport`s, so it is tested on its own. The record is a contract: `hetprof validate` reads
it back from the log, `records.db_rows` stores it as run records, and `costmodels/runrows.py` turns
its `phase_times` into training rows for `hetprof fit` (field list in records.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hetprof.errors import ExecutionError
from hetprof.executor.records.iteration_report import IterationReport
from hetprof.executor.records.mfu import FLOPS_KEY, summed_flops, utilisation
from hetprof.specs import Plan
from hetprof.specs.vocabulary import SYNC_EDGES, SyncEdge, Task


@dataclasses.dataclass(frozen=True)
class RecordContext:
    """What every record of a run says about the run itself."""

    run: str
    plan_hash: str
    mode: str
    staleness_bound: int
    algorithm: str
    replica_leads: dict[str, tuple[int, ...]]  # per task, each replica's first rank (it reports)
    layouts: dict[str, str]
    devices: dict[str, list[str]]
    sync_sources: dict[str, int]  # per sync edge the plan has, the rank that sends
    sync_receivers: dict[str, int]  # per sync edge, how many copies it overwrites
    predicted: dict[str, float]
    predicted_iteration_s: float | None
    work: dict[str, dict[str, Any]]
    verify_sync: bool = False
    train_peaks: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)  # mfu.training_peaks
    device_count: int = 0  # the devices the plan runs on, all tasks together
    kl_in_reward: bool = False  # the algorithm puts its KL to the reference in the reward (PPO), not the loss


def predicted_seconds(plan: Plan) -> dict[str, float]:
    """The plan's prediction per task, per other breakdown entry, and per sync edge (the planner
    names a weight transfer `weights:<trainer>-><receiver>`)."""
    predicted = {t.task: t.predicted_s for t in plan.tasks if t.predicted_s}
    predicted.update({k: v for k, v in plan.predicted.breakdown.items() if k not in predicted and v})
    for edge, (_, sender, receiver) in SYNC_EDGES.items():
        sent = plan.predicted.breakdown.get(f"weights:{sender}->{receiver}")
        if sent:
            predicted.setdefault(str(edge), sent)
    return predicted


def measured_seconds(ctx: RecordContext, reports: list[IterationReport], leader: IterationReport
                  ) -> tuple[dict[str, float], dict[str, list[float]]]:
    """(per task the slowest replica, per task every replica's time) plus the leader's reward and
    advantage and each sync edge's transfer as its sender timed it (receivers also wait for training)."""
    by_rank = {r.rank: r for r in reports}
    stages: dict[str, float] = {}
    replicas: dict[str, list[float]] = {}
    for task, leads in ctx.replica_leads.items():
        per = [by_rank[r].task_seconds[task] for r in leads if r in by_rank and task in by_rank[r].task_seconds]
        if per:
            replicas[task] = per
            stages[task] = max(per)
    for extra in ("reward", "advantage"):
        if extra in leader.task_seconds:
            stages[extra] = leader.task_seconds[extra]
    for edge, src in ctx.sync_sources.items():
        if src in by_rank and edge in by_rank[src].task_seconds:
            stages[edge] = by_rank[src].task_seconds[edge]
    return stages, replicas


def check_sync_digests(ctx: RecordContext, iteration: int, reports: list[IterationReport]) -> None:
    """After each sync, one digest from the trainer and one from every receiving copy, all equal."""
    for edge, receivers in ctx.sync_receivers.items():
        digests = [d for r in reports for d in r.digests.get(edge, [])]
        if len(set(digests)) != 1 or len(digests) != 1 + receivers:
            raise ExecutionError(f"iteration {iteration}: after the {edge} a receiver's weights differ from the "
                                 f"trainer's ({len(set(digests))} distinct digests of {len(digests)})")


TRAIN_KEYS = ("kl", "clip_frac", "entropy", "policy_loss", "grad_norm", "lr")


def train_means(reports: list[IterationReport], task: str = Task.ACTOR_TRAIN,
                keys: tuple[str, ...] = TRAIN_KEYS) -> dict[str, float]:
    """The learner's statistics over a task's replicas, weighted by the rows each trained on."""
    stats = [r.train_stats[task] for r in reports if r.train_stats.get(task)]
    out = {}
    for key in keys:  # over the replicas that report the statistic (0.0 when none does)
        having = [s for s in stats if key in s]
        rows = sum(s["n"] for s in having) or 1
        out[key] = float(sum(s[key] * s["n"] for s in having) / rows)
    return out


def critic_means(reports: list[IterationReport]) -> dict[str, float]:
    """The critic's update statistics (PPO), prefixed `critic_`; empty when no critic trains."""
    stats = [s for r in reports if (s := r.train_stats.get(Task.CRITIC_TRAIN))]
    keys = sorted({k for s in stats for k in s} - {"n", "optimizer_steps", "update_seconds", "logprob_seconds",
                                                   FLOPS_KEY})
    return {f"critic_{k}": v for k, v in train_means(reports, Task.CRITIC_TRAIN, tuple(keys)).items()} if stats else {}


def timeline(reports: list[IterationReport]) -> list[dict[str, Any]]:
    """Each rank's task spans as seconds since the iteration's first one started (the measured Gantt)."""
    spans = [(r.device, task, s) for r in reports for task, s in r.spans.items()]
    if not spans:
        return []
    origin = min(s[0] for _, _, s in spans)
    return [{"device": d, "task": t, "start": s[0] - origin, "end": s[1] - origin}
            for d, t, s in sorted(spans, key=lambda x: (x[2][0], x[0]))]


def work_timings(reports: list[IterationReport]) -> dict[str, list[dict[str, Any]]]:
    """Every rank's timings of single pieces of work, by task, each tagged with where it ran."""
    out: dict[str, list[dict[str, Any]]] = {}
    for report in reports:
        info = report.rank_info
        for task, timings in report.work_timings.items():
            out.setdefault(task, []).extend(
                {**t, "device": report.device, "device_type": info.device_type, "threads": info.threads,
                 "dtype": info.dtypes.get(task)} for t in timings)
    return out


def build_record(ctx: RecordContext, iteration: int, seconds: float, reports: list[IterationReport],
                 leader_rank: int, now: float) -> dict[str, Any]:
    """The iteration record (fields in records.py) from every rank's report; `now` is its timestamp."""
    leader = next(r for r in reports if r.rank == leader_rank)
    if leader.batch is None:
        raise ExecutionError(f"iteration {iteration}: the leader's report has no batch statistics")
    stages, replicas = measured_seconds(ctx, reports, leader)
    verified = None
    if ctx.verify_sync:
        check_sync_digests(ctx, iteration, reports)
        verified = True
    sync = leader.sync.get(SyncEdge.WEIGHT_SYNC)
    sync_bytes, sync_s = (sync.bytes, sync.seconds) if sync is not None else (0, 0.0)
    batch = leader.batch
    # the tokens of the batch this iteration trained on: in async mode the last iterations generate
    # nothing, and the tokens a loop step generates belong to a later iteration
    tokens = batch.tokens
    dtypes = {task: r.rank_info.dtypes[task] for r in reports for task in r.train_stats if task in r.rank_info.dtypes}
    mfu = utilisation(ctx.train_peaks, stages, summed_flops([r.train_stats for r in reports]), dtypes)
    return {
        "type": "iteration", "run": ctx.run, "plan_hash": ctx.plan_hash, "iteration": iteration,
        "version": iteration + 1, "mode": ctx.mode, "staleness_bound": ctx.staleness_bound,
        "algorithm": ctx.algorithm, "iteration_s": seconds, "stages": stages, "replicas": replicas,
        "predicted": dict(ctx.predicted), "predicted_iteration_s": ctx.predicted_iteration_s,
        "predicted_s": ctx.predicted_iteration_s,
        "tokens": tokens, "tokens_per_s": tokens / seconds if seconds > 0 else 0.0, "mfu": mfu,
        "sequences": batch.sequences, "device_count": ctx.device_count, "kl_in_reward": ctx.kl_in_reward,
        "reward_mean": batch.reward_mean, "prompt_tokens_mean": batch.prompt_tokens_mean,
        "response_tokens_mean": batch.response_tokens_mean, **train_means(reports), **critic_means(reports),
        "reward_std": batch.reward_std, "samples": batch.samples, "timeline": timeline(reports),
        "staleness_max": batch.staleness_max, "staleness_mean": batch.staleness_mean,
        "gen_versions": sorted({r.gen_version for r in reports if r.gen_version is not None}),
        "sync_bytes": sync_bytes, "sync_Bps": sync_bytes / sync_s if sync_s else 0.0, "sync_verified": verified,
        "generator_logprob_gap": max((r.backend_checks["logprob_gap"] for r in reports
                                      if "logprob_gap" in r.backend_checks), default=None),
        "layouts": dict(ctx.layouts), "devices": {t: list(d) for t, d in ctx.devices.items()},
        "pids": {r.device: r.pid for r in reports}, "time": now, "leader_phases": dict(leader.laps),
        "work": ctx.work, "phase_times": work_timings(reports), **leader.validation,
    }
