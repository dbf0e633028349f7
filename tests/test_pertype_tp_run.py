"""`hetprof run` of a plan whose generation replicas differ in TP: a TP1 and a TP2 replica on 3 CPU slots.

Each generation replica is a process group of its own degree; the weight sync broadcasts full tensors
and each rank keeps its replica's shard, so every generator must hold the trainer's weights bitwise
(--verify-sync) and generate the log-probs the reference recomputes (KL 0 at the first update).
"""

from __future__ import annotations

import pytest
from test_executor_runtime_run import hetprof_run, write_plan

from hetprof.costmodels.runrows import run_task_rows
from hetprof.executor.records import read_log
from hetprof.profiles import ProfileDB

pytestmark = pytest.mark.slow  # multi-process: `make test-fast` leaves it out


def test_tp1_and_tp2_generation_replicas_run_sync_bitwise_and_record_their_own_tp(tmp_path):
    plan = write_plan(tmp_path / "plan.json", 3,
                      {"actor_gen": [["localhost:0"], ["localhost:1", "localhost:2"]], "ref_infer": ["localhost:1"],
                       "actor_train": ["localhost:2"]}, shares={"actor_gen": [0.5, 0.5]}, responses_per_prompt=2)
    done = hetprof_run(plan, tmp_path, "--iterations", "2", "--verify-sync", "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_log(tmp_path / "run.jsonl")
    assert [r["iteration"] for r in records] == [0, 1]
    assert all(r["sync_verified"] is True for r in records)  # the TP1 copy and both TP2 shards
    assert records[0]["layouts"]["actor_gen"] == "DP2(1×TP1+1×TP2)×PP1"
    assert len(records[0]["replicas"]["actor_gen"]) == 2
    assert records[0]["kl"] < 1e-4  # the sharded replica samples from the same policy the reference scores
    with ProfileDB(tmp_path / "db.sqlite") as db:
        rows = run_task_rows(db)
    decode = rows[rows["benchmark"] == "task.decode"]
    # each replica's lead times its decode steps, at its own degree
    assert set(zip(decode["device_id"], decode["tp"], strict=True)) == {("localhost:0", 1), ("localhost:1", 2)}
