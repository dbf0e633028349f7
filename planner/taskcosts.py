"""Seconds and bytes of one task's layout: its replicas' times, its devices' memory, its finish curve.

This is where a layout meets the cost model. Replicas may sit on different GPU types and their
pipeline stages on different hosts, so a replica's time is composed here from per-stage cost-model
answers over the real links between its devices. Generation feels the response-length
distribution through the plan's engine (`planner.engines`): vllm's continuous batching lets short
responses leave and the queue refill, the hf loop decodes every wave to its longest response — so
a long tail costs more than fixed lengths of the same mean, and finished samples leave in order,
which is what lets the next stage start early (streaming). A training layout's data-parallel
sharding (none, zero1, zero2, fsdp) divides its state in memory and sets its collectives in time.

Everything is memoised on hashable keys (a replica's stage signature, a TaskLayout): a search
scores thousands of candidates that share most of their layouts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from hetprof.costmodels import MemoryEstimate, Placement, Work
from hetprof.planner.candidate import even_split
from hetprof.planner.controller import controller_seconds
from hetprof.planner.engines import ENGINES, EngineLimits, GenerationRequest, StepTable, arrival_order
from hetprof.planner.graph import RLGraph
from hetprof.planner.imbalance import longest_sequence_factor
from hetprof.planner.layoutcomms import dp_traffic, learner_collectives, optimizer_steps, ulysses_seconds
from hetprof.planner.links import LinkTable
from hetprof.planner.passtime import finish_curve, layer_fraction, packed_seconds
from hetprof.runtime.tokenbudget import pack_groups, spread, step_prompts
from hetprof.specs import Device, WorkloadSpec
from hetprof.specs.catalog import builtin
from hetprof.specs.layout import TaskLayout
from hetprof.specs.models import DTYPE_BYTES
from hetprof.specs.vocabulary import TaskKind

GB = 1e9
EVAL_MEMO_LIMIT = 20_000


@dataclasses.dataclass(frozen=True)
class ReplicaCost:
    """One replica's seconds; for generation also each sequence's finish time (sorted, seconds)."""

    seconds: float
    finish: tuple[float, ...] = ()
    note: str = ""


@dataclasses.dataclass(frozen=True)
class TaskEval:
    """A task layout, judged: seconds, per-device memory, where its data lives, problems found."""

    seconds: float
    replica_seconds: tuple[float, ...]
    curve: tuple[float, ...]                    # time (from start) by which chunk j of K is done
    memory: dict[str, MemoryEstimate]           # device id -> peak of this task on it
    host_fraction: dict[str, float]             # host -> fraction of the task's data it holds
    violations: tuple[str, ...]
    grad_sync_s: float = 0.0
    host_vector: np.ndarray | None = dataclasses.field(default=None, compare=False, repr=False)  # by LinkTable.index


def pack_tokens(length: float, prompt: float) -> tuple[float, float]:
    """(response, prompt) tokens per sequence of a pack whose sequences average `length` tokens: the
    step's mean `prompt`, capped at `length`, and the rest as response. Why capped: with prompts
    spread, a pack of short sequences can average fewer tokens than the mean prompt, and the pack's
    price follows its tokens."""
    lead = min(prompt, length)
    return length - lead, lead


class TaskCosts:
    """Per-task costs for one (cluster, workload, cost model); every answer memoised."""

    def __init__(self, cost_model, graph: RLGraph, workload: WorkloadSpec, devices: dict[str, Device],
                 links: LinkTable, lengths: np.ndarray, chunks: int, padded: bool = False,
                 backend: str = "vllm") -> None:
        self.cm = cost_model
        self.graph = graph
        self.workload = workload
        self.devices = devices
        self.links = links
        self.lengths = np.sort(np.asarray(lengths, dtype=float))
        self.chunks = chunks
        self.dtype = workload.precision
        self.prompt = float(workload.prompt_len.mean)
        self.prompts = step_prompts(workload.prompt_len, workload.prompts_per_step)  # what packs spread
        # Inference, training and memory use the declared mean: it is what a plan file records, so an
        # independent checker can recompute the same bytes. Generation uses the sampled lengths.
        self.response = float(workload.response_len.mean)
        self.sequences = workload.sequences_per_step
        # Priced as `hetprof run` pads (`padded`: the simulator plans for it): the hf generator
        # left-pads a replica's prompts to its longest, and inference and training run the step's
        # batch as wide as its longest prompt plus its longest response. Mean lengths price an engine
        # that packs sequences instead; memory keeps the declared means either way. A workload with
        # `training.max_tokens_per_microbatch` runs packed: mean lengths in as many micro-batches as
        # its token budget fills (`packs`), memory bounded by the budget.
        self.token_budget, self.sp = workload.training.max_tokens_per_microbatch, workload.training.sequence_parallel
        self.runs_padded = padded
        self.padded = padded and self.token_budget is None
        self._packs: dict[int, tuple[tuple[int, float, int], ...]] = {}
        self.engine = ENGINES.get(backend)
        self.backend = backend
        self._longest: dict[int, float] = {}
        self._longest_response: dict[int, float] = {}
        self.sequence_prompt = self.longest_prompt(workload.prompts_per_step)
        self.sequence_response = (workload.response_len.expected_longest(self.sequences) if self.padded
                                  else self.response)
        self._replica: dict[tuple, ReplicaCost] = {}
        self._eval: dict[TaskLayout, TaskEval] = {}
        self._mem: dict[tuple, MemoryEstimate] = {}
        self._sig: dict[tuple, tuple] = {}
        self._stage: dict[tuple, float] = {}
        self._tables: dict[tuple, StepTable] = {}
        self.catalog = getattr(cost_model, "catalog", None) or builtin()
        self._capacity = {t: self.catalog.lookup(t).memory_bytes for t in {d.type for d in devices.values()}}

    # ---- small helpers --------------------------------------------------------------------------
    def work(self, task: str, batch: int, layers: int | None = None, response_len: float | None = None,
             prompt_len: float | None = None) -> Work:
        model = self.graph.model_of(task)
        return Work(kind=self.graph.kind_of(task), model=model, batch=max(1, int(batch)),
                    prompt_len=self.prompt if prompt_len is None else prompt_len,
                    response_len=self.response if response_len is None else response_len,
                    dtype=self.dtype, layers=None if layers is None or layers == model.layers else layers,
                    recompute=self.workload.training.recompute, engine=self.backend,
                    memory_utilization=self.workload.generation.gpu_memory_utilization, sp=self.sp,
                    token_budget=self.token_budget if self.graph.kind_of(task) != TaskKind.GENERATION else None)

    def longest_prompt(self, prompts: int) -> float:
        """The width `prompts` prompts are padded to (the expected longest), or the mean unpadded."""
        if not self.padded:
            return self.prompt
        k = max(1, int(prompts))
        hit = self._longest.get(k)
        if hit is None:
            hit = self._longest[k] = self.workload.prompt_len.expected_longest(k)
        return hit

    def generation_prompt(self, sequences: int) -> float:
        """The width an hf batch of `sequences` sequences pads its prompts to (their distinct prompts' longest)."""
        k = max(1, math.ceil(sequences / max(1, self.workload.responses_per_prompt)))
        hit = self._longest.get(-k)  # negative keys: always padded, whatever `self.padded` says
        if hit is None:
            hit = self._longest[-k] = self.workload.prompt_len.expected_longest(k)
        return hit

    def padded_response(self, sequences: int) -> float:
        """The expected longest response of `sequences` sequences: what an hf batch decodes to."""
        k = max(1, int(sequences))
        hit = self._longest_response.get(k)
        if hit is None:
            hit = self._longest_response[k] = self.workload.response_len.expected_longest(k)
        return hit

    def packs(self, sequences: int) -> tuple[tuple[int, float, int], ...]:
        """The packs of a packed pass over `sequences` sequences, as (sequences per pack, mean tokens
        per sequence, packs) groups: the executor's own packing (hetprof.runtime.tokenbudget) of lengths
        that follow the step's distribution."""
        k = max(1, int(sequences))
        hit = self._packs.get(k)
        if hit is None:
            hit = self._packs[k] = pack_groups(self.prompts, self.lengths, k, self.token_budget)
        return hit

    def _packed_call(self, task: str, sig: tuple, tp: int, batch: int, split: tuple[int, ...]) -> float:
        """A forward (inference) or forward + backward (training) pass over `batch` sequences: with a
        token budget, each of the `packs(batch)` packs at its own sequences and tokens; else one call
        at the priced widths. Pipelined replicas run fixed-shape padded micro-batches
        (executor/algorithms/learner.py), so a plan for `hetprof run` prices them padded."""
        if self.token_budget is None:
            return self._composed(task, sig, tp, batch, split, self.sequence_response, self.sequence_prompt)
        if self.runs_padded and len(sig[0]) > 1:
            return self._composed(task, sig, tp, batch, split, self.padded_response(self.sequences),
                                  self.generation_prompt(self.sequences))
        groups = self.packs(batch)
        times = [(self._composed(task, sig, tp, n, split, *pack_tokens(length, self.prompt)), count)
                 for n, length, count in groups]
        return packed_seconds(times, self._step_in_pass(task, sig, tp, groups[0][0], split))

    def _step_in_pass(self, task: str, sig: tuple, tp: int, batch: int, split: tuple[int, ...]) -> float:
        """The optimizer step a training pass's cost-model time already holds (a fitted model's rows
        time one with each pass), the longest of the replica's stages; 0 for inference."""
        if self.graph.kind_of(task) != TaskKind.TRAINING:
            return 0.0
        return max(self.cm.optimizer_step_in_phase_time(self.work(task, batch, split[s]), Placement(t, tp))
                   for s, (types, _link) in enumerate(sig[0]) for t in types)

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

    def stage_signature(self, devices: Sequence[str], tp: int, pp: int) -> tuple:
        """What decides a replica's seconds: replicas with equal signatures cost the same at any batch."""
        return self._stage_signature(devices, tp, pp)

    def _stage_signature(self, devices: Sequence[str], tp: int, pp: int) -> tuple:
        """(types, tp link) per stage and the link across each stage boundary: what decides a replica's time."""
        key = (tuple(devices), tp, pp)
        hit = self._sig.get(key)
        if hit is None:
            if len(self._sig) >= EVAL_MEMO_LIMIT:
                self._sig.clear()
            hit = self._sig[key] = self._signature(key[0], tp, pp)
        return hit

    def _signature(self, devices: tuple[str, ...], tp: int, pp: int) -> tuple:
        hosts = [frozenset(self.devices[d].host for d in devices[s * tp:(s + 1) * tp]) for s in range(pp)]
        stages = tuple((tuple(sorted({self.devices[d].type for d in devices[s * tp:(s + 1) * tp]})),
                        self.links.slowest(hosts[s]) if len(hosts[s]) > 1 else None) for s in range(pp))
        bounds = tuple(self.links.slowest_between(hosts[s], hosts[s + 1]) for s in range(pp - 1))
        return stages, bounds

    # ---- one replica ----------------------------------------------------------------------------
    def replica_seconds(self, task: str, devices: Sequence[str], tp: int, pp: int, batch: int,
                        layer_split: Sequence[int] | None = None) -> float:
        return self.replica(task, devices, tp, pp, batch, layer_split).seconds

    def replica(self, task: str, devices: Sequence[str], tp: int, pp: int, batch: int,
                layer_split: Sequence[int] | None = None) -> ReplicaCost:
        layers = self.graph.model_of(task).layers
        split = tuple(layer_split) if layer_split is not None else even_split(layers, pp)
        sig = self._stage_signature(devices, tp, pp)
        key = (task, sig, tp, batch, split)
        hit = self._replica.get(key)
        if hit is None:
            hit = self._replica[key] = self._compute_replica(task, sig, tp, batch, split)
        return hit

    def _compute_replica(self, task: str, sig: tuple, tp: int, batch: int, split: tuple[int, ...]) -> ReplicaCost:
        kind = self.graph.kind_of(task)
        if kind == TaskKind.INFERENCE:
            return ReplicaCost(self._packed_call(task, sig, tp, batch, split))
        if kind == TaskKind.TRAINING:
            # Each optimizer step is a forward + backward + Adam over one mini-batch: per-step costs
            # (the optimizer, launches, small-batch inefficiency) are paid mini_batches times per epoch.
            steps = self.workload.mini_batches
            per_step = self._packed_call(task, sig, tp, max(1, math.ceil(batch / steps)), split)
            return ReplicaCost(per_step * steps * self.workload.ppo_epochs)
        return self._generation(task, sig, tp, batch, split)

    def pipeline_seconds(self, task: str, devices: Sequence[str], tp: int, pp: int, batch: int,
                         split: Sequence[int]) -> float:
        """One call of `batch` sequences at the mean lengths through the replica's stages: what
        balancing a generator's layer split compares (its stages' balance, not its engine's queue)."""
        sig = self._stage_signature(tuple(devices), tp, pp)
        return self._composed(task, sig, tp, max(1, batch), tuple(split), self.response, self.prompt)

    def _generation(self, task: str, sig: tuple, tp: int, batch: int, split: tuple[int, ...]) -> ReplicaCost:
        """A generator replica's batch as the plan's engine runs it, within its KV room (planner.engines)."""
        stages, _ = sig
        room = min(self.cm.max_concurrent_sequences(self.work(task, 1, split[s], 0.0, 1.0), Placement(t, tp))
                   for s, (types, _link) in enumerate(stages) for t in types)
        if room < 1:
            model = self.graph.model_of(task)
            types = "/".join(sorted({t for types, _ in stages for t in types}))
            return ReplicaCost(math.inf, note=f"not even one sequence's KV cache fits next to {model.name}'s "
                                             f"weights on {types} (TP{tp}, {max(split)} layers per stage)")
        gen = self.workload.generation

        def call(b: int, prompt: float, steps: float) -> float:
            return self._composed(task, sig, tp, b, split, steps, prompt)

        key = (task, sig, tp, split)
        table = self._tables.get(key)
        if table is None and self.backend == "vllm":  # one per replica kind, whatever its batch
            table = self._tables[key] = StepTable(call, self.prompt, gen.max_num_seqs,
                                                  self.workload.response_len.cap, room)
        request = GenerationRequest(tuple(arrival_order(self.replica_lengths(batch)).tolist()), self.prompt,
                                    self.generation_prompt, self.padded_response,
                                    EngineLimits(room, gen.max_num_seqs, gen.block_tokens), table)
        run = self.engine(request, call)
        return ReplicaCost(run.seconds, run.finish, run.note)

    def _composed(self, task: str, sig: tuple, tp: int, batch: int, split: tuple[int, ...], response: float,
                  prompt: float | None = None) -> float:
        """One replica's seconds for `batch` sequences: the cost model per stage, composed as a pipeline."""
        stages, bounds = sig
        prompt = self.prompt if prompt is None else prompt
        if len(stages) == 1:
            types, link = stages[0]
            return max(self.stage_time(task, t, tp, link, None, batch, response, prompt) for t in types)
        model = self.graph.model_of(task)
        times = []
        for s, (types, link) in enumerate(stages):
            t_s = max(self.stage_time(task, t, tp, link, split[s], batch, response, prompt) for t in types)
            times.append(t_s * layer_fraction(model, split[s], last=s == len(stages) - 1))
        pp = len(stages)
        m = max(1, min(batch, 2 * pp))
        pipe = sum(times) / m + (m - 1) * max(times) / m
        hidden_bytes = model.hidden * DTYPE_BYTES[self.dtype]
        kind = self.graph.kind_of(task)
        if kind == TaskKind.GENERATION:  # every decode step crosses every stage boundary
            steps = round(response) + 1
            comm = steps * sum(self.cm.collective_time("p2p", batch / m * hidden_bytes, 2, b) for b in bounds)
        else:
            msg = batch * (prompt + response) / m * hidden_bytes
            per = [self.cm.collective_time("p2p", msg, 2, b) for b in bounds]
            comm = (sum(per) + (m - 1) * max(per)) * (2 if kind == TaskKind.TRAINING else 1)
        return pipe + comm

    def stage_time(self, task: str, device_type: str, tp: int, link, layers: int | None, batch: int,
                   response: float, prompt: float | None = None) -> float:
        """The cost model's seconds for one stage, memoised on plain values (cheaper to hash than Work)."""
        key = (task, device_type, tp, link, layers, batch, response, prompt)
        hit = self._stage.get(key)
        if hit is None:
            if len(self._stage) >= EVAL_MEMO_LIMIT * 10:
                self._stage.clear()
            work = self.work(task, batch, layers, response, prompt)
            hit = self._stage[key] = self.cm.task_time(work, Placement(device_type, tp, 1, tp_link=link)).seconds
        return hit

    # ---- memory ---------------------------------------------------------------------------------
    def memory(self, task: str, device_type: str, tp: int, layers: int, batch: int, dp: int = 1,
               sharding: str = "none") -> MemoryEstimate:
        """Peak bytes of one device of a replica; a training replica shards its state over `dp` as `sharding` says."""
        dp = min(dp, self.workload.training.shard_group or dp)  # HSDP: a shard group holds one copy
        if sharding == "none" or dp == 1:
            dp, sharding = 1, "none"
        key = (task, device_type, tp, layers, batch, dp, sharding)
        hit = self._mem.get(key)
        if hit is None:
            hit = self._mem[key] = self.cm.memory(self.work(task, batch, layers),
                                                  Placement(device_type, tp, dp=dp, sharding=sharding))
        return hit

    # ---- a whole task layout --------------------------------------------------------------------
    def evaluate(self, layout: TaskLayout) -> TaskEval:
        hit = self._eval.get(layout)
        if hit is None:
            if len(self._eval) >= EVAL_MEMO_LIMIT:  # searches wander; keep memory bounded
                self._eval.clear()
            hit = self._eval[layout] = self._evaluate(layout)
        return hit

    def batches(self, layout: TaskLayout) -> list[int]:
        """Sequences per replica: the shares of the step's batch (0 for an idle replica)."""
        return [max(1, round(s * self.sequences)) if s > 0 else 0 for s in layout.shares]

    def _evaluate(self, layout: TaskLayout) -> TaskEval:
        task, pp = layout.task, layout.pp
        kind = self.graph.kind_of(task)
        model = self.graph.model_of(task)
        problems: list[str] = []
        replica_s: list[float] = []
        finish: list[tuple[float, ...]] = []
        memory: dict[str, MemoryEstimate] = {}
        host_fraction: dict[str, float] = {}
        over: dict[tuple, list[str]] = {}
        held: dict[tuple, MemoryEstimate] = {}     # GPUs of one type holding the same stage hold the same
        dp = layout.dp
        for r, (devices, batch) in enumerate(zip(layout.replicas, self.batches(layout), strict=True)):
            split = layout.layer_splits[r]
            # a generation task's replicas may differ in TP; every other task's share `tp`
            tp = max(1, layout.tp_of(r)) if kind == TaskKind.GENERATION else layout.tp
            if batch:
                cost = self.replica(task, devices, tp, pp, batch, split)
                replica_s.append(cost.seconds)
                finish.append(cost.finish)
                if cost.note and cost.note not in problems:
                    problems.append(f"{task}: {cost.note}")
            else:
                replica_s.append(0.0)
            fraction = layout.shares[r] / len(devices)
            for i, d in enumerate(devices):
                dev = self.devices[d]
                layers = split[i // tp]
                est = held.get((dev.type, tp, layers, batch))
                if est is None:
                    est = held[dev.type, tp, layers, batch] = self.memory(task, dev.type, tp, layers, max(1, batch),
                                                                          dp, layout.sharding)
                memory[d] = est
                if est.total > self._capacity[dev.type]:
                    over.setdefault((dev.type, layers, est), []).append(d)
                host_fraction[dev.host] = host_fraction.get(dev.host, 0.0) + fraction
        for (dtype_, layers, est), devs in over.items():
            problems.append(
                f"{task} needs {est.total / GB:.1f} GB on each of {len(devs)} {dtype_} GPU(s) "
                f"({', '.join(devs[:3])}{', ...' if len(devs) > 3 else ''}) which have "
                f"{self.catalog.lookup(dtype_).memory_bytes / GB:.0f} GB: weights {est.weights / GB:.1f}, grads "
                f"{est.grads / GB:.1f}, optimizer {est.optimizer / GB:.1f}, activations "
                f"{est.activations / GB:.1f}, KV cache {est.kv_cache / GB:.1f} GB with "
                f"{layout.describe()} and {layers} of {model.layers} layers per stage")
        seconds = max(replica_s) if replica_s else math.inf
        if kind == TaskKind.TRAINING and not self.padded and len(self.lengths):  # padded: priced at the longest
            seconds *= longest_sequence_factor(self.lengths + self.prompt, self.workload.mini_batches,
                                               layout.dp // self.workload.training.sequence_parallel)
        grad = 0.0
        if kind == TaskKind.TRAINING and layout.dp > 1:
            grad = dp_traffic(self, layout, seconds)  # overlaps the passes' compute, not the Adam steps
            seconds += grad
        elif kind == TaskKind.INFERENCE and layout.dp > 1 and layout.sharding == "fsdp":
            seconds += dp_traffic(self, layout, seconds)  # the log-prob pass gathers its leader's shards
        if kind != TaskKind.GENERATION and self.workload.training.sequence_parallel > 1:
            seconds += ulysses_seconds(self, layout, self.workload.training.sequence_parallel, problems)
        if kind == TaskKind.TRAINING:
            seconds += optimizer_steps(self, layout) + learner_collectives(self, layout)
        seconds += controller_seconds(self.catalog, self.workload, task, kind,
                                      {self.devices[d].type for d in layout.devices()})
        curve = finish_curve(kind, seconds, finish, self.chunks)
        vector = np.zeros(len(self.links.hosts))
        for host, fraction in host_fraction.items():
            vector[self.links.index[host]] = fraction
        return TaskEval(seconds, tuple(replica_s), curve, memory, host_fraction, tuple(problems), grad, vector)
