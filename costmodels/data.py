"""The data the cost models speak: frozen, hashable, validated on construction.

Frozen dataclasses key the caches (the planner repeats the same questions many thousands of times
per search) and make every answer a pure function of its inputs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

from hetprof.specs.models import ModelShape
from hetprof.specs.precision import PRECISIONS
from hetprof.specs.vocabulary import TaskKind
from hetprof.specs.workload import recompute_mode

WorkKind = TaskKind  # a priced piece of work has the kind of the task it belongs to
PhaseKind = Literal["prefill", "decode", "train"]


@dataclasses.dataclass(frozen=True)
class LinkSpec:
    """A link's α–β model: a message of S bytes takes alpha_s + S / beta_Bps seconds."""

    alpha_s: float
    beta_Bps: float

    def __post_init__(self) -> None:
        if not (self.alpha_s >= 0 and math.isfinite(self.alpha_s)):
            raise ValueError(f"LinkSpec.alpha_s must be a finite number >= 0, got {self.alpha_s!r}")
        if not self.beta_Bps > 0:
            raise ValueError(f"LinkSpec.beta_Bps must be > 0, got {self.beta_Bps!r}")


@dataclasses.dataclass(frozen=True)
class Work:
    """One RL task's work for one replica.

    generation: produce `batch` sequences (prefill prompt_len, then response_len decode steps);
    inference / training: a forward (+ backward + optimizer) pass over `batch` sequences of
    prompt_len + response_len tokens. `layers` restricts the work to that many layers (a pipeline
    stage); None means the whole model.
    """

    kind: WorkKind
    model: ModelShape
    batch: int
    prompt_len: float
    response_len: float
    dtype: str = "bf16"
    layers: int | None = None
    recompute: bool | str = "none"  # none, selective or full (true / false: full / none); kept as the mode
    engine: str = "hf"  # generation: the engine making the calls (planner/engines.py), for its call cost
    token_budget: int | None = None  # packed micro-batches of at most this many tokens (None: padded)
    sp: int = 1  # training / forward passes: Ulysses degree, each sequence split over sp ranks
    cp: int = 1  # training / forward passes: context-parallel degree, each sequence split over cp ranks of a stage
    micro_tokens: int | None = None  # padded micro-batches' token budget (None: memory.MICRO_BATCH_TOKENS)
    activation_offload: bool = False  # training: stored activations wait in host memory for the backward
    optimizer_offload: float = 0.0  # training: share of the optimizer state held and stepped on the host
    attention_span: float | None = None  # forward passes: Σs²/Σs of the batch's lengths, where attention differs from s̄²
    memory_utilization: float = 0.9  # generation: share of the GPU the engine may fill (vLLM's gpu_memory_utilization)
    expert_imbalance: float | None = None  # MoE: busiest EP rank's load over the mean (None: moe.imbalance's cited one)

    def __post_init__(self) -> None:
        object.__setattr__(self, "recompute", recompute_mode(self.recompute))
        if self.kind not in tuple(TaskKind):
            raise ValueError(f"Work.kind must be generation, inference or training, got {self.kind!r}")
        if self.batch < 1:
            raise ValueError(f"Work.batch must be >= 1, got {self.batch}")
        if self.prompt_len < 0 or self.response_len < 0 or self.prompt_len + self.response_len <= 0:
            raise ValueError("Work.prompt_len and response_len must be >= 0 with a positive sum")
        if self.dtype not in PRECISIONS:
            raise ValueError(f"Work.dtype must be one of {sorted(PRECISIONS)}, got {self.dtype!r}")
        if self.layers is not None and not 1 <= self.layers <= self.model.layers:
            raise ValueError(f"Work.layers must be in 1..{self.model.layers}, got {self.layers}")
        if self.sp < 1 or self.cp < 1 or (self.micro_tokens is not None and self.micro_tokens < 1):
            raise ValueError(f"Work.sp, cp and micro_tokens must be >= 1, got {self.sp}, {self.cp}, {self.micro_tokens}")
        if self.expert_imbalance is not None and not self.expert_imbalance >= 1:
            raise ValueError(f"Work.expert_imbalance must be >= 1 (the busiest rank's load over the mean), "
                             f"got {self.expert_imbalance}")

    @property
    def n_layers(self) -> int:
        return self.model.layers if self.layers is None else self.layers

    @property
    def seq_len(self) -> int:
        return max(1, round(self.prompt_len + self.response_len))


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one replica runs: `tp` × `pp` devices of one type and the links between them.

    tp_link / pp_link None means the device type's intra-node link (measured collectives from the
    profile database when present, the datasheet otherwise). `microbatches` feeds the pipeline
    (default 2 × pp, capped by the batch). A training replica shards its state over `dp` replicas
    as `sharding` says (none, zero1, zero2, fsdp: hetprof.specs.plan.SHARDING); memory reads both.
    An MoE model's routed experts are split over `ep` replicas (expert parallelism, costmodels/moe.py),
    whose dispatch and combine all-to-alls cross `ep_link` (None: the device type's own link). `etp`
    is a Megatron-run task's expert tensor parallelism: None slices every routed expert over the TP
    ranks (Megatron's default, etp = tp); 1 keeps experts whole and folds the EP group over the TP
    ranks too (ep·tp ranks: MoE Parallel Folding, Liu et al., arXiv 2504.14960), as verl's and NeMo
    RL's MoE recipes set it. Generation ignores it (vLLM slices experts over TP).
    """

    device_type: str
    tp: int = 1
    pp: int = 1
    tp_link: LinkSpec | None = None
    pp_link: LinkSpec | None = None
    microbatches: int | None = None
    dp: int = 1
    sharding: str = "none"
    ep: int = 1
    ep_link: LinkSpec | None = None
    virtual_stages: int = 1  # interleaved 1F1B: model chunks per pipeline stage (Megatron's VP)
    etp: int | None = None

    def __post_init__(self) -> None:
        if self.tp < 1 or self.pp < 1 or self.dp < 1 or self.ep < 1 or self.virtual_stages < 1:
            raise ValueError(f"Placement.tp, pp, dp, ep and virtual_stages must be >= 1, got tp={self.tp} "
                             f"pp={self.pp} dp={self.dp} ep={self.ep} virtual_stages={self.virtual_stages}")
        if self.etp not in (None, 1, self.tp):
            raise ValueError(f"Placement.etp must be None (= tp) or 1, got {self.etp} at tp={self.tp}")
        if not isinstance(self.device_type, str) or not self.device_type.strip():
            # whether the catalog knows it is the cost model's question: its catalog may extend the built-in one
            raise ValueError(f"Placement.device_type must name a GPU type, got {self.device_type!r}")

    @property
    def folded(self) -> bool:
        """Whether whole experts fold the EP group over the TP ranks (etp 1 at tp > 1)."""
        return self.etp == 1 and self.tp > 1

    @property
    def expert_ranks(self) -> int:
        """Ranks an MoE layer's routed experts are spread over (Megatron's EP size): `ep`, × tp when folded."""
        return self.ep * (self.tp if self.folded else 1)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Seconds for a task, where they go, and what the numbers came from.

    source: "measured" (profile-database calibration), "reference" (imported published figures),
    "datasheet" (catalog peaks × efficiency curves) or "fitted";
    notes say more (e.g. which device type fell back to the analytical model and why).
    """

    seconds: float
    breakdown: Mapping[str, float]
    source: str
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Estimates are cached and shared between callers: a read-only view keeps them immutable.
        object.__setattr__(self, "breakdown", MappingProxyType(dict(self.breakdown)))

    def __hash__(self) -> int:
        return hash((self.seconds, tuple(sorted(self.breakdown.items())), self.source, self.notes))


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Peak bytes per device of one task in its phase.

    Colocated tasks that offload between phases keep only what they cannot move to the host;
    `offloadable` is what may leave the device while another task runs (weights, gradients,
    optimizer state — activations and KV cache are freed, not moved).
    """

    weights: float
    grads: float
    optimizer: float
    activations: float
    kv_cache: float
    total: float
    phase: str = ""

    @property
    def offloadable(self) -> float:
        return self.weights + self.grads + self.optimizer


@dataclasses.dataclass(frozen=True)
class PhaseTime:
    """One phase's seconds on one device, and the source of the numbers behind it."""

    seconds: float
    source: str
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Phase:
    """One measurable unit of work on one device: what a profiler task row times.

    kind prefill: `batch` sequences of `tokens` tokens through `layers` layers (causal attention);
    decode: one step of `batch` sequences whose attention spans `tokens` cached tokens;
    train: forward + backward over `batch` × `tokens`, plus one Adam step of the layers' weights.
    Tensor parallelism `tp` shards matmuls, heads and weights; `with_head` adds the LM head
    (all tokens for prefill/train, the new token for decode). `attention_span` (prefill/train) is the
    keys an average token attends over when the batch's sequences differ in length, Σs²/Σs (None:
    `tokens`, every sequence that long). `recompute` replays the whole forward
    in training's backward; `recompute_attention` only each layer's attention core (selective). An
    MoE model's routed experts are split over `ep` ranks, each receiving its experts' share of all
    `ep` ranks' tokens, the busiest `imbalance` times the mean (None: the cited figure, moe.imbalance);
    `expert_ranks` the ranks the experts are spread over, whose busiest sets the pace (0: `ep`; ep·tp
    where whole experts fold the EP group over the TP ranks, Placement.etp).
    """

    kind: PhaseKind
    model: ModelShape
    layers: int
    batch: int
    tokens: int
    tp: int = 1
    with_head: bool = False
    dtype: str = "bf16"
    recompute: bool = False
    recompute_attention: bool = False
    attention_span: float | None = None  # prefill/train: Σs²/Σs of sequences that differ in length (None: tokens)
    ep: int = 1
    imbalance: float | None = None
    expert_ranks: int = 0
