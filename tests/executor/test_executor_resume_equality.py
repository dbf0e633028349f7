"""A resumed run is the uninterrupted run (issue 34): GRPO and PPO, sync and async.

Each case runs the plan once uninterrupted, then resumes a copy of its checkpoint folder cut back to
what a run stopped right after committing iteration STOP leaves (the later checkpoints gone,
COMMITTED.json at STOP); the resumed iterations must record the same losses, learning rates and
rewards, and the last checkpoint must hold the same weights, optimizer moments, learner progress,
random generators and data position. A cosine schedule with warm-up makes a restarted schedule
show, two mini-batches make a restarted shuffler show, and async mode has a batch in flight at
the checkpoint (one case has the leader generate too, so it keeps its own); one case trains two
replicas with uneven shares, whose shufflers advance apart.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_executor_runtime_run import hetprof_run, write_plan

from hetprof.executor.checkpoints import checkpoint
from hetprof.executor.records.run_log import read_log
from hetprof.executor.records.run_record import TRAIN_KEYS

pytestmark = pytest.mark.slow  # multi-process: `make test-fast` leaves it out

ITERATIONS, STOP = 4, 2
TOLERANCE = 1e-6
COMPARED = (*TRAIN_KEYS, "reward_mean", "reward_std", "tokens", "staleness_max", "staleness_mean")
WORKLOAD = {"mini_batches": 2, "optimizer": {"lr_schedule": "cosine", "warmup_steps": 2}}
GRPO = {"actor_gen": ["localhost:0"], "ref_infer": ["localhost:1"], "actor_train": ["localhost:1"]}
# two trainer replicas with uneven shares: each advances its own shuffler, which its rank saves
GRPO_DP2 = {**GRPO, "actor_train": ["localhost:1", "localhost:0"]}
PPO = {"actor_gen": ["localhost:0", "localhost:1"], "ref_infer": ["localhost:1"], "critic_infer": ["localhost:0"],
       "actor_train": ["localhost:1"], "critic_train": ["localhost:0"]}
CASES = {
    "grpo-sync": (GRPO_DP2, {}),
    "grpo-async": (GRPO, {"mode": "async", "staleness": 1}),
    "ppo-sync": (PPO, {"algorithm": "ppo", "models": {"actor": "tiny", "critic": "tiny"}}),
    "ppo-async": (PPO, {"algorithm": "ppo", "models": {"actor": "tiny", "critic": "tiny"}, "mode": "async",
                        "staleness": 1}),
}


def _stopped_copy(ckpt: Path, to: Path) -> None:
    """`ckpt` as a run stopped right after committing STOP leaves it: nothing later on disk."""
    shutil.copytree(ckpt, to)
    for later in sorted(to.rglob(checkpoint.iteration_folder(ITERATIONS)), reverse=True):
        shutil.rmtree(later)
    for pointer in to.rglob(checkpoint.LATEST):
        pointer.write_text(checkpoint.iteration_folder(STOP) + "\n")
    committed = json.loads((to / checkpoint.COMMIT).read_text())
    checkpoint.commit(to, STOP, {k: v for k, v in committed.items() if k != "iteration"})


def _states(ckpt: Path, iteration: int) -> dict[str, dict]:
    """Every unit's state at `iteration` (trained models, and each rank's own), by unit."""
    return {str(unit.relative_to(ckpt)): checkpoint.load(unit / checkpoint.iteration_folder(iteration))[0]
            for unit in checkpoint.unit_folders(ckpt, iteration)}


def _assert_same(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype, where
        if a.is_floating_point():
            assert torch.allclose(a, b, rtol=0, atol=TOLERANCE), f"{where}: max diff {(a - b).abs().max()}"
        else:
            assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: {sorted(set(a) ^ set(b))[:5]}"
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert b == pytest.approx(a, rel=0, abs=TOLERANCE), where
    else:
        assert a == b, where


@pytest.mark.parametrize("case", list(CASES))
def test_a_resumed_run_is_the_uninterrupted_run(tmp_path, case):
    placement, workload = CASES[case]
    shares = {"actor_train": [0.75, 0.25]} if len(placement["actor_train"]) == 2 else None
    plan = write_plan(tmp_path / "plan.json", 2, placement, shares, **WORKLOAD, **workload)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    straight.mkdir()
    args = ("--iterations", str(ITERATIONS), "--checkpoint-every", str(STOP))
    done = hetprof_run(plan, straight, *args, "--checkpoint-dir", str(straight / "ckpt"))
    assert done.returncode == 0, done.stderr[-3000:]
    _stopped_copy(straight / "ckpt", resumed / "ckpt")
    in_flight = torch.load(resumed / "ckpt" / "ranks" / "rank-00000" / checkpoint.iteration_folder(STOP) / "state.pt",
                           weights_only=True)["rollouts"]
    assert bool(in_flight) == ("async" in case)  # async: batch STOP was generated before the checkpoint
    done = hetprof_run(plan, resumed, *args, "--checkpoint-dir", str(resumed / "ckpt"), "--resume")
    assert done.returncode == 0, done.stderr[-3000:]

    want = {r["iteration"]: r for r in read_log(straight / "run.jsonl")}
    got = read_log(resumed / "run.jsonl")
    assert [r["iteration"] for r in got] == list(range(STOP, ITERATIONS))
    assert len({want[0]["run"], *(r["run"] for r in got)}) == 1  # the same run, continued
    lrs = [want[i]["lr"] for i in range(ITERATIONS)]
    assert len(set(lrs)) == ITERATIONS and lrs[STOP] < max(lrs[:STOP])  # the schedule bites: a restart shows
    for record in got:
        keys = [k for k in want[record["iteration"]] if k in COMPARED or k.startswith("critic_")]
        assert "policy_loss" in keys and ("critic_grad_norm" in keys) == case.startswith("ppo")
        for key in keys:
            _assert_same(want[record["iteration"]][key], record[key], f"iteration {record['iteration']} {key}")
    final_straight, final_resumed = _states(straight / "ckpt", ITERATIONS), _states(resumed / "ckpt", ITERATIONS)
    assert {"actor_train", "ranks/rank-00000", "ranks/rank-00001"} <= set(final_straight)
    _assert_same(final_straight, final_resumed, "checkpoint")
