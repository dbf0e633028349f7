"""verl (HybridFlow) as a careful verl user runs it, scored by the same simulator as everything else.

What a verl job is: every role colocated on one pool of GPUs (the hybrid engine: generation and
training time-share the devices, weights resharded in place), generation at its own rollout TP,
training and the inference passes at the training engine's parallelism — FSDP over every GPU, or
Megatron's TP×PP — and the batch split evenly over data-parallel ranks with even layer splits:
verl does not know one GPU from another. What a careful user adds: the pool is chosen (all GPUs,
one region, one GPU type, one type within a region — whole hosts; `pools.host_pools`), and the
knobs (pool × rollout TP × training parallelism) are tuned exhaustively, each setting scored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from hetprof.errors import InfeasibleError
from hetprof.planner.candidate import Candidate
from hetprof.planner.search import layouts, register_search
from hetprof.planner.search.base import Ledger, Search, SearchConfig, SearchResult, knob
from hetprof.planner.search.pools import Pool, host_pools
from hetprof.specs.layout import TaskLayout
from hetprof.specs.plan import TASKS
from hetprof.specs.vocabulary import Task, TaskKind

FSDP = "fsdp"


@dataclasses.dataclass(frozen=True)
class VerlConfig(SearchConfig):
    choose_pool: bool = knob(True, "try every whole-host sub-pool (a region, a GPU type, both), not only all GPUs")
    fsdp: bool = knob(True, "try the FSDP training engine (TP1, state sharded over all replicas)")
    megatron: bool = knob(True, "try the Megatron training engine (one TP×PP for training and inference)")


def _train_engines(planning, order: tuple[str, ...], tasks: list[str], cfg: VerlConfig, max_tp: int,
                   max_pp: int) -> list[tuple[str, int, int]]:
    """(engine, tp, pp) settings every non-generation task can run at on these devices."""
    common = None
    for task in tasks:
        shapes = {(s.tp, s.pp) for s in layouts.feasible_shapes(planning, task, order, max_tp, max_pp)}
        common = shapes if common is None else common & shapes
    out: list[tuple[str, int, int]] = []
    if cfg.fsdp and (1, 1) in (common or set()) and len(order) > 1:
        out.append((FSDP, 1, 1))
    if cfg.megatron:
        out += [("megatron", tp, pp) for tp, pp in sorted(common or ())]
    return out


def _engine_layout(planning, task: str, order: tuple[str, ...], engine: str, tp: int, pp: int) -> TaskLayout | None:
    lay = layouts.build_layout(planning, task, order, tp, pp, balanced=False)
    if lay is not None and engine == FSDP and TASKS[task][0] == TaskKind.TRAINING and lay.dp > 1:
        lay = dataclasses.replace(lay, sharding=FSDP)       # verl's FSDP workers shard the whole state
    if lay is not None and engine == FSDP and lay.ep > 1:
        # verl's FSDP workers have no expert parallelism; an MoE model gets Megatron's EP (the degree
        # build_layout chose, as a verl user tunes expert_model_parallel_size) on the Megatron engine only
        lay = dataclasses.replace(lay, ep=1)
    return lay


@register_search("verl")
class VerlBaseline(Search):
    """One colocated pool, rollout TP apart from the training engine, even splits; tuned exhaustively."""

    config_type = VerlConfig
    config: VerlConfig

    def _settings(self, pool: Pool) -> Iterator[tuple[str, Candidate]]:
        planning, ctx = self.ctx.planning, self.ctx
        order = pool.devices
        tasks = list(planning.tasks)
        others = [t for t in tasks if t != Task.ACTOR_GEN]
        gen_tps = sorted({s.tp for s in layouts.feasible_shapes(planning, Task.ACTOR_GEN, order, ctx.max_tp, 1)})
        engines = _train_engines(planning, order, others, self.config, ctx.max_tp, ctx.max_pp)
        for gen_tp in gen_tps:
            gen = layouts.build_layout(planning, Task.ACTOR_GEN, order, gen_tp, 1, balanced=False)
            if gen is None:
                continue
            for engine, tp, pp in engines:
                lays = {Task.ACTOR_GEN: gen}
                for task in others:
                    lay = _engine_layout(planning, task, order, engine, tp, pp)
                    if lay is None:
                        break
                    lays[task] = lay
                else:
                    knobs = f"{pool.name}, rollout TP{gen_tp}, " + (
                        f"FSDP×{len(order)}" if engine == FSDP else f"Megatron TP{tp}×PP{pp}")
                    yield knobs, Candidate((tuple(tasks),), (order,), lays)

    def run(self) -> SearchResult:
        planning = self.ctx.planning
        ledger = Ledger(self.ctx)
        pools = host_pools(planning) if self.config.choose_pool else host_pools(planning)[:1]
        chosen, tried = "", 0
        for pool in pools:
            for knobs, cand in self._settings(pool):
                if ledger.exhausted:
                    break
                before = ledger.best
                ledger.evaluate(cand)
                tried += 1
                if ledger.best is not before:
                    chosen = knobs
        if not tried:
            raise InfeasibleError("verl: no pool of whole hosts holds every role at any rollout TP and training "
                                  "engine (FSDP or TP×PP)")
        return ledger.result("verl", settings_tried=tried, pools=len(pools), chosen=chosen)
