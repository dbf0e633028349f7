"""One replica's seconds: its pipeline stages priced by the cost model over the real links.

Replicas may sit on different GPU types and their pipeline stages on different hosts, so a
replica's time is composed here from per-stage cost-model answers. Generation feels the
response-length distribution through the plan's engine (`planner.engines`): vllm's continuous
batching lets short responses leave and the queue refill, the hf loop decodes every wave to its
longest response — so a long tail costs more than fixed lengths of the same mean, and finished
samples leave in order, which is what lets the next stage start early (streaming).

Answers are memoised (planner.memo) on a replica's stage signature, not its device names:
replicas with equal signatures cost the same at any batch. An MoE task's replica may be one of an
expert-parallel group (`Experts`: the degree and the link its all-to-alls cross, which the layout
decides); a dense task's never is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from hetprof.costmodels import LinkSpec, Placement
from hetprof.planner.basis import PricingBasis
from hetprof.planner.candidate import even_split
from hetprof.planner.engines import ENGINES, EngineLimits, GenerationRequest, StepTable, arrival_order
from hetprof.planner.memo import memoised
from hetprof.planner.passtime import layer_fraction, packed_seconds
from hetprof.specs.precision import FP8
from hetprof.specs.precision import width as stored_width
from hetprof.specs.vocabulary import TaskKind

SIGNATURE_MEMO = 20_000    # device tuples whose stage signature is kept
STAGE_MEMO = 200_000       # cost-model answers for one stage kept
REPLICA_MEMO = 200_000     # replica prices kept
TABLE_MEMO = 2_000         # a vllm engine's step tables kept (one per replica kind)


@dataclasses.dataclass(frozen=True)
class Experts:
    """A replica's expert parallelism: `ep` replicas share its routed experts over `link` (None: the
    device type's own link); `etp` 1 keeps the experts whole, folding the group over the TP ranks too
    (None: each expert sliced over them; hetprof.specs.layout.WHOLE_EXPERTS)."""

    ep: int = 1
    link: LinkSpec | None = None
    etp: int | None = None

    @property
    def none(self) -> bool:
        """No expert parallelism: the dense replica's memo keys."""
        return self.ep == 1 and self.etp is None


NO_EXPERTS = Experts()


@dataclasses.dataclass(frozen=True)
class ReplicaCost:
    """One replica's seconds; for generation also each sequence's finish time (sorted, seconds)."""

    seconds: float
    finish: tuple[float, ...] = ()
    note: str = ""


def pack_tokens(length: float, prompt: float) -> tuple[float, float]:
    """(response, prompt) tokens per sequence of a pack whose sequences average `length` tokens: the
    step's mean `prompt`, capped at `length`, and the rest as response. Why capped: with prompts
    spread, a pack of short sequences can average fewer tokens than the mean prompt, and the pack's
    price follows its tokens."""
    lead = min(prompt, length)
    return length - lead, lead


def _slowest_group_link(links, groups: Sequence[frozenset]):
    """The slowest link inside any of `groups` (host sets), None when each sits on one host."""
    spans = [links.slowest(h) for h in groups if len(h) > 1]
    return min(spans, key=lambda x: x.beta_Bps) if spans else None


class ReplicaPricer:
    """Prices replicas for one PricingBasis; every answer memoised."""

    def __init__(self, basis: PricingBasis) -> None:
        self.basis = basis
        self.engine = ENGINES.get(basis.backend)

    # ---- what decides a replica's time ----------------------------------------------------------
    def stage_signature(self, devices: Sequence[str], tp: int, pp: int, cp: int = 1) -> tuple:
        """What decides a replica's seconds: replicas with equal signatures cost the same at any batch."""
        return self._signature(tuple(devices), tp, pp, cp)

    @memoised(SIGNATURE_MEMO)
    def _signature(self, devices: tuple[str, ...], tp: int, pp: int, cp: int = 1) -> tuple:
        """(types, tp link) per stage and the link across each stage boundary; a stage is its tp × cp
        devices (context parallelism puts cp TP groups in a stage)."""
        b = self.basis
        w = tp * cp
        hosts = [frozenset(b.devices[d].host for d in devices[s * w:(s + 1) * w]) for s in range(pp)]
        # the TP link: the slowest within any of the stage's TP groups (cp rings are priced per layout)
        tp_hosts = [[frozenset(b.devices[d].host for d in devices[s * w + c * tp:s * w + (c + 1) * tp])
                     for c in range(cp)] for s in range(pp)]
        stages = tuple((tuple(sorted({b.devices[d].type for d in devices[s * w:(s + 1) * w]})),
                        _slowest_group_link(b.links, tp_hosts[s])) for s in range(pp))
        bounds = tuple(b.links.slowest_between(hosts[s], hosts[s + 1]) for s in range(pp - 1))
        return stages, bounds

    @memoised(STAGE_MEMO)
    def stage_time(self, task: str, device_type: str, tp: int, link, layers: int | None, batch: int,
                   response: float, prompt: float | None = None, cp: int = 1,
                   experts: Experts = NO_EXPERTS) -> float:
        """The cost model's seconds for one stage, memoised on plain values (cheaper to hash than Work)."""
        work = self.basis.work(task, batch, layers, response, prompt, cp=cp)
        return self.basis.cm.task_time(work, Placement(device_type, tp, 1, tp_link=link, ep=experts.ep,
                                                       ep_link=experts.link, etp=experts.etp)).seconds

    def without_fp8(self, task: str, devices: Sequence[str]) -> list[str]:
        """The GPU types among `devices` an FP8 `task` cannot run on (no catalog fp8_tflops); empty
        when the task is not FP8. Such a replica is refused, never priced in another precision."""
        if self.basis.dtype_of(task) != FP8:
            return []
        types = {self.basis.devices[d].type for d in devices}
        return sorted(t for t in types if self.basis.catalog.lookup(t).fp8_tflops is None)

    # ---- one replica ----------------------------------------------------------------------------
    def replica(self, task: str, devices: Sequence[str], tp: int, pp: int, batch: int,
                layer_split: Sequence[int] | None = None, cp: int = 1,
                experts: Experts = NO_EXPERTS) -> ReplicaCost:
        lacking = self.without_fp8(task, devices)
        if lacking:
            return ReplicaCost(math.inf, note=f"fp8 on {lacking[0]}, which has no FP8 figure "
                                              f"(gpus.{lacking[0]}.fp8_tflops in the catalog)")
        layers = self.basis.graph.model_of(task).layers
        split = tuple(layer_split) if layer_split is not None else even_split(layers, pp)
        sig = self._signature(tuple(devices), tp, pp, cp)
        if experts.none:
            return self._replica(task, sig, tp, batch, split, cp)
        return self._replica(task, sig, tp, batch, split, cp, experts)

    @memoised(REPLICA_MEMO)
    def _replica(self, task: str, sig: tuple, tp: int, batch: int, split: tuple[int, ...],
                 cp: int = 1, experts: Experts = NO_EXPERTS) -> ReplicaCost:
        kind = self.basis.graph.kind_of(task)
        if kind == TaskKind.INFERENCE:
            return ReplicaCost(self.packed_call(task, sig, tp, batch, split, cp, experts))
        if kind == TaskKind.TRAINING:
            # Each optimizer step is a forward + backward + Adam over one mini-batch: per-step costs
            # (the optimizer, launches, small-batch inefficiency) are paid mini_batches times per epoch.
            steps = self.basis.workload.mini_batches
            per_step = self.packed_call(task, sig, tp, max(1, math.ceil(batch / steps)), split, cp, experts)
            return ReplicaCost(per_step * steps * self.basis.workload.ppo_epochs)
        return self._generation(task, sig, tp, batch, split, experts)

    def pipeline_seconds(self, task: str, devices: Sequence[str], tp: int, pp: int, batch: int,
                         split: Sequence[int]) -> float:
        """One call of `batch` sequences at the mean lengths through the replica's stages: what
        balancing a generator's layer split compares (its stages' balance, not its engine's queue)."""
        if self.without_fp8(task, devices):
            return math.inf
        sig = self._signature(tuple(devices), tp, pp)
        return self.composed(task, sig, tp, max(1, batch), tuple(split), self.basis.response, self.basis.prompt)

    def packed_call(self, task: str, sig: tuple, tp: int, batch: int, split: tuple[int, ...], cp: int = 1,
                    experts: Experts = NO_EXPERTS) -> float:
        """A forward (inference) or forward + backward (training) pass over `batch` sequences: with a
        token budget, each of the `packs(batch)` packs at its own sequences and tokens; else one call
        at the priced widths. Pipelined replicas run fixed-shape padded micro-batches
        (executor/algorithms/learner.py), so a plan for `hetprof run` prices them padded."""
        b = self.basis
        if b.token_budget is None:
            return self.composed(task, sig, tp, batch, split, b.sequence_response, b.sequence_prompt, cp, experts)
        if b.runs_padded and len(sig[0]) > 1:
            return self.composed(task, sig, tp, batch, split, b.padded_response(b.sequences),
                                 b.generation_prompt(b.sequences), cp, experts)
        groups = b.packs(batch)
        times = [(self.composed(task, sig, tp, n, split, *pack_tokens(length, b.prompt), cp, experts), count)
                 for n, length, count in groups]
        return packed_seconds(times, self._step_in_pass(task, sig, tp, groups[0][0], split))

    def _step_in_pass(self, task: str, sig: tuple, tp: int, batch: int, split: tuple[int, ...]) -> float:
        """The optimizer step a training pass's cost-model time already holds (a fitted model's rows
        time one with each pass), the longest of the replica's stages; 0 for inference."""
        if self.basis.graph.kind_of(task) != TaskKind.TRAINING:
            return 0.0
        return max(self.basis.cm.optimizer_step_in_phase_time(self.basis.work(task, batch, split[s]), Placement(t, tp))
                   for s, (types, _link) in enumerate(sig[0]) for t in types)

    def _generation(self, task: str, sig: tuple, tp: int, batch: int, split: tuple[int, ...],
                    experts: Experts = NO_EXPERTS) -> ReplicaCost:
        """A generator replica's batch as the plan's engine runs it, within its KV room (planner.engines)."""
        b = self.basis
        stages, _ = sig
        room = min(b.cm.max_concurrent_sequences(b.work(task, 1, split[s], 0.0, 1.0), Placement(t, tp, ep=experts.ep))
                   for s, (types, _link) in enumerate(stages) for t in types)
        if room < 1:
            model = b.graph.model_of(task)
            types = "/".join(sorted({t for types, _ in stages for t in types}))
            return ReplicaCost(math.inf, note=f"not even one sequence's KV cache fits next to {model.name}'s "
                                             f"weights on {types} (TP{tp}, {max(split)} layers per stage)")
        gen = b.workload.generation

        def call(n: int, prompt: float, steps: float) -> float:
            return self.composed(task, sig, tp, n, split, steps, prompt, experts=experts)

        # one step table per replica kind, whatever its batch (vllm only)
        table = self._step_table(task, sig, tp, split, room, experts) if b.backend == "vllm" else None
        request = GenerationRequest(tuple(arrival_order(b.replica_lengths(batch)).tolist()), b.prompt,
                                    b.generation_prompt, b.padded_response,
                                    EngineLimits(room, gen.max_num_seqs, gen.block_tokens), table)
        run = self.engine(request, call)
        return ReplicaCost(run.seconds, run.finish, run.note)

    @memoised(TABLE_MEMO)
    def _step_table(self, task: str, sig: tuple, tp: int, split: tuple[int, ...], room: int,
                    experts: Experts = NO_EXPERTS) -> StepTable:
        def call(n: int, prompt: float, steps: float) -> float:
            return self.composed(task, sig, tp, n, split, steps, prompt, experts=experts)

        b = self.basis
        return StepTable(call, b.prompt, b.workload.generation.max_num_seqs, b.workload.response_len.cap, room)

    def composed(self, task: str, sig: tuple, tp: int, batch: int, split: tuple[int, ...], response: float,
                 prompt: float | None = None, cp: int = 1, experts: Experts = NO_EXPERTS) -> float:
        """One replica's seconds for `batch` sequences: the cost model per stage, composed as a pipeline
        (a stage of cp TP groups splits every sequence over them: context parallelism)."""
        b = self.basis
        stages, bounds = sig
        prompt = b.prompt if prompt is None else prompt
        if len(stages) == 1:
            types, link = stages[0]
            return max(self._stage(task, t, tp, link, None, batch, response, prompt, cp, experts) for t in types)
        model = b.graph.model_of(task)
        times = []
        for s, (types, link) in enumerate(stages):
            t_s = max(self._stage(task, t, tp, link, split[s], batch, response, prompt, cp, experts) for t in types)
            times.append(t_s * layer_fraction(model, split[s], last=s == len(stages) - 1))
        pp = len(stages)
        m = max(1, min(batch, 2 * pp))
        pipe = sum(times) / m + (m - 1) * max(times) / m
        hidden_bytes = model.hidden * stored_width(b.dtype_of(task))
        kind = b.graph.kind_of(task)
        if kind == TaskKind.GENERATION:  # every decode step crosses every stage boundary
            steps = round(response) + 1
            comm = steps * sum(b.cm.collective_time("p2p", batch / m * hidden_bytes, 2, x) for x in bounds)
        else:
            msg = batch * (prompt + response) / m * hidden_bytes
            per = [b.cm.collective_time("p2p", msg, 2, x) for x in bounds]
            comm = (sum(per) + (m - 1) * max(per)) * (2 if kind == TaskKind.TRAINING else 1)
        return pipe + comm

    def _stage(self, task: str, device_type: str, tp: int, link, layers: int | None, batch: int, response: float,
               prompt: float, cp: int, experts: Experts) -> float:
        """stage_time, asked without `experts` when there is no expert parallelism (the memo's keys stay
        those of a dense replica)."""
        if experts.none:
            return self.stage_time(task, device_type, tp, link, layers, batch, response, prompt, cp)
        return self.stage_time(task, device_type, tp, link, layers, batch, response, prompt, cp, experts)
