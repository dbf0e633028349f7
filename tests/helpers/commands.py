"""The command lines and ports tests give to separate `hetprof` processes."""

from __future__ import annotations

import os
import random
import socket
import sys
from pathlib import Path

from hetprof.runtime.distributed import ephemeral_range


def hetprof_cmd() -> list[str]:
    """The installed `hetprof` console script next to this interpreter."""
    return [str(Path(sys.executable).with_name("hetprof"))]


def xdist_worker() -> tuple[int, int]:
    """(this pytest-xdist worker's index, the number of workers); (0, 1) without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name.removeprefix("gw")), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def rendezvous_port(host: str = "127.0.0.1", tries: int = 200) -> int:
    """A port free on `host` now, outside the ephemeral range and in this xdist worker's own residue
    class: like `hetprof.runtime.distributed.unassigned_port`, but two workers of one test run never pick
    the same port, so their rendezvous named in advance cannot meet by chance."""
    index, count = xdist_worker()
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
