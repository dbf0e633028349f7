"""The command lines and ports tests give to separate `hetprof` processes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hetprof.runtime.distributed import unassigned_port


def hetprof_cmd() -> list[str]:
    """The installed `hetprof` console script next to this interpreter."""
    return [str(Path(sys.executable).with_name("hetprof"))]


def xdist_worker() -> tuple[int, int]:
    """(this pytest-xdist worker's index, the number of workers); (0, 1) without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name.removeprefix("gw")), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def rendezvous_port(host: str = "127.0.0.1", tries: int = 200) -> int:
    """`hetprof.runtime.distributed.unassigned_port` in this xdist worker's own residue class: two
    workers of one test run never pick the same port, so their rendezvous named in advance cannot meet."""
    return unassigned_port(host, tries, residue=xdist_worker())
