"""Async PPO forms its KL reward penalty and GAE from π_prox, the trainer's policy before the update.

Two gloo workers run the real loop (Worker) of an async (k = 1) PPO plan whose trainer has two
replicas; on the leader the advantage step is observed, and the trainer's log-probs are computed
independently at that moment from its own module. The returns must follow the numpy reference —
token reward = terminal reward − β·(log π_prox − log π_ref), then GAE — and a stale batch must make
π_prox and π_behav differ enough that the behaviour log-probs would fail the same check.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from helpers.inprocess import spawn_ranks
from test_executor_runtime_run import write_plan
from test_rl_math_reference import ref_gae

from hetprof.executor.models.logprobs import token_logprobs
from hetprof.executor.models.modeling import unwrap
from hetprof.executor.records.run_log import read_log
from hetprof.runtime.distributed import file_init_method, leave_process_group
from hetprof.specs import Plan
from hetprof.specs.vocabulary import Task

pytestmark = pytest.mark.slow  # starts worker processes

KL_COEF, GAMMA, LAM = 0.2, 1.0, 0.95
DEVICES = ("localhost:0", "localhost:1")


def _worker(rank: int, init: str, plan_path: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=len(DEVICES))
    torch.set_num_threads(1)
    _run(rank, plan_path, out)
    leave_process_group()  # with the worker and its groups out of scope


def _run(rank: int, plan_path: str, out: str) -> None:
    from hetprof.executor.loop.worker import Worker
    from hetprof.executor.options import RunOptions
    from hetprof.executor.parallel.process_groups import ProcessGroups
    from hetprof.executor.parallel.topology import Topology

    topo = Topology(Plan.load(plan_path), {d: r for r, d in enumerate(DEVICES)})
    options = RunOptions(plan_path=plan_path, iterations=3, log=f"{out}/run.jsonl", quiet=True, timeout_s=60)
    worker = Worker(options, topo, ProcessGroups.build(topo), rank, torch.device("cpu"))
    if worker.is_leader:
        _observe_advantages(worker, f"{out}/seen.pt")
    worker.run()


def _observe_advantages(worker, path: str) -> None:
    """Wrap the leader's advantage step: record its inputs, its returns, the trainer's own log-probs and
    how many π_prox forwards the leader's learner has run so far."""
    original, seen = worker.leader.advantages, []
    learner = worker.runners[Task.ACTOR_TRAIN].learner
    recompute, passes = learner.proximal_logprobs, []

    def proximal_logprobs(rows):
        passes.append(len(rows))
        return recompute(rows)

    learner.proximal_logprobs = proximal_logprobs

    def advantages(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        trainer = unwrap(worker.runners[Task.ACTOR_TRAIN].module)  # the module, not DDP: no collective here
        was = trainer.training
        trainer.eval()
        with torch.no_grad():
            proximal = token_logprobs(trainer, batch["input_ids"], batch["attention_mask"],
                                      worker.workload.training.temperature)
        trainer.train(was)
        result = original(batch)
        seen.append({"proximal": proximal, "behaviour": batch["logprobs"][:, 1:], "ref": batch["ref_logprobs"],
                     "values": batch["values"], "rewards": batch["rewards"],
                     "mask": batch["response_mask"][:, 1:].float(), "returns": result["returns"],
                     "passes": torch.tensor(len(passes))})
        torch.save(seen, path)
        return result

    worker.leader.advantages = advantages


def _reference_returns(seen: dict[str, torch.Tensor], policy: str) -> np.ndarray:
    """GAE returns with the PPO token reward r_T − β·(log π − log π_ref), π the given policy's log-probs."""
    mask = seen["mask"].double().numpy()
    token_rewards = np.zeros_like(mask)
    for row, reward in enumerate(seen["rewards"].double().numpy()):
        cols = np.flatnonzero(mask[row])
        if cols.size:
            token_rewards[row, cols[-1]] = reward
    log_ratio = seen[policy].double().numpy() - seen["ref"].double().numpy()
    token_rewards -= KL_COEF * log_ratio * mask
    values = seen["values"].double().numpy() * mask
    return (ref_gae(token_rewards, values, mask, GAMMA, LAM) + values) * mask


def test_async_ppo_kl_penalty_and_gae_use_the_proximal_policy(tmp_path):
    plan = write_plan(tmp_path / "plan.json", 2,
                      {"actor_gen": ["localhost:0"], "ref_infer": ["localhost:0"], "critic_infer": ["localhost:0"],
                       "actor_train": ["localhost:1", "localhost:0"], "critic_train": ["localhost:1"]},
                      shares={"actor_train": [0.6, 0.4]}, mode="async", staleness=1, algorithm="ppo",
                      responses_per_prompt=2, models={"actor": "tiny", "critic": "tiny"},
                      training={"lr": 0.01, "kl_coef": KL_COEF, "gamma": GAMMA, "lam": LAM, "temperature": 1.0})
    spawn_ranks(_worker, (file_init_method(tmp_path), str(plan), str(tmp_path)), len(DEVICES))
    seen = torch.load(tmp_path / "seen.pt", weights_only=True)
    assert len(seen) == 3
    # one π_prox forward per iteration on the leader: the pass before the advantages, none in the update
    assert [int(batch["passes"]) for batch in seen] == [1, 2, 3]
    stale_gap = []
    for batch in seen:
        got = batch["returns"].double().numpy()
        np.testing.assert_allclose(got, _reference_returns(batch, "proximal"), rtol=1e-4, atol=1e-4)
        stale_gap.append(float(np.abs(got - _reference_returns(batch, "behaviour")).max()))
    # batches 1 and 2 were generated one version back: the behaviour log-probs give other returns
    assert max(stale_gap[1:]) > 1e-2, stale_gap
    records = read_log(tmp_path / "run.jsonl")
    assert [r["iteration"] for r in records] == [0, 1, 2]
    assert all(r["stages"][Task.ACTOR_LOGPROB] > 0 and len(r["replicas"][Task.ACTOR_LOGPROB]) == 2
               for r in records)  # the pass is still timed as its own task, on both trainer replicas
    assert {p["kind"] for p in records[0]["phase_times"][Task.ACTOR_LOGPROB]} == {"prefill"}
