"""The optional Weights & Biases logger, in offline mode (no network, files under a temporary folder)."""

from __future__ import annotations

import importlib.util

import pytest
from test_executor_tensorboard import records

from hetprof.errors import HetprofError
from hetprof.executor.records.wandb_log import WandbLog, check_wandb

pytestmark = pytest.mark.skipif(importlib.util.find_spec("wandb") is None,
                                reason="wandb is not installed (pip install 'hetprof[wandb]')")


def test_records_go_to_an_offline_wandb_run_under_the_folder_given(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for key, sub in (("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data"), ("WANDB_CONFIG_DIR", "config")):
        monkeypatch.setenv(key, str(tmp_path / sub))  # nothing of the test's under the home folder
    for key in ("WANDB_DIR", "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    log = WandbLog("hetprof-test", "run-x", tmp_path / "out")
    logged = []
    real_log = log._run.log
    log._run.log = lambda data, **kw: (logged.append(data), real_log(data, **kw))
    written = records(2)
    for rec in written:
        log.write(rec)
    config = dict(log._run.config)
    log.close()
    assert [d["iteration"] for d in logged] == [0, 1]
    assert logged[1]["reward/mean"] == pytest.approx(0.1) and logged[1]["critic/rewards/mean"] == pytest.approx(0.1)
    assert logged[0]["timing_s/gen"] == 1.2 and "samples" in logged[0]
    assert (config["run"], config["plan_hash"]) == ("run-x", "abc123")
    runs = list((tmp_path / "out" / "wandb").glob("offline-run-*-run-x"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), list((tmp_path / "out").rglob("*"))


def test_check_wandb_names_the_missing_package(monkeypatch):
    check_wandb(None)
    check_wandb("p")  # installed here
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(HetprofError, match=r"--wandb p: the wandb package is not installed.*hetprof\[wandb\]"):
        check_wandb("p")
