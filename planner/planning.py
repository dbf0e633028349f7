"""The planning context: what a search may read and call of one planning problem.

A search proposes candidates and the simulator scores them; between the two sits this narrow,
frozen view, so a search sees the problem (cluster, workload, the tasks it places), the hardware
(devices with their types, hosts and regions, the GPU catalog, the links, the cost model) and the
few questions it may ask (score a candidate, price a replica or a layout, a replica's memory) —
never the simulator's memos or its internals. `Simulator.planning` builds it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hetprof.errors import InfeasibleError
from hetprof.planner.score import Score, objective_value

if TYPE_CHECKING:
    from hetprof.costmodels import MemoryEstimate
    from hetprof.planner.candidate import Candidate
    from hetprof.planner.graph import RLGraph
    from hetprof.planner.links import LinkTable
    from hetprof.planner.taskcosts import TaskCosts, TaskEval
    from hetprof.specs import ClusterSpec, Device, WorkloadSpec
    from hetprof.specs.catalog import Catalog
    from hetprof.specs.layout import TaskLayout
    from hetprof.specs.models import ModelShape
    from hetprof.specs.vocabulary import TaskKind


@dataclasses.dataclass(frozen=True, eq=False)
class PlanningContext:
    """One planning problem as a search sees it: plain facts, and the calls a search may make."""

    # the problem
    cluster: ClusterSpec
    workload: WorkloadSpec
    tasks: tuple[str, ...]          # the tasks a search places (a follower rides on its leader's layout)
    seed: int                       # the seed of the step's sampled lengths (a study's name records it)
    executable: bool                # plan only layouts `hetprof run` carries out
    # the hardware
    devices: Mapping[str, Device]   # id -> device (type, host, region, index)
    catalog: Catalog                # GPU types: memory, FLOPs, bandwidth
    links: LinkTable                # links between hosts, measured over the spec
    cost_model: Any                 # the cost model, for the ILP's own linear pricing
    # what answers the calls (the simulator's own pieces; a search never touches them directly)
    _graph: RLGraph = dataclasses.field(repr=False)
    _costs: TaskCosts = dataclasses.field(repr=False)
    _score: Callable[[Candidate], Score] = dataclasses.field(repr=False)
    _rebuild: Callable[[ClusterSpec], PlanningContext] = dataclasses.field(repr=False)

    # ---- workload facts -------------------------------------------------------------------------
    def model_of(self, task: str) -> ModelShape:
        """The model `task` runs."""
        return self._graph.model_of(task)

    def kind_of(self, task: str) -> TaskKind:
        """Generation, inference or training."""
        return self._graph.kind_of(task)

    # ---- scoring --------------------------------------------------------------------------------
    def evaluate(self, candidate: Candidate) -> Score:
        """The simulator's score of a candidate (memoised: a revisit is free)."""
        return self._score(candidate)

    def objective_value(self, score: Score, objective: str, budget: float | None = None) -> float:
        """Lower is better; infeasible (or over the $/hour budget) is infinite."""
        return objective_value(score, objective, budget)

    # ---- pricing pieces a search balances with --------------------------------------------------
    def replica_seconds(self, task: str, devices: Sequence[str], tp: int, pp: int, batch: int,
                        layer_split: Sequence[int] | None = None, cp: int = 1) -> float:
        """One replica's seconds for `batch` sequences of `task` on these devices (stages of tp × cp)."""
        for d in devices:
            if d not in self.devices:
                raise InfeasibleError(f"device {d!r} is not part of cluster {self.cluster.name!r}")
        return self._costs.replica_seconds(task, tuple(devices), tp, pp, int(batch), layer_split, cp)

    def pipeline_seconds(self, task: str, devices: Sequence[str], tp: int, pp: int, batch: int,
                         split: Sequence[int]) -> float:
        """One call of `batch` sequences through a replica's stages (a layer split's balance)."""
        return self._costs.replicas.pipeline_seconds(task, devices, tp, pp, batch, split)

    def stage_signature(self, devices: Sequence[str], tp: int, pp: int, cp: int = 1) -> tuple:
        """What decides a replica's seconds: replicas with equal signatures cost the same at any batch."""
        return self._costs.replicas.stage_signature(devices, tp, pp, cp)

    def replica_memory(self, task: str, device_type: str, tp: int, layers: int, batch: int, dp: int = 1,
                       sharding: str = "none", sp: int | None = None, cp: int = 1, ep: int = 1) -> MemoryEstimate:
        """Peak bytes on one GPU of a replica (`layers` of its stage, its state sharded over `dp`, each
        sequence split over `sp` Ulysses and `cp` context-parallel ranks, an MoE model's experts over `ep`)."""
        return self._costs.memory(task, device_type, tp, layers, batch, dp, sharding, sp, cp, ep)

    def micro_tokens(self, task: str, device_type: str, tp: int, layers: int, batch: int, dp: int = 1,
                     sharding: str = "none", sp: int | None = None, cp: int = 1, ep: int = 1) -> int | None:
        """The padded micro-batch token budget the planner chose for such a GPU (None: not the planner's)."""
        return self._costs.micro_tokens(task, device_type, tp, layers, batch, dp, sharding, sp, cp, ep)

    def task_eval(self, layout: TaskLayout) -> TaskEval:
        """One task's layout judged: seconds, memory per device, problems."""
        return self._costs.evaluate(layout)

    # ---- the same problem elsewhere -------------------------------------------------------------
    def on_cluster(self, cluster: ClusterSpec) -> PlanningContext:
        """The same problem (workload, cost model, seed, settings) on another cluster, e.g. a sub-pool."""
        return self._rebuild(cluster)
