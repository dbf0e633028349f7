"""`hetprof run` of plans whose training is tensor- or pipeline-parallel (one of them packed, beside generation
replicas of TP1 and TP2), end to end on 4 CPU slots.

The runtime must hand every rank of a training replica its rows, gather a sharded trainer's weights
for the sync (checked bitwise on every generator by --verify-sync), and checkpoint per shard so a
resumed run continues the same run.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers.inprocess import hetprof_here
from test_executor_parallel import DEVS, make_plan

from hetprof.costmodels.runrows import run_task_rows
from hetprof.executor.records.run_log import read_log
from hetprof.profiles import ProfileDB

pytestmark = pytest.mark.slow  # multi-process: `make test-fast` leaves it out

HETPROF = str(Path(__import__("sys").executable).with_name("hetprof"))


def run(plan: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """`hetprof run PLAN` from `tmp`, inside this process (helpers/inprocess.py says why)."""
    return hetprof_here(["--db", str(tmp / "db.sqlite"), "run", str(plan), "--log", str(tmp / "run.jsonl"),
                         "--seed", "0", "--timeout", "60", "--verify-sync", "--quiet", *args], tmp, 240)


def _plan(tmp: Path, train: dict, ref: dict, max_tokens: int | None = None,
          generators: tuple[list[str], ...] = ([DEVS[0]], [DEVS[3]])) -> Path:
    d = make_plan(train, ref=ref).to_dict()
    if max_tokens:  # packed token-budget micro-batches in training and inference
        d["workload"]["training"]["max_tokens_per_microbatch"] = max_tokens
    degrees = [len(devs) for devs in generators]
    for t in d["tasks"]:
        if t["task"] == "actor_gen":  # two generators, so the sync reaches ranks outside replica 0
            t["layout"] = {"dp": len(generators), "tp": max(degrees), "pp": 1,
                           **({"replica_tp": degrees} if len(set(degrees)) > 1 else {})}
            t["tasklets"] = [{"replica": i, "stage": 0, "devices": devs, "layer_start": 0, "layer_end": 2,
                              "batch_share": 1 / len(generators)} for i, devs in enumerate(generators)]
    path = tmp / "plan.json"
    type(make_plan(train)).from_dict(d).save(path)
    return path


def test_pp2_x_dp2_training_with_pipelined_reference_runs_syncs_bitwise_and_resumes(tmp_path):
    # actor_train: two pipeline replicas of two stages with uneven shares; ref_infer: PP2 as well
    plan = _plan(tmp_path, {"actor_train": ([[[DEVS[0]], [DEVS[1]]], [[DEVS[2]], [DEVS[3]]]], [0.625, 0.375])},
                 {"ref_infer": ([[[DEVS[3]], [DEVS[2]]]], [1.0])})
    ckpt = tmp_path / "ckpt"
    done = run(plan, tmp_path, "--iterations", "1", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    first = read_log(tmp_path / "run.jsonl")
    assert [r["iteration"] for r in first] == [0]
    assert first[0]["layouts"]["actor_train"] == "DP2×TP1×PP2" and first[0]["layouts"]["ref_infer"] == "DP1×TP1×PP2"
    assert first[0]["sync_verified"] is True  # both generators hold the gathered weights bitwise
    assert first[0]["kl"] < 1e-4  # pipelined reference log-probs equal the generator's at the first update
    assert len(first[0]["replicas"]["actor_train"]) == 2
    assert {p.name for p in (ckpt / "actor_train").iterdir()} == {"stage0-tp0", "stage1-tp0"}

    done = run(plan, tmp_path, "--iterations", "2", "--checkpoint-dir", str(ckpt), "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_log(tmp_path / "run.jsonl")
    assert [r["iteration"] for r in records] == [0, 1]
    assert len({r["run"] for r in records}) == 1 and records[1]["sync_verified"] is True


def test_tp2_x_dp2_training_runs_packed_beside_tp1_and_tp2_generators_and_syncs_bitwise(tmp_path):
    # packed micro-batches of one ~70-token sequence each, split between the replicas by tokens: the
    # reference and the tensor-parallel update still see the generators' log-probs at the first step.
    # The generation replicas differ in TP (one run checks both, starting processes is the slow part):
    # each is a process group of its own degree, and the sync reaches the TP1 copy and both TP2 shards.
    plan = _plan(tmp_path, {"actor_train": ([[DEVS[0:2]], [DEVS[2:4]]], [0.5, 0.5])}, {}, max_tokens=80,
                 generators=([DEVS[0]], DEVS[2:4]))
    done = run(plan, tmp_path, "--iterations", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_log(tmp_path / "run.jsonl")
    assert [r["iteration"] for r in records] == [0, 1]
    assert all(r["sync_verified"] is True for r in records)
    assert records[0]["layouts"]["actor_train"] == "DP2×TP2×PP1"
    assert records[0]["layouts"]["actor_gen"] == "DP2(1×TP1+1×TP2)×PP1"
    # timed as the plan prices packed passes: one sequence a micro-batch (padded: each replica's two rows)
    assert {t["batch"] for t in records[0]["phase_times"]["actor_train"]} == {1}
    assert records[0]["kl"] < 1e-4
    with ProfileDB(tmp_path / "db.sqlite") as db:
        rows = run_task_rows(db)
    decode = rows[rows["benchmark"] == "task.decode"]
    # each generation replica's lead times its decode steps, at its own degree
    assert set(zip(decode["device_id"], decode["tp"], strict=True)) == {(DEVS[0], 1), (DEVS[2], 2)}
