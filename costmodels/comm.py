"""Communication times under the α–β model: the ring algorithms NCCL and gloo actually run.

A collective among n ranks over a link with latency α and bandwidth β pays α per algorithm step
and moves a fixed multiple of the message over the slowest link; the multiples are the same ones
nccl-tests uses to turn algbw into busbw (all-reduce 2(n−1)/n, all-gather and reduce-scatter
(n−1)/n, broadcast and p2p 1), so measured busbw rows and these formulas agree by construction.
"""

from __future__ import annotations

from hetprof.specs.catalog import GpuType

# Rollout payload per token moved between groups: token id (int64), behaviour log-prob (fp32),
# response mask (int8), advantage/return slot (fp32). Rewards are per sequence and negligible.
ROLLOUT_BYTES_PER_TOKEN = 8 + 4 + 1 + 4

# (algorithm steps that each pay α, bytes-moved multiple of S) as functions of n.
_RING: dict[str, tuple] = {
    "all_reduce": (lambda n: 2 * (n - 1), lambda n: 2 * (n - 1) / n),
    "all_gather": (lambda n: n - 1, lambda n: (n - 1) / n),
    "reduce_scatter": (lambda n: n - 1, lambda n: (n - 1) / n),
    # pipelined ring broadcast: the latency of n−1 hops, the message crosses each link once
    "broadcast": (lambda n: n - 1, lambda n: 1.0),
    "p2p": (lambda n: 1, lambda n: 1.0),
}
COLLECTIVES = tuple(_RING)

# Host <-> device copy bandwidth (one direction, achievable, bytes/s) by the card's host bus.
# PCIe 5 x16 ≈ 64 GB/s raw, ~50 achievable; PCIe 4 ≈ 25; PCIe 3 ≈ 12. The cpu pseudo-device
# "offloads" within host memory, so its memory bandwidth applies.


def busbw_factor(op: str, n: int) -> float:
    """Bytes moved over the slowest link per byte of message (nccl-tests' busbw / algbw)."""
    if op not in _RING:
        raise ValueError(f"unknown collective {op!r} (one of {', '.join(COLLECTIVES)})")
    return _RING[op][1](n) if n > 1 else 0.0


def alpha_steps(op: str, n: int) -> int:
    """How many sequential latency-bound steps the ring algorithm of `op` takes among n ranks."""
    if op not in _RING:
        raise ValueError(f"unknown collective {op!r} (one of {', '.join(COLLECTIVES)})")
    return _RING[op][0](n) if n > 1 else 0


def collective_time(op: str, size_bytes: float, n: int, alpha_s: float, beta_Bps: float) -> float:
    """Seconds of one `op` of a `size_bytes` message among `n` ranks: steps·α + factor·S/β.

    `size_bytes` is the full message (the all-reduced buffer, the gathered output, the broadcast
    payload); one rank or an empty message costs nothing.
    """
    if n < 1:
        raise ValueError(f"collective among {n} ranks")
    if size_bytes < 0:
        raise ValueError(f"negative message size {size_bytes}")
    if n == 1 or size_bytes == 0:
        return 0.0
    return alpha_steps(op, n) * alpha_s + busbw_factor(op, n) * size_bytes / beta_Bps


def host_link_Bps(gpu: GpuType, size_bytes: float = 1e9) -> float:
    """Achievable one-way host <-> device copy bandwidth of a GPU type for a copy of `size_bytes`:
    the catalog's nominal bus rate times its `host_link` efficiency curve (a pinned copy never
    reaches the bus's nominal rate: packet headers and flow control take their share)."""
    if gpu.vendor == "generic":
        return gpu.hbm_Bps
    return gpu.host_link_GBps * 1e9 * gpu.efficiency.host_link(size_bytes)


def fit_alpha_beta(sizes: list[float], seconds: list[float], op: str, n: int) -> tuple[float, float, float]:
    """Least-squares α and β from timings of one collective at several sizes.

    Fits t = steps·α + factor·S/β (α, 1/β ≥ 0, relative error weighting so small messages, where α
    shows, count as much as large ones). Returns (alpha_s, beta_Bps, rms relative residual).
    """
    import numpy as np

    if len(sizes) != len(seconds) or len(sizes) < 2:
        raise ValueError("need at least two (size, seconds) pairs to fit alpha and beta")
    s = np.asarray(sizes, float)
    t = np.asarray(seconds, float)
    steps, factor = max(1, alpha_steps(op, n)), busbw_factor(op, max(n, 2))
    a = np.stack([np.full_like(s, steps), factor * s], axis=1) / t[:, None]
    coef, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    alpha, inv_beta = float(coef[0]), float(coef[1])
    if alpha < 0 or inv_beta <= 0:  # refit on the constraint boundary
        alpha = max(alpha, 0.0)
        rest = (t - steps * alpha) / (factor * s)
        inv_beta = max(float(np.median(rest)), 1e-15)
        if alpha == 0.0:
            inv_beta = float(np.sum(factor * s / t) / np.sum((factor * s / t) ** 2))
    pred = steps * alpha + factor * s * inv_beta
    resid = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
    return alpha, 1.0 / inv_beta, resid


def data_parallel_sync_time(sharding: str, layer_bytes: float, layers: int, root_bytes: float, n: int,
                            alpha_s: float, beta_Bps: float, forward_s: float = 0.0, backward_s: float = 0.0,
                            micro_batches: int = 1) -> float:
    """Exposed seconds data parallelism over `n` replicas adds to one optimizer step.

    `layer_bytes` is one decoder layer's gradient/parameter message on one rank, `root_bytes` the
    rest of the stage (embeddings, LM head, norm); `forward_s` / `backward_s` the step's compute.
    - none (DDP): one all-reduce of every gradient, after the backward.
    - zero1, zero2: a reduce-scatter of the gradients and an all-gather of the updated parameters
      once per step (the same bytes and steps as the all-reduce: sharding the state is free in time).
    - fsdp: per micro-batch and layer an all-gather before its forward, another before its
      backward and a reduce-scatter of its gradients after; prefetch overlaps each layer's traffic
      with its neighbour's compute, so a layer costs max(compute, comm) and only the first gather
      (the root's and one layer's) and the last reduce-scatters are exposed.
    """
    if n <= 1:
        return 0.0
    total = layers * layer_bytes + root_bytes
    if sharding == "none":
        return collective_time("all_reduce", total, n, alpha_s, beta_Bps)
    if sharding in ("zero1", "zero2"):
        return (collective_time("reduce_scatter", total, n, alpha_s, beta_Bps)
                + collective_time("all_gather", total, n, alpha_s, beta_Bps))
    if sharding != "fsdp":
        raise ValueError(f"unknown sharding {sharding!r}")
    micro = max(1, micro_batches)
    gather = collective_time("all_gather", layer_bytes, n, alpha_s, beta_Bps)
    scatter = collective_time("reduce_scatter", layer_bytes, n, alpha_s, beta_Bps)
    root = (collective_time("all_gather", root_bytes, n, alpha_s, beta_Bps)
            + collective_time("reduce_scatter", root_bytes, n, alpha_s, beta_Bps))
    per_fwd = forward_s / (micro * max(1, layers))
    per_bwd = backward_s / (micro * max(1, layers))
    hidden = max(0, layers - 1)
    forward = gather + hidden * max(0.0, gather - per_fwd)
    backward = gather + hidden * max(0.0, gather + scatter - per_bwd) + scatter
    return micro * (root + forward + backward)


def ulysses_all_to_all_time(tokens: float, q_dim: int, kv_dim: int, layers: int, sp: int, passes: int,
                            alpha_s: float, beta_Bps: float, width: int = 2) -> float:
    """Seconds Ulysses sequence parallelism adds to one rank holding `tokens` tokens (1/sp of each of
    its group's sequences): per layer and pass, four all-to-alls (q, k and v to heads before attention,
    the output back to sequence after), each `sp − 1` α-steps and (sp − 1)/sp of the rank's tensor over
    β. A backward pass exchanges the same gradients, so training has 2 passes (3 with recomputation)."""
    if sp <= 1 or tokens <= 0:
        return 0.0
    tensor = tokens * (2 * q_dim + 2 * kv_dim) * width  # q + out (q_dim each), k + v (kv_dim each)
    per_pass = 4 * (sp - 1) * alpha_s + (sp - 1) / sp * tensor / beta_Bps
    return layers * passes * per_pass


def ring_attention_time(tokens: float, kv_dim: int, layers: int, cp: int, passes: int, alpha_s: float,
                        beta_Bps: float, width: int = 2) -> float:
    """Seconds context parallelism (Megatron's CP, ring attention) adds to one rank holding `tokens`
    tokens (1/cp of each of its replica's sequences): per layer and pass, the rank's keys and values
    (2·kv_dim per token) go around the ring of cp ranks, cp − 1 point-to-point steps of an α and the
    block over β. The forward passes K and V once; the backward passes them again with their
    gradients dK and dV, so training has 3 passes (4 with full recomputation, whose replayed forward
    passes them once more). Charged whole: an upper bound where the blocks' attention hides them."""
    if cp <= 1 or tokens <= 0:
        return 0.0
    block = tokens * 2 * kv_dim * width
    return layers * passes * (cp - 1) * (alpha_s + block / beta_Bps)


def all_to_all_Bps(local_Bps: float, network_Bps: float, gpus: int, per_host: int, sharing: int | None = None) -> float:
    """One GPU's goodput in an all-to-all over `gpus` GPUs spread `per_host` to a host: of the bytes
    it sends its gpus − 1 peers, (gpus − per_host)/(gpus − 1) go to other hosts over the host's
    network, which the host's `sharing` GPUs crossing it at once share (default `per_host`: this
    all-to-all's own; more where other groups on the host exchange too), and the rest over the
    host's GPU link at the same time; the slower share sets the pace (hierarchical all-to-alls, as
    DeepEP's internode kernels and NCCL's run them, put only the other hosts' share on the network)."""
    if gpus <= per_host or gpus <= 1:
        return local_Bps
    cross = (gpus - per_host) / (gpus - 1)
    return 1.0 / max((1.0 - cross) / local_Bps, cross * (sharing or per_host) / network_Bps)


def expert_all_to_all_time(dispatch_bytes: float, layers: int, ep: int, passes: int, alpha_s: float,
                           beta_Bps: float, imbalance: float = 1.0) -> float:
    """Seconds expert parallelism over `ep` ranks adds to one rank: per MoE layer and pass a dispatch
    and a combine all-to-all, each `ep − 1` α-steps (one per peer) and the rank's `dispatch_bytes`
    over β, scaled by `imbalance` (the busiest rank receives that much more than the mean, and every
    rank waits for it). A backward pass exchanges the gradients the same way."""
    if ep <= 1 or layers <= 0 or dispatch_bytes <= 0:
        return 0.0
    per_pass = 2 * ((ep - 1) * alpha_s + imbalance * dispatch_bytes / beta_Bps)
    return layers * passes * per_pass


def fsdp_forward_gather_time(layer_bytes: float, layers: int, root_bytes: float, n: int, alpha_s: float,
                             beta_Bps: float, forward_s: float = 0.0, micro_batches: int = 1) -> float:
    """Exposed seconds FSDP's parameter gathers add to a forward-only pass over `n` ranks' shards
    (the log-prob pass on the trainer's FSDP shards): per micro-batch the root's and every layer's
    all-gather, each layer's overlapping its neighbour's forward (prefetch), so a layer costs
    max(compute, gather) and the first gathers are exposed. `forward_s` is the pass's compute."""
    if n <= 1:
        return 0.0
    micro = max(1, micro_batches)
    gather = collective_time("all_gather", layer_bytes, n, alpha_s, beta_Bps)
    root = collective_time("all_gather", root_bytes, n, alpha_s, beta_Bps)
    per_layer = forward_s / (micro * max(1, layers))
    return micro * (root + gather + max(0, layers - 1) * max(0.0, gather - per_layer))
