"""Issue 16, the start-up and run points: code beside a plan or database never runs, a killed worker is
named, sizes are bounded before workers start, and broken files give one line."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.hostile_files import fill

from hetprof.cli import cli
from hetprof.errors import ExecutionError, HetprofError
from hetprof.executor.launch.peerloss import LINGER_S, linger_if_peer_lost, peer_lost
from hetprof.executor.launch.sizebounds import check_run_sizes
from hetprof.safety.processes import isolated_children
from hetprof.specs import WorkloadSpec

ROOT = Path(__file__).resolve().parents[2]
HETPROF = str(Path(sys.executable).with_name("hetprof"))
PLANTED = "import pathlib, os\npathlib.Path(os.environ['HETPROF_MARKER']).write_text('ran')\n"


def _plant(folder: Path, *modules: str) -> Path:
    for name in modules:
        (folder / f"{name}.py").write_text(PLANTED)
    return folder / "planted-code-ran"


# ---- 1. code from a shared folder ---------------------------------------------------------------

def test_point01_merge_staging_worker_ignores_a_json_py_beside_the_database(tmp_path):
    src, target = tmp_path / "theirs.db", tmp_path / "mine.db"
    fill(src, n=30)
    marker = _plant(tmp_path, "json")
    script = ("import sys; from hetprof.profiles import staging, ProfileDB, merge; staging.MIN_ROWS = 1\n"
              "with ProfileDB(sys.argv[1]) as db: print(merge(db, sys.argv[2])['samples'])")
    # -P for this parent too: it stands for the `hetprof` console script, which never has the folder on its path
    done = subprocess.run([sys.executable, "-P", "-c", script, str(target), str(src)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "HETPROF_MARKER": str(marker)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "30"
    assert not marker.exists()


def _spawned() -> None:
    import selectors  # noqa: F401  # what multiprocessing's start-up imports anyway


@pytest.mark.parametrize("isolated", [True, False])
def test_point01_spawned_children_do_not_import_from_the_current_folder(tmp_path, monkeypatch, isolated):
    marker = _plant(tmp_path, "selectors")
    monkeypatch.setenv("HETPROF_MARKER", str(marker))
    monkeypatch.chdir(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    if isolated:
        with isolated_children():
            proc = ctx.Process(target=_spawned)
            proc.start()
    else:
        proc = ctx.Process(target=_spawned)
        proc.start()
    proc.join(60)
    # without the isolation the planted module runs: the test would catch a start-up path that skips it
    assert marker.exists() is (not isolated)


# ---- 8. a killed worker is named ----------------------------------------------------------------

def test_point08_survivors_of_a_lost_peer_linger_and_others_do_not():
    waited: list[float] = []
    lost = RuntimeError("[gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:40135")
    assert peer_lost(lost) and linger_if_peer_lost(lost, waited.append) and waited == [LINGER_S]
    try:
        try:
            raise OSError("Connection reset by peer")
        except OSError as inner:
            raise RuntimeError("all_gather failed") from inner
    except RuntimeError as chained:
        assert peer_lost(chained)
    assert not linger_if_peer_lost(ValueError("bad reward"), waited.append) and waited == [LINGER_S]


def _write_plan(path: Path, **workload: object) -> Path:
    from hetprof.executor.launch.handwritten_plan import handwritten_plan
    from hetprof.specs import ClusterSpec

    cluster = ClusterSpec.from_dict({"name": "cpu", "hosts": [{"name": "localhost", "gpus": {"type": "cpu",
                                                                                              "count": 2}}]})
    base = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    base.update({"prompts_per_step": 4, "responses_per_prompt": 4, **workload})
    handwritten_plan(cluster, base, {"actor_gen": ["localhost:0"], "ref_infer": ["localhost:1"],
                                     "actor_train": ["localhost:1"]}).save(path)
    return path


def _complete_lines(log) -> list[str]:
    """The log's lines the writer has finished: a record longer than a write's chunk can be read
    half-written while the run goes on."""
    text = log.read_text() if log.is_file() else ""
    return text.split("\n")[:-1]


@pytest.mark.slow
def test_point08_worker_1_killed_is_named_by_its_signal_and_point01_no_planted_code_runs(tmp_path):
    plan = _write_plan(tmp_path / "plan.json")
    marker = _plant(tmp_path, "selectors", "socket", "json")
    log = tmp_path / "run.jsonl"
    cmd = [HETPROF, "--db", str(tmp_path / "db.sqlite"), "run", str(plan), "--iterations", "500", "--log", str(log),
           "--timeout", "60", "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "HETPROF_MARKER": str(marker)})
    try:
        deadline = time.time() + 150
        while time.time() < deadline and proc.poll() is None:
            if _complete_lines(log):
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        pids = json.loads(_complete_lines(log)[-1])["pids"]
        os.kill(pids["localhost:1"], signal.SIGKILL)  # the trainer dies mid-run
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 4, err[-2000:]
    assert "worker localhost:1" in err and "SIGKILL" in err, err[-2000:]
    assert "Connection reset" not in err and "worker localhost:0" not in err, err[-2000:]
    assert not marker.exists()


# ---- 9. plan and workload sizes -----------------------------------------------------------------

@pytest.mark.parametrize(("field", "value"), [("staleness", 10**18), ("prompts_per_step", 10**7),
                                              ("responses_per_prompt", 10**6), ("ppo_epochs", 10**9)])
def test_point09_workload_sizes_are_bounded_when_the_plan_loads(tmp_path, field, value):
    plan = _write_plan(tmp_path / "plan.json")
    data = json.loads(plan.read_text())
    data["workload"][field] = value
    if field == "staleness":
        data["workload"]["mode"] = "async"
    plan.write_text(json.dumps(data))
    result = CliRunner().invoke(cli, ["run", str(plan), "--iterations", "1"])
    assert result.exit_code == 2, result.output
    assert f"field '{field}'" in result.output and "Traceback" not in result.output


def test_point09_step_buffers_are_checked_against_host_memory_before_workers_start():
    workload = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml")
    check_run_sizes(workload, 20)
    big = WorkloadSpec.from_dict({**workload.to_dict(), "prompts_per_step": 65536, "responses_per_prompt": 16,
                                  "mode": "async", "staleness": 8})
    with pytest.raises(ExecutionError, match="staleness.*prompts_per_step 65536.*responses_per_prompt 16"):
        check_run_sizes(big, 20, memory_bytes=64 * 2**30)
    with pytest.raises(HetprofError, match="--iterations") as err:
        check_run_sizes(workload, 10**12)
    assert err.value.exit_code == 2  # a bad option, not a run that cannot be carried out


# ---- 10. one-line errors for broken plan files and a missing iteration row -------------------------------

@pytest.mark.parametrize("content", [b"\xff\xfe{}", b"[" * 100_000 + b"]" * 100_000, b'{"cluster": "\\ud800"}',
                                     b'{"cluster": NaN}'])
def test_point10_broken_plan_files_give_one_line_and_exit_2(tmp_path, content):
    plan = tmp_path / "plan.json"
    plan.write_bytes(content)
    result = CliRunner().invoke(cli, ["run", str(plan)])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(plan) in lines[0], result.output


def test_point10_validate_on_a_run_whose_iteration_row_is_missing(tmp_path, db_path):
    from hetprof.profiles import ProfileDB

    with ProfileDB(db_path) as db:
        db.add_run_records([{"run": "r9", "iteration": i, "task": task, "seconds": 1.0}
                            for i in range(3) for task in ("actor_gen", "iteration")])
    conn = sqlite3.connect(db_path)
    conn.execute("DELETE FROM run_records WHERE iteration = 1 AND task = 'iteration'")
    conn.commit()
    conn.close()
    result = CliRunner().invoke(cli, ["validate", "r9", "--db", str(db_path)])
    assert result.exit_code == 2, result.output
    assert "iteration 1 has no measured iteration time" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(("edit", "field"), [({"count": 10**18}, "hosts[0].count"),
                                             ({"gpus": {"type": "cpu", "count": 10**18}}, "hosts[0].gpus.count"),
                                             ({"count": 1000, "gpus": {"type": "cpu", "count": 1000}}, "hosts")])
def test_point09_cluster_sizes_are_bounded_before_hosts_are_expanded(tmp_path, edit, field):
    from hetprof.errors import SpecError
    from hetprof.specs import ClusterSpec

    spec = tmp_path / "cluster.yaml"
    spec.write_text(json.dumps({"name": "c", "hosts": [{"name": "h", "gpus": {"type": "cpu"}, **edit}]}))
    with pytest.raises(SpecError, match=field.replace("[", r"\[").replace("]", r"\]")):
        ClusterSpec.load(spec)
