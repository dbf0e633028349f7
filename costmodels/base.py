"""The cost-model interface every implementation shares, and the data it speaks.

Inputs and outputs are frozen dataclasses so they can key caches: the planner asks for the same
(work, placement) pairs many thousands of times per search, and every answer must be the same pure
function of them. A concrete model only says how long one *phase* takes on one device (a prefill, a
decode step, a training step over a few layers); the base class composes phases into RL tasks —
generation waves bounded by KV memory, tensor-parallel all-reduces, pipeline bubbles — so the
analytical and fitted models differ only where they really differ.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math

from hetprof.costmodels import comm, memory, moe
from hetprof.costmodels.data import Estimate, LinkSpec, MemoryEstimate, Phase, PhaseTime, Placement, Work
from hetprof.specs.catalog import Catalog, builtin
from hetprof.specs.models import ModelShape
from hetprof.specs.precision import width as stored_width
from hetprof.specs.vocabulary import TaskKind

# Decode cost varies with context; the sum over response_len steps is taken by the midpoint rule on
# this many segments (exact for the linear roofline terms, < 1% off for the max() kink).
DECODE_SEGMENTS = 4
CACHE_SIZE = 1 << 16


def generation_phases(phase, batch: int, prompt: int, steps: int) -> tuple[float, float]:
    """(prefill, decode) seconds of one generation wave from `phase(kind, batch, tokens, head)`.

    Only the last prompt token needs logits, and its LM head is the first decode step's, so the
    prefill is priced without the head; the decode steps by the midpoint rule over the response.
    Shared with `hetprof fit`, which compares the profiler's whole calls with exactly this.
    """
    prefill = phase("prefill", batch, prompt, False)
    decode = 0.0
    if steps:
        seg = steps / DECODE_SEGMENTS
        for i in range(DECODE_SEGMENTS):
            decode += seg * phase("decode", batch, prompt + round((i + 0.5) * seg), True)
    return prefill, decode


class CostModel(abc.ABC):
    """Seconds and bytes of RL tasks on devices and links.

    Subclasses implement `phase_time` (one phase on one device, compute only) and `device_link`
    (a device type's intra-node α–β); everything else is composed here from those and from the
    memory and communication formulas, so all models agree on structure.
    """

    name: str = ""

    def __init__(self, catalog: Catalog | None = None) -> None:
        self.catalog = catalog or builtin()  # the GPU types (and efficiency curves) this model prices
        # Per-instance memoisation: answers depend only on (work, placement) and the model's data.
        self.task_time = functools.lru_cache(maxsize=CACHE_SIZE)(self._task_time)  # type: ignore[method-assign]
        self.memory = functools.lru_cache(maxsize=CACHE_SIZE)(self._memory)  # type: ignore[method-assign]
        self._phase = functools.lru_cache(maxsize=CACHE_SIZE)(self.phase_time)

    # ---- what a concrete model provides -------------------------------------------------------
    @abc.abstractmethod
    def phase_time(self, phase: Phase, device_type: str) -> PhaseTime:
        """Seconds of one phase (compute and memory traffic, no communication) on one device."""

    @abc.abstractmethod
    def device_link(self, device_type: str) -> tuple[LinkSpec, str]:
        """The intra-node α–β link between devices of this type, and its source."""

    # ---- the interface the planner uses -------------------------------------------------------
    def task_time(self, work: Work, placement: Placement) -> Estimate:  # replaced by a cache in __init__
        return self._task_time(work, placement)

    def memory(self, work: Work, placement: Placement) -> MemoryEstimate:  # replaced by a cache in __init__
        return self._memory(work, placement)

    def collective_time(self, op: str, size_bytes: float, n: int, link: LinkSpec) -> float:
        """Seconds for one collective of `size_bytes` among `n` ranks over `link` (α–β model)."""
        return comm.collective_time(op, size_bytes, n, link.alpha_s, link.beta_Bps)

    def generation_call_overhead(self, device_type: str, dtype: str, batch: int, prompt: int,
                                 engine: str = "hf", model: ModelShape | None = None) -> float:
        """Seconds a generation call of `model` by `engine` takes beyond its prefill and decode phases
        (calloverhead.py); a model that has not measured whole calls adds nothing."""
        return 0.0

    def engine_reload_time(self, engine: str, device_type: str, dtype: str, weight_bytes: float) -> float:
        """Seconds `engine` takes, after a sync, to take in `weight_bytes` of new weights beyond moving
        them (enginereload.py); 0 for an engine that computes with the synced tensors in place, or
        a model that has not measured it."""
        return 0.0

    def dp_step_extra(self, device_type: str) -> float:
        """Seconds a data-parallel optimizer step costs beyond its all-reduce on this device type
        (measured by the profiler's `dptrain` suite; 0 where a model has no measurement)."""
        return 0.0

    def dp_grad_sync_time(self, work: Work, placement: Placement, dp: int, link: LinkSpec,
                          sharding: str = "none", compute_s: float = 0.0) -> float:
        """What data parallelism adds to one optimizer step over `dp` replicas of a replica-shard: the
        gradient (and, sharded, parameter) collectives `comm.data_parallel_sync_time` prices for
        `sharding` — FSDP's overlapped with the step's `compute_s` — plus the measured per-step cost
        beyond them (never below 0)."""
        layer_bytes, root_bytes, layers, micro = self._dp_messages(work, placement)
        backward = 3.0 if work.recompute == "full" else 2.0  # full recomputation replays the forward in the backward
        sync = comm.data_parallel_sync_time(sharding, layer_bytes, layers, root_bytes, dp, link.alpha_s,
                                            link.beta_Bps, compute_s / (1 + backward),
                                            compute_s * backward / (1 + backward), micro)
        return max(0.0, sync + self.dp_step_extra(placement.device_type))

    def fsdp_gather_time(self, work: Work, placement: Placement, dp: int, link: LinkSpec,
                         compute_s: float = 0.0) -> float:
        """What FSDP's per-layer parameter gathers add to a forward-only pass of `compute_s` seconds
        over the shards of `dp` ranks (the log-prob pass reads the trainer's FSDP shards)."""
        layer_bytes, root_bytes, layers, micro = self._dp_messages(work, placement)
        return comm.fsdp_forward_gather_time(layer_bytes, layers, root_bytes, dp, link.alpha_s, link.beta_Bps,
                                             compute_s, micro)

    def sequence_parallel_time(self, work: Work, placement: Placement, sp: int, link: LinkSpec) -> float:
        """Seconds Ulysses sequence parallelism over `sp` ranks adds to a training or forward-only pass
        of `work` (its all-to-alls over `link`, the GPUs' own link within a host)."""
        model, tp = work.model, placement.tp
        passes = 1 if work.kind != TaskKind.TRAINING else 3 if work.recompute == "full" else 2
        return comm.ulysses_all_to_all_time(work.batch * work.seq_len, model.heads * model.head_dim // tp,
                                            model.kv_heads * model.head_dim // tp, self._stage_layers(work, placement),
                                            sp, passes, link.alpha_s, link.beta_Bps, stored_width(work.dtype))

    def context_parallel_time(self, work: Work, placement: Placement, cp: int, link: LinkSpec) -> float:
        """Seconds context parallelism over `cp` ranks of a stage adds to a training or forward-only pass
        of `work` (`work.batch`: the replica's sequences, 1/cp of each on a rank): its ring passes of
        keys and values (and their gradients) over `link`, the link among the stage's ranks."""
        model, tp = work.model, placement.tp
        passes = 1 if work.kind != TaskKind.TRAINING else 4 if work.recompute == "full" else 3
        return comm.ring_attention_time(work.batch * work.seq_len / cp, model.kv_heads * model.head_dim // tp,
                                        self._stage_layers(work, placement), cp, passes, link.alpha_s,
                                        link.beta_Bps, stored_width(work.dtype))

    def _dp_messages(self, work: Work, placement: Placement) -> tuple[float, float, int, int]:
        """(one layer's bytes, the root's bytes, layers, micro-batches) of a replica-stage's DP collectives."""
        model, tp = work.model, placement.tp
        layers = self._stage_layers(work, placement)
        width = stored_width(work.dtype)  # gradients and parameters travel in 16 bits under FP8 too
        layer_bytes = model.params_per_layer * width / tp
        if placement.ep > 1:  # a rank syncs its 1/ep of the routed experts (with their expert copies)
            layer_bytes -= model.routed_expert_params_per_layer * (1 - 1 / placement.ep) * width / tp
        root_bytes = (memory.params_on_device(model, layers, tp, with_embeddings=True)
                      - layers * model.params_per_layer / tp) * width
        micro = math.ceil(work.batch / memory.micro_batch(work.batch, work.seq_len,
                                                          work.micro_tokens or memory.MICRO_BATCH_TOKENS))
        return layer_bytes, root_bytes, layers, micro

    def optimizer_step_time(self, work: Work, placement: Placement) -> float:
        """Seconds of one optimizer step of a training replica-stage beyond its timed training phase,
        over the shard `placement.dp`/`sharding` leave each rank; 0 for a model whose phases already
        include the step (the fitted model's profiled training steps do)."""
        return 0.0

    def optimizer_step_in_phase_time(self, work: Work, placement: Placement) -> float:
        """Seconds of one optimizer step that this model's training phase time already holds (what a
        pricer scaling several passes' time takes off, as the learner steps once per mini-batch);
        0 for a model whose phase is the passes only."""
        return 0.0

    def reshard_time(self, model: ModelShape, link: LinkSpec, gen_tp: int, train_pieces: int,
                     dtype: str = "bf16", flows: int = 1, stages: int = 1) -> float:
        """Colocated (hybrid-engine) hand-off of new weights to the generator on the same GPUs: each
        generator rank all-gathers its TP shard, weights/gen_tp, from the ranks holding its parts, of
        which it holds one already (verl's FSDP → vLLM resharding, NeMo-Aligner's PP-folding refit).
        The trainer cuts every layer's width into `train_pieces` (tp, × ep for the experts, × dp under
        FSDP) and the layers into `stages` (pp): a generator shard, all layers at 1/gen_tp of the width,
        lies in max(1, train_pieces/gen_tp) width pieces of each of the `stages` stages; nothing moves
        when the trainer's piece is the shard itself. Every rank gathers at once: `flows` gathers share
        `link` (a host's network cards, when the pieces sit on other hosts), each at 1/flows of it."""
        shard = model.weight_bytes(dtype) / max(1, gen_tp)
        ranks = max(1, stages) * max(1, math.ceil(train_pieces / max(1, gen_tp)))
        return comm.collective_time("all_gather", shard, ranks, link.alpha_s, link.beta_Bps / max(1, flows))

    def weight_sync_time(self, model: ModelShape, link: LinkSpec, receivers: int = 1, dtype: str = "bf16",
                         shards: int = 1, flows: int = 1) -> float:
        """Trainer → generators: broadcast of the weights to `receivers`, `shards` streams in parallel.
        Each stream is one rank's and crosses that GPU's own network card: `flows` GPUs split a host's
        `link` bandwidth (one card per GPU, the usual 8-GPU build), so a stream gets 1/flows of it."""
        size = model.weight_bytes(dtype) / max(1, shards)
        return comm.collective_time("broadcast", size, receivers + 1, link.alpha_s, link.beta_Bps / max(1, flows))

    def rollout_transfer_time(self, sequences: int, seq_len: float, link: LinkSpec,
                              bytes_per_token: int = comm.ROLLOUT_BYTES_PER_TOKEN) -> float:
        """Rollouts (token ids, log-probs, masks, rewards) from one group to another."""
        return self.collective_time("p2p", sequences * seq_len * bytes_per_token, 2, link)

    def host_transfer_time(self, size_bytes: float, device_type: str) -> float:
        """Offload or reload of `size_bytes` between device and host memory (colocated tasks)."""
        return size_bytes / comm.host_link_Bps(self.catalog.lookup(device_type), size_bytes) if size_bytes > 0 else 0.0

    # ---- composition ---------------------------------------------------------------------------
    @staticmethod
    def _stage_layers(work: Work, placement: Placement) -> int:
        return max(1, math.ceil(work.n_layers / placement.pp))

    def _link(self, link: LinkSpec | None, device_type: str) -> tuple[LinkSpec, str]:
        return (link, "given") if link is not None else self.device_link(device_type)

    def _task_time(self, work: Work, placement: Placement) -> Estimate:
        if work.kind == TaskKind.GENERATION and placement.etp is not None:
            placement = dataclasses.replace(placement, etp=None)  # vLLM slices experts over TP: no fold
        layers = self._stage_layers(work, placement)
        dev = placement.device_type
        tp_link, tp_src = self._link(placement.tp_link, dev)
        hidden_bytes = work.model.hidden * stored_width(work.dtype)
        sources: set[str] = set()
        notes: list[str] = []
        parts: dict[str, float] = {}

        # whole experts fold the EP group over the TP ranks (Placement.etp): an MoE layer's tokens then
        # leave by its all-to-alls, so only its attention half joins the TP collectives
        folded = placement.folded and work.model.moe is not None
        tp_halves = 1.0 - (0.5 * work.model.moe_layers / work.model.layers if folded else 0.0)

        def phase(kind: str, batch: int, tokens: int, head: bool) -> float:
            p = Phase(kind, work.model, layers, batch, tokens, placement.tp, head, work.dtype, work.recompute == "full",
                      work.recompute == "selective", work.attention_span if kind != "decode" else None,
                      placement.ep, work.expert_imbalance, placement.expert_ranks if folded else 0)
            t = self._phase(p, dev)
            sources.add(t.source)
            if t.note and t.note not in notes:
                notes.append(t.note)
            return t.seconds

        def tp_comm(tokens: float, per_layer: int) -> float:
            size = tokens * hidden_bytes
            return layers * per_layer * tp_halves * self.collective_time("all_reduce", size, placement.tp, tp_link)

        def ep_comm(tokens: float, passes: int) -> float:
            return self.expert_parallel_time(work, placement, tokens, passes)

        mem = self.memory(work, placement)
        if work.kind == TaskKind.GENERATION:
            prompt = max(1, round(work.prompt_len))
            steps = max(0, round(work.response_len))
            conc = self.max_concurrent_sequences(work, placement)
            if conc < 1:
                return Estimate(math.inf, {"kv_cache": math.inf}, self.device_source(dev),
                                (f"not even one sequence's KV cache fits on {dev} next to the weights",))
            conc = min(conc, work.batch)
            waves = work.batch / conc  # continuous batching refills freed slots: fractional waves
            prefill, decode = generation_phases(phase, conc, prompt, steps)
            parts["prefill"] = waves * prefill
            parts["decode"] = waves * decode
            # per call, never below half the phases (a negative term is the decode forward a call skips)
            call = self.generation_call_overhead(dev, work.dtype, conc, prompt, work.engine, work.model)
            parts["call"] = waves * max(call, -0.5 * (prefill + decode))
            parts["tp_comm"] = waves * (tp_comm(conc * prompt, 2) + steps * tp_comm(conc, 2))
            if placement.ep > 1:
                parts["ep_comm"] = waves * (ep_comm(conc * prompt, 1) + steps * ep_comm(conc, 1))
        # context parallelism: a rank computes 1/cp of every sequence's tokens and, in Megatron's
        # load-balanced causal chunks, 1/cp of its attention pairs (its ring is priced per layout)
        elif work.kind == TaskKind.INFERENCE:
            parts["forward"] = phase("prefill", work.batch, work.seq_len, True) / work.cp
            parts["tp_comm"] = tp_comm(work.batch * work.seq_len / work.cp, 2)
            if placement.expert_ranks > 1:
                parts["ep_comm"] = ep_comm(work.batch * work.seq_len / work.cp, 1)
        else:
            parts["train"] = phase("train", work.batch, work.seq_len, True) / work.cp
            parts["tp_comm"] = tp_comm(work.batch * work.seq_len / work.cp, 6 if work.recompute == "full" else 4)
            if placement.expert_ranks > 1:
                parts["ep_comm"] = ep_comm(work.batch * work.seq_len / work.cp, 3 if work.recompute == "full" else 2)
            if work.activation_offload:
                parts["activation_offload"] = self._offload_exposed(work, placement, layers, parts["train"])
        if placement.tp > 1:
            notes.append(f"tp link: {tp_src}")
        stage = sum(parts.values())
        if placement.pp > 1:
            stage = self._pipeline(work, placement, stage, parts)
        source = combine_sources(sources)
        if mem.total > self.catalog.lookup(dev).memory_bytes and work.kind != TaskKind.GENERATION:
            notes.append(f"needs {mem.total / 1e9:.1f} GB per device, more than {dev} has")
        return Estimate(stage, parts, source, tuple(notes))

    def expert_parallel_time(self, work: Work, placement: Placement, tokens: float, passes: int) -> float:
        """Seconds of the dispatch and combine all-to-alls of a stage's MoE layers for `tokens` tokens
        on one device (its TP group's tokens split over its tp ranks), over `placement.ep_link` (None:
        the device type's own link); `passes` 1 forward, 2 forward + backward, 3 with recomputation.
        The group is the placement's `expert_ranks` (ep, or ep·tp folded over the TP ranks)."""
        model = work.model
        ranks = placement.expert_ranks
        if ranks <= 1 or model.moe is None:
            return 0.0
        link, _ = self._link(placement.ep_link, placement.device_type)
        layers = self._stage_layers(work, placement) * model.moe_layers / model.layers
        sent = moe.dispatch_bytes(model, tokens / placement.tp, ranks, work.dtype)
        return comm.expert_all_to_all_time(sent, round(layers), ranks, passes, link.alpha_s,
                                           link.beta_Bps, moe.imbalance(model, ranks, work.expert_imbalance))

    def _pipeline(self, work: Work, placement: Placement, stage: float, parts: dict[str, float]) -> float:
        """GPipe-style schedule: (m + pp − 1) microbatch slots on the critical path, plus transfers.
        Interleaved over v virtual stages (a training layout's `virtual_stages`), the bubble shrinks to
        (pp − 1)/(v·m) of a stage and every micro-batch crosses v times as many stage boundaries
        (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
        Megatron-LM", SC'21, §2.2.2)."""
        pp_link, _ = self._link(placement.pp_link, placement.device_type)
        m = placement.microbatches or min(work.batch, 2 * placement.pp)
        m = max(1, min(m, work.batch))
        hidden_bytes = work.model.hidden * stored_width(work.dtype)
        tokens = work.batch * (work.seq_len if work.kind != TaskKind.GENERATION else 1)
        hops = 2 if work.kind == TaskKind.TRAINING else 1  # activations forward, gradients back
        act = self.collective_time("p2p", tokens / m * hidden_bytes, 2, pp_link) * hops
        if work.kind == TaskKind.GENERATION:
            # every decode step crosses every stage boundary once; stages work on other micro-batches
            steps = max(1, round(work.response_len)) + 1
            parts["pp_comm"] = steps * (placement.pp - 1) * self.collective_time(
                "p2p", work.batch / m * hidden_bytes, 2, pp_link)
            parts["pp_bubble"] = stage * (placement.pp - 1) / m
        else:
            v = placement.virtual_stages
            parts["pp_comm"] = (m + placement.pp - 2) * act * v
            parts["pp_bubble"] = stage * (placement.pp - 1) / (m * v)
        return stage + parts["pp_comm"] + parts["pp_bubble"]

    def _offload_exposed(self, work: Work, placement: Placement, layers: int, compute_s: float) -> float:
        """Seconds activation offload adds to a training pass: its stored activations to the host and
        back over the host link, overlapped with the pass's `compute_s` (Megatron-core's offloading
        streams them beside the compute), so only what outlasts the compute shows."""
        moved = memory.offloaded_activation_bytes(work.model, layers, placement.tp, work.dtype,
                                                  work.batch * work.seq_len / work.cp, work.recompute)
        return max(0.0, 2 * self.host_transfer_time(moved, placement.device_type) - compute_s)

    def max_concurrent_sequences(self, work: Work, placement: Placement) -> int:
        """How many sequences' KV caches fit next to the weights on one device of a generation replica."""
        return memory.max_concurrent_sequences(work.model, self._stage_layers(work, placement), placement.tp,
                                               work.seq_len, work.dtype, self.catalog.lookup(placement.device_type).memory_bytes,
                                               work.memory_utilization, ep=placement.ep)

    def device_source(self, device_type: str) -> str:
        """Where this model's numbers for a device type come from when no phase was timed."""
        return self._phase(Phase("decode", _PROBE, 1, 1, 1), device_type).source

    def _memory(self, work: Work, placement: Placement) -> MemoryEstimate:
        concurrent = work.batch
        if work.kind == TaskKind.GENERATION:
            concurrent = min(work.batch, self.max_concurrent_sequences(work, placement))
        return memory.task_memory(work.kind, work.model, self._stage_layers(work, placement), placement.tp,
                                  work.batch, work.seq_len, work.dtype, work.recompute, concurrent,
                                  placement.dp, placement.sharding, work.token_budget, work.sp, cp=work.cp,
                                  micro_tokens=work.micro_tokens, offload=work.activation_offload, ep=placement.ep,
                                  optimizer_offload=work.optimizer_offload)


def optimizer_shards(placement: Placement) -> int:
    """Over how many ranks a replica's optimizer state is split: its dp when the sharding divides the
    optimizer (zero1, zero2, fsdp: hetprof.specs.plan.SHARDING), else 1."""
    if placement.dp > 1 and "optimizer" in memory.sharded_state(placement.sharding):
        return placement.dp
    return 1


# Source words from most to least trustworthy; an estimate is as trustworthy as its weakest part.
SOURCE_TRUST = ("fitted", "measured", "reference", "datasheet")
_PROBE = ModelShape("probe", "llama", 1, 64, 128, 1, 1, 64, 64, True)


def combine_sources(sources: set[str]) -> str:
    """The least trustworthy source among the parts (notes say which part used what)."""
    if not sources:
        return "datasheet"
    known = [s for s in SOURCE_TRUST if s in sources]
    return known[-1] if known else sorted(sources)[0]
