"""What each host's worker does in the link suite (started by torch's elastic launcher).

Every host runs one worker; torchrun's c10d rendezvous forms the group. Host pairs are measured one
at a time (a shared NIC would otherwise split its bandwidth between pairs), each direction timed
by its sender: a header says the size, the payload follows, and the receiver's one-element
acknowledgement marks the end — without it the sender would time only its socket buffer. The
sender first probes with growing messages until one takes a noticeable time, then sweeps sizes
up to about `target_s` seconds each, interleaving sizes across repeats so drift cannot bias the fit.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from hetprof.errors import ExecutionError
from hetprof.profiler.linkfit import fit_alpha_beta
from hetprof.runtime.distributed import leave_process_group

KiB = 1024
FIRST_PROBE = 64 * KiB
MAX_MESSAGE = 1024**3
STOP = 0


def pairs(hosts: list[dict], per_region: bool) -> list[tuple[int, int]]:
    """Unordered rank pairs to measure: all of them, or the first pair found for each region pair."""
    out, seen = [], set()
    for i, j in itertools.combinations(range(len(hosts)), 2):
        if per_region:
            key = tuple(sorted((hosts[i].get("region") or "", hosts[j].get("region") or "")))
            if key in seen:
                continue
            seen.add(key)
        out.append((i, j))
    return out


def sweep_sizes(bandwidth_Bps: float, target_s: float, count: int, floor: int) -> list[int]:
    """`count` sizes, geometric from target_s / 16 to target_s worth of bytes at the probed rate."""
    top = max(floor * 2, min(MAX_MESSAGE, int(bandwidth_Bps * target_s)))
    bottom = max(floor, top // 16)
    ratio = (top / bottom) ** (1 / max(count - 1, 1))
    return sorted({int(bottom * ratio**i) // 4 * 4 for i in range(count)})


def link_worker(spec: dict) -> list[dict]:
    """Entry point of one host's worker; returns the directions this host timed (as the sender)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    me = {"host": spec["host"], "region": spec.get("region")}
    hosts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, me)
    rank = dist.get_rank()
    mine = []
    for a, b in pairs(hosts, spec.get("per_region", False)):
        for src, dst in ((a, b), (b, a)):
            if rank == src:
                mine.append(_send_side(dist, torch, dst, hosts[src], hosts[dst], spec))
            elif rank == dst:
                _receive_side(dist, torch, src)
        dist.barrier()
    leave_process_group()  # on success only: after a failure a peer may be gone, and the process exits
    return mine


def _exchange(dist, torch, dst: int, size: int) -> float:
    header = torch.tensor([size], dtype=torch.int64)
    dist.send(header, dst)
    payload = torch.rand(size // 4).add_(0.5)  # random bytes: no link compression can flatter it
    ack = torch.zeros(1)
    start = time.perf_counter()
    dist.send(payload, dst)
    dist.recv(ack, dst)
    return time.perf_counter() - start


def _send_side(dist, torch, dst: int, me: dict, peer: dict, spec: dict) -> dict:
    target = float(spec.get("target_s", 0.4))
    size, probe, previous = FIRST_PROBE, 0.0, None
    while size < MAX_MESSAGE:
        # grow until a message takes a noticeable time AND quadrupling it at least doubled the time:
        # past the latency floor, and not fooled by one descheduled exchange on a busy host
        probe = min(_exchange(dist, torch, dst, size) for _ in range(2))
        if probe >= target / 8 and previous is not None and probe >= 2 * previous:
            break
        previous = probe
        size = min(MAX_MESSAGE, size * 4)
    sizes = sweep_sizes(size / probe, target, int(spec.get("sizes", 6)), FIRST_PROBE)
    samples: list[tuple[int, float]] = []
    for attempt in range(3):
        for _ in range(int(spec.get("repeats", 3))):
            for s in sizes:
                samples.append((s, _exchange(dist, torch, dst, s)))
        try:
            fit = fit_alpha_beta([s for s, _ in samples], [t for _, t in samples])
            break
        except ExecutionError:
            if attempt == 2 or sizes[-1] >= MAX_MESSAGE:
                dist.send(torch.tensor([STOP], dtype=torch.int64), dst)
                raise
            # noise swamped the slope: larger messages, and keep what was measured
            sizes = sorted({min(MAX_MESSAGE, s * 4) for s in sizes})
    dist.send(torch.tensor([STOP], dtype=torch.int64), dst)
    return {"src_host": me["host"], "dst_host": peer["host"], "src_region": me.get("region"),
            "dst_region": peer.get("region"), "samples": samples, "alpha_s": fit.alpha_s,
            "alpha_fit": fit.alpha_fit, "beta_Bps": fit.beta_Bps, "residual": fit.residual}


def _receive_side(dist, torch, src: int) -> None:
    header = torch.zeros(1, dtype=torch.int64)
    ack = torch.ones(1)
    while True:
        dist.recv(header, src)
        size = int(header.item())
        if size == STOP:
            return
        buf = torch.empty(size // 4)
        dist.recv(buf, src)
        dist.send(ack, src)
