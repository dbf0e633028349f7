"""Meeting and leaving torch.distributed process groups without port races or teardown crashes.

Rendezvous: a port picked by binding port 0 and closing the socket can be taken by anyone before the
store binds it, so processes spawned on one host meet through a file store (`file_init_method`),
and a single-host launcher lets its store bind port 0 itself. Only separate commands that must be
told a port in advance (multi-host runs on one machine, tests of them) take `unassigned_port`: one
outside the kernel's ephemeral range, which no bind to port 0 or outgoing connection is ever given.

Teardown: a process group still referenced when the interpreter finalizes is destroyed with the
interpreter half gone, and gloo's worker threads then abort the process ("terminate called without an
active exception"). `leave_process_group` is called once everything holding a group is out of scope:
it waits for every peer, collects the last references, then destroys the groups while Python is whole.
"""

from __future__ import annotations

import gc
import random
import socket
import tempfile
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def file_init_method(directory: str | Path | None = None) -> str:
    """An `init_method` URL for a file store in a fresh file under `directory` (a new temporary one
    when None); every process of one group must be given the same URL."""
    root = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="hetprof-rdzv-"))
    root.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="store-", dir=root)) / "rendezvous"
    return f"file://{path}"


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out for port-0 binds and outgoing connections (Linux; IANA's elsewhere)."""
    try:
        low, high = (int(x) for x in EPHEMERAL_RANGE_FILE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 49152, 65535


def unassigned_port(host: str = "127.0.0.1", tries: int = 200, residue: tuple[int, int] = (0, 1)) -> int:
    """A port free on `host` now and outside the ephemeral range, for a rendezvous named in advance.
    `residue` (index, count) keeps to ports p with p % count == index: processes that pick ports side
    by side, each with its own index, never pick the same one."""
    index, count = residue
    low, high = ephemeral_range()
    candidates = [p for p in range(10000, 65536) if not low <= p <= high and p % count == index]
    for port in random.sample(candidates, min(tries, len(candidates))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port outside the ephemeral range {low}-{high} on {host}")


def leave_process_group() -> None:
    """Wait for every rank, drop the last references to groups, and destroy them (see the module doc)."""
    import torch.distributed as dist  # here: the rendezvous helpers above serve processes without torch

    if not dist.is_initialized():
        return
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()
    gc.collect()
