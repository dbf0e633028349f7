"""Shared test fixtures. Every test gets its own profile database so nothing touches ~/.hetprof."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolated_db(tmp_path, monkeypatch):
    """Point HETPROF_DB at a per-test file; tests that want a DB use the `db_path` fixture."""
    monkeypatch.setenv("HETPROF_DB", str(tmp_path / "profiles.db"))


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "profiles.db"


def can_use_netns() -> tuple[bool, str]:
    """Whether this process may create network namespaces (root with iproute2)."""
    if os.geteuid() != 0:
        return False, "needs root for ip netns"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return False, "needs iproute2 (ip, tc)"
    probe = "hetprof-probe-ns"
    ok = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return (True, "") if ok else (False, "ip netns add is not permitted here")


def hetprof_cmd() -> list[str]:
    """The installed `hetprof` console script next to this interpreter."""
    return [str(Path(sys.executable).with_name("hetprof"))]


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared CPU threads contend badly."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
