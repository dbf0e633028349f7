"""What every pricing stage reads: the cost model, the task graph, the hardware and the step's widths.

One frozen value built once per (cluster, workload, cost model) and handed to the stages
(`replicas`, `taskcosts`, `layoutcomms`), so none of them reaches into another's object. The
widths are where a plan for `hetprof run` differs from a what-if: the hf generator left-pads a
replica's prompts to its longest, and inference and training run the step's batch as wide as its
longest prompt plus its longest response (`padded`). Mean lengths price an engine that packs
sequences instead; memory keeps the declared means either way. A workload with
`training.max_tokens_per_microbatch` runs packed: mean lengths in as many micro-batches as its
token budget fills (`packs`), memory bounded by the budget.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from hetprof.costmodels import Work
from hetprof.planner.graph import RLGraph
from hetprof.planner.links import LinkTable
from hetprof.planner.memo import memoised
from hetprof.runtime.tokenbudget import pack_groups, sample_lengths, spread, step_prompts
from hetprof.specs import Device, WorkloadSpec
from hetprof.specs.catalog import Catalog, builtin
from hetprof.specs.layout import TaskLayout
from hetprof.specs.vocabulary import TaskKind

WIDTHS_MEMO = 20_000   # batch sizes whose widths and packs are kept


@dataclasses.dataclass(frozen=True, eq=False)
class PricingBasis:
    """The frozen inputs of pricing; derived widths are computed once in `__post_init__`."""

    cm: Any                              # the cost model (costmodels.CostModel)
    graph: RLGraph
    workload: WorkloadSpec
    devices: Mapping[str, Device]
    links: LinkTable
    lengths: np.ndarray                  # the step's sampled response lengths, sorted
    chunks: int                          # streaming granularity of a task's finish curve
    runs_padded: bool = False            # priced as `hetprof run` pads (the simulator plans for it)
    backend: str = "vllm"
    catalog: Catalog = dataclasses.field(init=False)
    dtype: str = dataclasses.field(init=False)
    prompt: float = dataclasses.field(init=False)        # the declared mean prompt
    response: float = dataclasses.field(init=False)      # the declared mean response
    sequences: int = dataclasses.field(init=False)
    prompts: Any = dataclasses.field(init=False, repr=False)  # the step's prompt lengths, what packs spread
    token_budget: int | None = dataclasses.field(init=False)
    sp: int = dataclasses.field(init=False)
    attention_span: float | None = dataclasses.field(init=False)  # Σs²/Σs of the step's lengths (mean pricing)
    padded: bool = dataclasses.field(init=False)         # priced at padded widths (no token budget)
    sequence_prompt: float = dataclasses.field(init=False)    # the width inference and training run
    sequence_response: float = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        wl = self.workload
        init = _setter(self)
        init("lengths", np.sort(np.asarray(self.lengths, dtype=float)))
        init("catalog", getattr(self.cm, "catalog", None) or builtin())
        init("dtype", wl.weights_dtype)
        init("prompt", float(wl.prompt_len.mean))
        # Inference, training and memory use the declared mean: it is what a plan file records, so an
        # independent checker can recompute the same bytes. Generation uses the sampled lengths.
        init("response", float(wl.response_len.mean))
        init("sequences", wl.sequences_per_step)
        init("prompts", step_prompts(wl.prompt_len, wl.prompts_per_step))
        init("token_budget", wl.training.max_tokens_per_microbatch)
        init("sp", wl.training.sequence_parallel or 1)
        init("padded", self.runs_padded and self.token_budget is None)
        init("sequence_prompt", self.longest_prompt(wl.prompts_per_step))
        init("sequence_response", wl.response_len.expected_longest(self.sequences) if self.padded else self.response)
        init("attention_span", self._span() if not self.padded and self.token_budget is None else None)

    def work(self, task: str, batch: int, layers: int | None = None, response_len: float | None = None,
             prompt_len: float | None = None, sp: int | None = None, cp: int = 1,
             micro_tokens: int | None = None) -> Work:
        """The cost model's question for `batch` sequences of `task` (`layers` of a stage; None: all),
        split over `sp` Ulysses ranks (None: the workload's fixed degree, else 1) and `cp` context-parallel
        ranks, in padded micro-batches of `micro_tokens` (None: the cost model's default)."""
        model = self.graph.model_of(task)
        generation = self.graph.kind_of(task) == TaskKind.GENERATION
        at_mean = response_len in (None, self.response) and prompt_len in (None, self.prompt)
        return Work(kind=self.graph.kind_of(task), model=model, batch=max(1, int(batch)),
                    prompt_len=self.prompt if prompt_len is None else prompt_len,
                    response_len=self.response if response_len is None else response_len,
                    dtype=self.dtype_of(task), layers=None if layers is None or layers == model.layers else layers,
                    recompute=self.workload.training.recompute, engine=self.backend,
                    memory_utilization=self.workload.generation.gpu_memory_utilization,
                    sp=self.sp if sp is None else sp, cp=cp, micro_tokens=None if generation else micro_tokens,
                    activation_offload=self.workload.training.activation_offload,
                    optimizer_offload=self.workload.training.optimizer_offload,
                    attention_span=None if generation or not at_mean else self.attention_span,
                    token_budget=None if generation else self.token_budget,
                    expert_imbalance=self.workload.expert_imbalance)

    def sp_of(self, layout: TaskLayout) -> int:
        """A layout's Ulysses degree: its own, or the workload's fixed one for a layout that names none
        (a plan made before the planner chose it)."""
        return layout.sp if layout.sp > 1 else self.sp

    def _span(self) -> float | None:
        """Σs²/Σs over the step's sampled sequence lengths (prompt + response): what a pass priced at the
        mean length attends over per token; None without a sample."""
        if not len(self.lengths):
            return None
        s = np.asarray(sample_lengths(self.prompts, self.lengths, self.sequences), dtype=float)
        return float((s * s).sum() / s.sum())

    def dtype_of(self, task: str) -> str:
        """The precision `task` computes in (the workload's per-kind precision)."""
        return self.workload.dtype_of(self.graph.kind_of(task))

    # ---- widths ---------------------------------------------------------------------------------
    def longest_prompt(self, prompts: int) -> float:
        """The width `prompts` prompts are padded to (the expected longest), or the mean unpadded."""
        if not self.padded:
            return self.prompt
        return self._expected_longest_prompt(max(1, int(prompts)))

    def generation_prompt(self, sequences: int) -> float:
        """The width an hf batch of `sequences` sequences pads its prompts to (their distinct prompts'
        longest), whether or not the plan is padded."""
        return self._expected_longest_prompt(max(1, math.ceil(sequences / max(1, self.workload.responses_per_prompt))))

    @memoised(WIDTHS_MEMO)
    def _expected_longest_prompt(self, k: int) -> float:
        return self.workload.prompt_len.expected_longest(k)

    def padded_response(self, sequences: int) -> float:
        """The expected longest response of `sequences` sequences: what an hf batch decodes to."""
        return self._expected_longest_response(max(1, int(sequences)))

    @memoised(WIDTHS_MEMO)
    def _expected_longest_response(self, k: int) -> float:
        return self.workload.response_len.expected_longest(k)

    def packs(self, sequences: int) -> tuple[tuple[int, float, int], ...]:
        """The packs of a packed pass over `sequences` sequences, as (sequences per pack, mean tokens
        per sequence, packs) groups: the executor's own packing (hetprof.runtime.tokenbudget) of lengths
        that follow the step's distribution."""
        return self._packs(max(1, int(sequences)))

    @memoised(WIDTHS_MEMO)
    def _packs(self, k: int) -> tuple[tuple[int, float, int], ...]:
        return pack_groups(self.prompts, self.lengths, k, self.token_budget)

    def replica_lengths(self, batch: int) -> np.ndarray:
        """`batch` response lengths that follow the step's sampled distribution (evenly spaced
        quantiles), the longest being the step's longest: one replica draws it, and the step waits
        for that replica, so a task of several replicas is priced by the one that holds it. Under
        partial rollout every replica decodes the mean length: the same tokens, no tail."""
        if self.workload.generation.partial_rollout:  # unfinished responses carry over: no tail to wait for
            return np.full(batch, float(self.lengths.mean()) if len(self.lengths) else self.response)
        lengths = spread(self.lengths, batch, self.response)
        if len(self.lengths):
            lengths[-1] = self.lengths[-1]
        return lengths



def _setter(obj: object) -> Callable[[str, Any], None]:
    """A setter for a frozen dataclass's derived fields, used only while it is being built."""
    return lambda name, value: object.__setattr__(obj, name, value)
