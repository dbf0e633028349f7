"""`hetprof run --backend vllm` end to end on CPU workers (vLLM's CPU build; `make test-vllm`).

One run, several checks (a worker with an engine takes tens of seconds to start): every iteration
records the per-sync check that vLLM's log-probs of the probe equal the trainer's recompute, the
engine's noise lines are filtered from what the run prints, and a generator killed mid-run stops the
run, naming it, with no worker left behind — as with `hf`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hetprof.executor.launch.handwritten_plan import handwritten_plan
from hetprof.executor.records.run_log import read_log
from hetprof.specs import ClusterSpec, WorkloadSpec

pytestmark = [pytest.mark.slow, pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vLLM is not installed (make install-vllm)")]

ROOT = Path(__file__).resolve().parents[2]
HETPROF = str(Path(os.sys.executable).with_name("hetprof"))


def _plan(path: Path) -> Path:
    cluster = ClusterSpec.from_dict({"name": "cpu", "hosts": [{"name": "localhost",
                                                               "gpus": {"type": "cpu", "count": 2}}]})
    workload = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny-vllm.yaml").to_dict()
    workload.update({"prompts_per_step": 4, "responses_per_prompt": 4, "ppo_epochs": 1, "mini_batches": 1})
    # one engine: the generator alone on slot 0, reference and trainer on slot 1 (--timeout below
    # covers the engine start, which the trainer waits through at its first collective)
    handwritten_plan(cluster, workload, {"actor_gen": ["localhost:0"], "ref_infer": ["localhost:1"],
                                         "actor_train": ["localhost:1"]}, backend="vllm").save(path)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (ProcessLookupError, OSError):
        return False


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]


def test_each_sync_is_checked_in_the_record_and_a_killed_generator_stops_the_run(tmp_path):
    log = tmp_path / "run.jsonl"
    cmd = [HETPROF, "--db", str(tmp_path / "db.sqlite"), "run", str(_plan(tmp_path / "plan.json")),
           "--iterations", "50", "--log", str(log), "--seed", "0", "--timeout", "300", "--verify-sync"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        deadline = time.time() + 400
        while time.time() < deadline and proc.poll() is None:
            if log.is_file() and len(log.read_text().splitlines()) >= 3:
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        records = read_log(log)
        pids = json.loads(log.read_text().splitlines()[-1])["pids"]
        engines = _children(pids["localhost:0"])  # the engine's own process
        os.kill(pids["localhost:0"], signal.SIGKILL)  # the generator dies; its engine must follow
        printed, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    gaps = [r["generator_logprob_gap"] for r in records]
    assert len(gaps) >= 2 and all(g is not None and g < 1e-3 for g in gaps), gaps
    assert all(r["sync_verified"] is True for r in records)
    assert proc.returncode != 0
    assert "worker localhost:0 (tasks actor_gen" in err and "SIGKILL" in err
    # the engine's lines that say nothing to the user stay out of the run's output (vllm_worker.py)
    shown = printed + err  # vLLM logs to stdout
    assert "Failed to load weights" not in shown and "Chat template warmup failed" not in shown, shown[-3000:]
    time.sleep(1.0)
    assert not [d for d, pid in pids.items() if _alive(pid)], "worker processes left behind"
    assert engines and not [pid for pid in engines if _alive(pid)], "vLLM engine process left behind"
