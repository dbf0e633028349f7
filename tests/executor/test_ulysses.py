"""Ulysses sequence parallelism: two gloo ranks that split every packed sequence between them train
and score exactly as one rank does — the same log-prob pass, loss and gradients, to rounding."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers.inprocess import hetprof_here, spawn_ranks
from helpers.packing_batches import ragged_batch

from hetprof.executor.algorithms import RLBatch, get_algorithm
from hetprof.executor.algorithms.learner import Learner
from hetprof.executor.models.modeling import build_causal_lm, build_value_model
from hetprof.runtime.dataparallel import wrap_fsdp
from hetprof.runtime.distributed import file_init_method, leave_process_group
from hetprof.runtime.ulysses import ULYSSES_ATTENTION, SequenceParallel
from hetprof.safety.processes import skip_teardown_at_exit

pytestmark = pytest.mark.usefixtures("one_thread")

BUDGET = 48  # tokens per rank: a group's pack holds 2 × 48, so the 104-token batch runs 2 packs


def test_a_packed_row_is_padded_with_a_sequence_of_its_own_and_cut_in_equal_slices():
    from hetprof.runtime.ulysses import shard_row

    ids, positions = torch.arange(10, 15)[None], torch.tensor([[0, 1, 2, 0, 1]])
    first, second = (shard_row(ids, positions, SequenceParallel(None, 2, i)) for i in range(2))
    assert first.input_ids.tolist() == [[10, 11, 12]] and second.input_ids.tolist() == [[13, 14, 0]]
    assert second.position_ids.tolist() == [[0, 1, 0]]
    assert second.row_positions.tolist() == [[0, 1, 2, 0, 1, 0]]  # the pad restarts: it attends only to itself
    assert (second.start, second.width, second.tokens) == (3, 3, 5)
    mine, local = second.local(torch.tensor([1, 3, 4]))
    assert mine.tolist() == [False, True, True] and local.tolist() == [0, 1]


def _update(model: torch.nn.Module, batch: RLBatch, role: str = "actor", **kwargs) -> dict:
    """π_prox of the batch, then one update (lr 0: the gradients stay readable); its statistics and gradients."""
    algorithm = get_algorithm("ppo" if role == "critic" else "grpo")(kl_coef=0.1, clip_eps=0.1)
    learner = Learner(model, torch.optim.SGD(model.parameters(), lr=0.0), algorithm, max_grad_norm=None,
                      role=role, **kwargs)
    proximal = learner.proximal_logprobs(batch) if role == "actor" else None
    stats = learner.update(batch)
    grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in model.parameters()]
    return {"proximal": proximal, "stats": {k: v for k, v in stats.items() if "seconds" not in k},
            "grads": [g.detach().clone() for g in grads]}


WRAPPERS = {"ddp": lambda model: torch.nn.parallel.DistributedDataParallel(model),
            "fsdp": lambda model: wrap_fsdp(model, dist.group.WORLD, "cpu")}
CASES = (("actor", "ddp"), ("critic", "ddp"), ("actor", "fsdp"))  # (role, data-parallel wrapper)
BUILD = {"actor": build_causal_lm, "critic": build_value_model}


def _worker(rank: int, world: int, init: str, path: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.set_num_threads(1)
    group = SequenceParallel.of(dist.group.WORLD)
    out = {}
    for role, wrapper in CASES:
        batch = RLBatch(**torch.load(path + ".batch", weights_only=True), group_size=2)  # every rank: all rows
        model = WRAPPERS[wrapper](BUILD[role]("tiny", seed=0, attn_implementation=ULYSSES_ATTENTION))
        out[role, wrapper] = _update(model, batch, role, max_tokens_per_microbatch=BUDGET * world,
                                     sequence_parallel=group, process_group=dist.group.WORLD)
        del model
    if rank == 0:
        torch.save(out, path + ".out")
    leave_process_group()
    skip_teardown_at_exit()  # no interpreter teardown of torch and transformers per process


@pytest.mark.slow
def test_two_ulysses_ranks_score_and_train_as_one_rank(tmp_path):
    batch = ragged_batch()
    get_algorithm("grpo")().advantages(batch)
    batch.returns = (batch.values + batch.advantages) * batch.mask  # the critic's regression targets
    fields = {k: v for k, v in vars(batch).items() if isinstance(v, torch.Tensor)}
    path = str(tmp_path / "ulysses")
    torch.save(fields, path + ".batch")
    spawn_ranks(_worker, (2, file_init_method(tmp_path), path), 2)
    split = torch.load(path + ".out", weights_only=False)
    for role, wrapper in CASES:
        one = _update(BUILD[role]("tiny", seed=0), copy.deepcopy(batch), role, max_tokens_per_microbatch=BUDGET * 2)
        two = split[role, wrapper]
        if role == "actor":
            assert torch.allclose(two["proximal"], one["proximal"], atol=1e-5), \
                float((two["proximal"] - one["proximal"]).abs().max())
        assert two["stats"].keys() == one["stats"].keys()
        for key, value in one["stats"].items():
            assert two["stats"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (role, wrapper, key)
        assert one["stats"]["micro_batches"] == 2.0  # the budget split the batch: two packs per step
        for a, b in zip(one["grads"], two["grads"], strict=True):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (role, wrapper, float((a - b).abs().max()))


# ---- `hetprof run`: a plan whose trainer, log-prob and reference passes split their sequences --------

def _plan(path, sp: dict, generators: int = 1, **training):
    from hetprof.executor.launch.handwritten_plan import handwritten_plan
    from hetprof.specs import WorkloadSpec

    root = Path(__file__).resolve().parents[2]
    workload = WorkloadSpec.load(root / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    workload.update({"prompts_per_step": 4, "responses_per_prompt": 4, "ppo_epochs": 1, "mini_batches": 1})
    workload["training"].update(training)
    cluster = {"name": "cpu", "hosts": [{"name": "localhost", "gpus": {"type": "cpu", "count": 2}}]}
    both = ["localhost:0", "localhost:1"]
    plan = handwritten_plan(cluster, workload, {"actor_gen": both[:generators], "actor_train": both,
                                                "ref_infer": both}, sequence_parallel=sp)
    plan.save(path)
    return plan


def test_run_refuses_the_sequence_parallelism_it_cannot_carry_out(tmp_path):
    from hetprof.errors import ExecutionError
    from hetprof.executor.launch.checks import check_supported

    plan = _plan(tmp_path / "plan.json", {"actor_train": 2, "ref_infer": 2}, max_tokens_per_microbatch=80)
    assert check_supported(plan) == "gloo"
    assert [t.layout.sp for t in plan.tasks] == [1, 2, 2, 2]  # actor_logprob follows actor_train
    unpacked = _plan(tmp_path / "padded.json", {"actor_train": 2})
    with pytest.raises(ExecutionError, match=r"actor_logprob has layout DP2×TP1×PP1 SP2: .*max_tokens_per_microbatch"):
        check_supported(unpacked)


REWARD = "def reward(prompt, response, answer):\n    return sum(map(ord, response)) % 3 / 2\n"  # varies by sample


def _run(tmp_path: Path, sp: dict) -> list[dict]:
    from hetprof.executor.records.run_log import read_log

    tmp_path.mkdir()
    (tmp_path / "ulysses_reward.py").write_text(REWARD)
    plan = tmp_path / "plan.json"
    _plan(plan, sp, max_tokens_per_microbatch=80)
    done = hetprof_here(["--db", str(tmp_path / "db.sqlite"), "run", str(plan), "--log", str(tmp_path / "run.jsonl"),
                         "--seed", "0", "--timeout", "60", "--iterations", "2", "--reward", "ulysses_reward.py:reward"],
                        tmp_path, 300)
    assert done.returncode == 0, done.stderr[-3000:]
    return read_log(tmp_path / "run.jsonl")


@pytest.mark.slow
def test_hetprof_run_trains_with_ulysses_sequence_parallelism(tmp_path):
    records = _run(tmp_path / "sp2", {"actor_train": 2, "ref_infer": 2})
    assert [r["iteration"] for r in records] == [0, 1]
    assert {t: records[0]["layouts"][t] for t in ("actor_train", "actor_logprob", "ref_infer")} == \
        dict.fromkeys(("actor_train", "actor_logprob", "ref_infer"), "DP2×TP1×PP1 SP2")
    # the reference starts as the actor: its split pass and the trainer's split log-prob pass agree
    assert records[0]["kl"] < 1e-4
    for r in records:
        assert r["stages"]["actor_train"] > 0 and r["stages"]["actor_logprob"] > 0 and r["stages"]["ref_infer"] > 0
        assert len(r["phase_times"]["actor_train"]) == 1  # the group ran its rows once, reported by its lead
    # the same plan without Ulysses (two replicas, half the rows each) takes the same first step
    plain = _run(tmp_path / "sp1", {})
    assert records[0]["grad_norm"] > 0
    assert records[0]["grad_norm"] == pytest.approx(plain[0]["grad_norm"], rel=1e-4)
    assert records[0]["reward_mean"] == plain[0]["reward_mean"]
