"""Shared test fixtures. Every test gets its own profile database so nothing touches ~/.hetprof.

Layout: one folder per stage, named after the package it covers.
  specs/       the hetprof/ floor: vocabulary, specs, catalog, registry, cpuslots, sampling, packing, CLI root
  profiler/    hetprof.profiler: device, task, collective and link suites, `hetprof profile`
  profiles/    hetprof.profiles: the profile database, its sharing and hostile inputs
  costmodels/  hetprof.costmodels: analytical terms, fitted models, the registry
  planner/     hetprof.planner: simulator, task graph, pricing, searches, `hetprof plan`
  executor/    hetprof.executor: learner, algorithms, backends, gloo parallel training, `hetprof run`
  e2e/         across stages through the CLI: profile -> fit, exit codes, CLI polish, a two-host run
  exporter/    hetprof.exporter: what verl and AReaL express, the export, their own loaders (`-m export`)
  docs/        the user guide: every command example parses, every link resolves
  bench/       the bench/ scripts' grids and cases, and the GPU session's CPU dry run
  helpers/     modules tests import (`from helpers.commands import hetprof_cmd`); no tests
`make test` runs them on pytest-xdist workers, each file whole on one worker (--dist loadfile), so a
module's shared end-to-end run happens once; anything a test names outside its tmp_path (ports,
namespaces, environment) must be unique per worker.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolated_db(tmp_path, monkeypatch):
    """Point HETPROF_DB at a per-test file; tests that want a DB use the `db_path` fixture."""
    monkeypatch.setenv("HETPROF_DB", str(tmp_path / "profiles.db"))


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "profiles.db"


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared CPU threads contend badly."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)



def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with multi-process tests (marked `slow`: the long end-to-end runs) first, each file's
    tests in their order: pytest-xdist hands files out in this order as workers free up
    (`--no-loadscope-reorder`), so the long files start early and short unit files fill the end,
    where files ordered by their number of tests left the longest runs to the last minute."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
