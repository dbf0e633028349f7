"""`hetprof run` end to end on CPU worker processes (gloo), as a user runs it.

Starting workers (each imports torch and transformers) dominates, so each run checks several
things: the async staleness bound, bitwise weight sync, records in the log and the profile
database, a Parquet prompt file with a validation split (`run --set`), and — with a worker killed mid-run — the bounded stop and the resume.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import datasets
import pytest
from helpers.inprocess import hetprof_here

from hetprof.costmodels.runrows import run_task_rows
from hetprof.errors import ExecutionError
from hetprof.executor.launch.handwritten_plan import handwritten_plan
from hetprof.executor.records.run_log import read_log
from hetprof.profiles import ProfileDB
from hetprof.specs import ClusterSpec, WorkloadSpec

pytestmark = pytest.mark.slow  # multi-process: `make test-fast` leaves it out

ROOT = Path(__file__).resolve().parents[2]
HETPROF = str(Path(os.sys.executable).with_name("hetprof"))


def write_plan(path: Path, slots: int, placement: dict, shares: dict | None = None, **workload) -> Path:
    cluster = ClusterSpec.from_dict({"name": "cpu", "hosts": [{"name": "localhost", "gpus": {"type": "cpu",
                                                                                              "count": slots}}]})
    base = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    # one optimizer step per update: the records' KL is then that of the step taken at the old weights
    base.update({"prompts_per_step": 4, "responses_per_prompt": 4, "ppo_epochs": 1, "mini_batches": 1, **workload})
    handwritten_plan(cluster, base, placement, shares).save(path)
    return path


def hetprof_run(plan: Path, tmp: Path, *args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    """`hetprof run PLAN` from `tmp`, inside this process (helpers/inprocess.py says why)."""
    return hetprof_here(["--db", str(tmp / "db.sqlite"), "run", str(plan), "--log", str(tmp / "run.jsonl"),
                         "--seed", "0", "--timeout", "60", *args], tmp, timeout)


def hetprof_run_here(plan: Path, tmp: Path, *args: str):
    """`hetprof run` in this process, for runs refused before any worker starts: the same command
    and exit codes without a second interpreter importing torch."""
    from click.testing import CliRunner

    from hetprof.cli import cli

    return CliRunner().invoke(cli, ["--db", str(tmp / "db.sqlite"), "run", str(plan), "--log", str(tmp / "run.jsonl"),
                                    "--seed", "0", "--timeout", "60", *args])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def left_behind(pids: dict[str, int], within: float = 5.0) -> list[str]:
    """The devices whose worker is still alive `within` seconds after the run ended (polled: they
    are usually gone at once)."""
    deadline = time.monotonic() + within
    while (alive_now := [d for d, pid in pids.items() if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive_now


def test_async_k2_keeps_every_trained_sample_within_two_versions_and_syncs_bitwise(tmp_path):
    # two generators with uneven shares; the reference model tensor-parallel over both devices
    plan = write_plan(tmp_path / "plan.json", 2,
                      {"actor_gen": ["localhost:0", "localhost:1"], "ref_infer": [["localhost:0", "localhost:1"]],
                       "actor_train": ["localhost:1"]},
                      shares={"actor_gen": [0.75, 0.25]}, mode="async", staleness=2)
    # prompts from a Parquet file with other field names, a held-out validation split and an LR schedule,
    # all through `run --set`: the workers read what the launcher checked
    rows = [{"question": f"{a}+{b}= #### ", "solution": str(a + b)} for a in range(3) for b in range(3)]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    done = hetprof_run(plan, tmp_path, "--iterations", "5", "--verify-sync", "--prompts", "train.parquet",
                       "--set", "data.prompt_field=question", "--set", "data.answer_field=solution",
                       "--set", "data.validation_size=3", "--set", "data.eval_every=2",
                       "--set", "optimizer.lr_schedule=cosine", "--set", "optimizer.warmup_steps=1")
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_log(tmp_path / "run.jsonl")
    # validation by generation replica 0 (localhost:0), recorded by the leader (localhost:1): after
    # every 2nd iteration and after the last (records count from 0)
    assert [r["iteration"] for r in records if "val_reward_mean" in r] == [1, 3, 4]
    assert all(r["val_prompts"] == 3 and 0.0 <= r["val_reward_mean"] <= 1.2 and "validation" in r["leader_phases"]
               for r in records if "val_reward_mean" in r)
    assert [r["iteration"] for r in records] == [0, 1, 2, 3, 4]
    assert all(r["staleness_max"] <= 2 for r in records)
    assert max(r["staleness_max"] for r in records) == 2  # it really ran two versions ahead
    assert all(r["sync_verified"] is True for r in records)
    assert all(r["mode"] == "async" and r["staleness_bound"] == 2 for r in records)
    assert records[0]["layouts"]["ref_infer"] == "DP1×TP2×PP1"  # reference log-probs tensor-parallel
    assert records[0]["kl"] < 1e-4  # ...and equal to the generator's at the first update
    # the steps that still generate (the last k only drain) time both generator replicas
    generating = [r for r in records if "actor_gen" in r["replicas"]]
    assert len(generating) == 5 - 2 and all(len(r["replicas"]["actor_gen"]) == 2 for r in generating)
    for key in ("kl", "clip_frac", "reward_mean", "tokens_per_s"):
        assert all(isinstance(r[key], float) for r in records)
    # the last k iterations generate nothing but train a batch: their tokens are that batch's, not zero
    assert all(r["tokens"] > 0 and r["tokens_per_s"] > 0 for r in records)
    with ProfileDB(tmp_path / "db.sqlite") as db:
        rows = db.run_records()
        learnable = run_task_rows(db)
    assert set(rows["iteration"]) == {0, 1, 2, 3, 4}
    assert {"actor_gen", "actor_train", "ref_infer", "iteration"} <= set(rows["task"])
    # what `hetprof fit` learns from: every phase the ranks timed, shaped as task rows
    assert set(learnable["benchmark"]) == {"task.prefill", "task.decode", "task.train"}
    gen = rows[rows["task"] == "actor_gen"].iloc[0]["extra"]
    assert gen["work"]["model"]["name"] == "tiny" and {p["device"] for p in gen["phases"]} == {"localhost:0",
                                                                                              "localhost:1"}
    assert set(learnable[learnable["benchmark"] == "task.prefill"]["tp"]) == {1, 2}  # ref_infer ran TP2
    # one run naming: the run's name (the one it prints first, see the killed-worker test) is what
    # validate, db show and db list speak
    from helpers.cli import invoke, printed_names

    name = records[0]["run"]
    db = str(tmp_path / "db.sqlite")
    assert f"run {name}:" in invoke("--db", db, "validate", name[:-2], columns=200).output
    shown = invoke("--db", db, "db", "show", name, columns=200)
    assert shown.exit_code == 0 and "5 recorded" in shown.output
    assert name in printed_names(invoke("--db", db, "db", "list", columns=200).output)


def test_a_verl_parquet_and_a_reward_file_run_as_given(tmp_path):
    """verl's parquet layout read with no options, a reward from a file of the user's named by path (the
    workers start without the working folder on their import path), and the records in an offline W&B run."""
    import importlib.util

    import pandas as pd

    plan = write_plan(tmp_path / "plan.json", 2, {"actor_gen": ["localhost:0"], "ref_infer": ["localhost:1"],
                                                  "actor_train": ["localhost:1"]})
    pd.DataFrame([{"data_source": "arith", "prompt": [{"role": "user", "content": f"{a}+{a}= #### "}],
                   "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(2 * a)}}
                  for a in range(4)]).to_parquet(tmp_path / "train.parquet")
    (tmp_path / "myrew.py").write_text("def score(prompt, response, answer):\n"
                                       "    return 1.0 if answer in ('0', '2', '4', '6') else -1.0\n"
                                       "score.needs_answers = True\n")
    wandb = importlib.util.find_spec("wandb") is not None
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CACHE_DIR": str(tmp_path / "wc"),
           "WANDB_DATA_DIR": str(tmp_path / "wd"), "WANDB_CONFIG_DIR": str(tmp_path / "wcfg")}
    cmd = [HETPROF, "--db", str(tmp_path / "db.sqlite"), "run", str(plan), "--log", str(tmp_path / "run.jsonl"),
           "--iterations", "2", "--timeout", "60", "--prompts", "train.parquet", "--reward", "myrew.py:score",
           *(["--wandb", "hetprof-test"] if wandb else [])]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_log(tmp_path / "run.jsonl")
    assert [r["reward_mean"] for r in records] == [1.0, 1.0]  # every answer was verl's ground truth
    assert all(s["answer"] in ("0", "2", "4", "6") and "#### " in s["prompt"] for r in records for s in r["samples"])
    assert "FutureWarning" not in done.stderr and "past_key_values" not in done.stderr
    assert all(r["mfu"] == {} for r in records)  # cpu slots: the catalog has no peak
    if wandb:
        assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 1


def test_killed_worker_stops_the_run_naming_it_and_resume_completes(tmp_path):
    # PPO with a critic and a reward model, async k = 1, generation tensor-parallel (TP2): every
    # role, both sync edges and both trained models' checkpoints take part in the kill and resume.
    plan = write_plan(tmp_path / "plan.json", 2,
                      {"actor_gen": [["localhost:0", "localhost:1"]], "ref_infer": ["localhost:1"],
                       "reward_infer": ["localhost:0"],
                       "critic_infer": ["localhost:1"], "actor_train": ["localhost:1", "localhost:0"],
                       "critic_train": ["localhost:0"]},
                      shares={"actor_train": [0.6, 0.4]}, mode="async", staleness=1, algorithm="ppo",
                      responses_per_prompt=2, models={"actor": "tiny", "critic": "tiny", "reward": "tiny"})
    log, ckpt = tmp_path / "run.jsonl", tmp_path / "ckpt"
    cmd = [HETPROF, "--db", str(tmp_path / "db.sqlite"), "run", str(plan), "--iterations", "6", "--log", str(log),
           "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2", "--seed", "0", "--timeout", "60"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        deadline = time.time() + 150
        while time.time() < deadline and proc.poll() is None:
            if log.is_file() and len(log.read_text().splitlines()) >= 3:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        pids = json.loads(log.read_text().splitlines()[-1])["pids"]
        os.kill(pids["localhost:0"], signal.SIGKILL)  # the generator dies mid-run
        printed, err = proc.communicate(timeout=60)  # the run ends in bounded time, or TimeoutExpired fails the test
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "worker localhost:0 (tasks actor_gen" in err and "SIGKILL" in err
    assert not left_behind(pids), "worker processes left behind"
    committed = json.loads((ckpt / "COMMITTED.json").read_text())["iteration"]
    before = {r["iteration"] for r in read_log(log)}
    # the name the run prints first is the one its records carry
    assert re.search(r"^run (run-[0-9a-f]{8}-\d{8}T\d{6})$", printed, re.M).group(1) == read_log(log)[0]["run"]
    assert committed >= 2 and committed <= max(before) + 1

    done = hetprof_run(plan, tmp_path, "--iterations", "6", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2",
                       "--resume", "--verify-sync")
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_log(log)
    assert [r["iteration"] for r in records] == list(range(6))
    assert len({r["run"] for r in records}) == 1  # the resumed run continues the same run
    assert all(r["staleness_max"] <= 1 for r in records)
    resumed = [json.loads(line) for line in log.read_text().splitlines()][len(before):]
    assert resumed[0]["iteration"] == committed  # lost at most the iterations since the checkpoint
    assert all(r["sync_verified"] is True for r in resumed)  # actor and critic edges
    assert {"critic_infer", "critic_train", "reward_infer", "critic_sync"} <= set(records[-1]["stages"])
    assert len(records[-1]["replicas"]["actor_train"]) == 2
    assert (ckpt / "critic_train").is_dir() and (ckpt / "actor_train").is_dir()
    assert records[-1]["layouts"]["actor_gen"] == "DP1×TP2×PP1"

    out = subprocess.run([HETPROF, "validate", str(log)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "per task" in out.stdout and "actor_train" in out.stdout


def test_resume_refuses_a_different_plan_before_starting_workers(tmp_path):
    from hetprof.executor.checkpoints import checkpoint

    plan = write_plan(tmp_path / "plan.json", 2,
                      {"actor_gen": ["localhost:0"], "ref_infer": ["localhost:1"], "actor_train": ["localhost:1"]})
    checkpoint.commit(tmp_path / "ckpt", 2, {"plan_hash": "0123456789abcdef", "run": "other"})
    done = hetprof_run_here(plan, tmp_path, "--iterations", "3", "--checkpoint-dir", str(tmp_path / "ckpt"), "--resume")
    assert done.exit_code == 4  # ExecutionError
    assert "made for plan 0123456789abcdef" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "run.jsonl").exists()


def test_layouts_the_runtime_cannot_carry_out_are_refused_up_front(tmp_path):
    from hetprof.executor.launch.checks import check_supported
    from hetprof.specs import Plan

    plan_path = write_plan(tmp_path / "plan.json", 2,
                           {"actor_gen": ["localhost:0"], "ref_infer": ["localhost:1"], "actor_train": ["localhost:1"]})
    base = json.loads(plan_path.read_text())
    for g in base["groups"]:
        g["devices"] = ["localhost:0", "localhost:1"]
    tp, pp = json.loads(json.dumps(base)), json.loads(json.dumps(base))
    for train in (t for t in tp["tasks"] if t["task"] in ("actor_train", "actor_logprob")):  # the pass follows
        train["layout"]["tp"] = 2
        train["tasklets"][0]["devices"] = ["localhost:0", "localhost:1"]
    assert check_supported(Plan.from_dict(tp)) == "gloo"  # TP (and PP) training is carried out
    gen = next(t for t in pp["tasks"] if t["task"] == "actor_gen")  # pipelined generation is not
    gen["layout"]["pp"] = 2
    gen["tasklets"] = [{**gen["tasklets"][0], "stage": 0, "layer_end": 1},
                       {**gen["tasklets"][0], "stage": 1, "layer_start": 1, "devices": ["localhost:1"]}]
    with pytest.raises(ExecutionError, match=r"actor_gen.*PP2"):
        check_supported(Plan.from_dict(pp))
    plan_path.write_text(json.dumps(pp))
    done = hetprof_run_here(plan_path, tmp_path, "--iterations", "1")
    assert done.exit_code == 4 and "actor_gen" in done.stderr and "PP2" in done.stderr
    assert not (tmp_path / "run.jsonl").exists()  # refused before any worker started


def test_hung_worker_stops_the_run_within_the_timeout_naming_it(tmp_path):
    plan = write_plan(tmp_path / "plan.json", 2,
                      {"actor_gen": ["localhost:0"], "ref_infer": ["localhost:1"], "actor_train": ["localhost:1"]})
    log = tmp_path / "run.jsonl"
    cmd = [HETPROF, "--db", str(tmp_path / "db.sqlite"), "run", str(plan), "--iterations", "500", "--log", str(log),
           "--timeout", "5", "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        deadline = time.time() + 150
        while time.time() < deadline and proc.poll() is None:
            if log.is_file() and len(log.read_text().splitlines()) >= 2:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        pids = json.loads(log.read_text().splitlines()[-1])["pids"]
        os.kill(pids["localhost:0"], signal.SIGSTOP)  # the generator hangs (alive, silent)
        deadline = time.time() + 90  # --timeout 5 bounds it: the peer gives up on the hung generator
        while time.time() < deadline and alive(pids["localhost:1"]):
            time.sleep(0.2)
        assert not alive(pids["localhost:1"]), "the peer never gave up on the hung generator"
        # A hung process still takes the agent's SIGTERM; a stopped one holds it pending (torch then
        # waits 30 s before SIGKILL), so it resumes only once its peer has given up on it. On a loaded
        # machine the SIGKILL may already have come: then there is nothing left to resume.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids["localhost:0"], signal.SIGCONT)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 4, err[-2000:]
    # whether the peer's collective timed out first (it names rank 0) or the launcher's patrol killed the
    # stopped worker first (it says so), the hung worker is named
    named = "rank 0 (device localhost:0; tasks actor_gen)" in err and "timed out" in err.lower()
    killed = "worker localhost:0 (tasks actor_gen;" in err and "stayed stopped (not running) past --timeout 5" in err
    assert named or killed, err[-2000:]
    assert "Traceback" not in err and "py_callstack" not in err  # one clear message, tracebacks in files
    assert not left_behind(pids), "worker processes left behind"
