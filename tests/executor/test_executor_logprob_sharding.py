"""The executor's side of issue 14: the old-log-prob pass fed to the loss, FSDP2 / ZeRO-2 data
parallelism on the CPU (gloo), no reference model with kl_coef 0, and the plan's generation backend."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers.inprocess import hetprof_here, spawn_ranks

from hetprof.errors import HetprofError
from hetprof.executor.algorithms import RLBatch, get_algorithm
from hetprof.executor.algorithms.learner import Learner
from hetprof.executor.backends import get_backend
from hetprof.executor.launch.checks import check_backend
from hetprof.executor.launch.handwritten_plan import handwritten_plan
from hetprof.executor.models.modeling import build_causal_lm
from hetprof.executor.models.tokenizer import CharTokenizer
from hetprof.executor.prompts.data import PromptSource
from hetprof.executor.records.run_log import read_log
from hetprof.runtime.dataparallel import wrap_replica
from hetprof.runtime.distributed import file_init_method, leave_process_group
from hetprof.safety.processes import skip_teardown_at_exit
from hetprof.specs import ClusterSpec, WorkloadSpec

ROOT = Path(__file__).resolve().parents[2]
TOK = CharTokenizer()
LR = 0.5

pytestmark = pytest.mark.usefixtures("one_thread")


def stale_batch() -> RLBatch:
    """Rollouts of a policy (seed 1) other than the one trained (seed 0): the old log-probs matter."""
    behaviour = build_causal_lm("tiny", seed=1)
    prompts = PromptSource.builtin(4, seed=0, words=False).next_batch()
    rollout = get_backend("hf")(behaviour, TOK).generate([TOK.encode(p.text) for p in prompts for _ in range(2)],
                                                         5, generator=torch.Generator().manual_seed(0))
    batch = RLBatch.from_rollout(rollout, torch.tensor([1.0, 0.0, 0.2, 0.0, 1.2, 1.0, 0.0, 0.2]), group_size=2)
    get_algorithm("grpo")(kl_coef=0.0).advantages(batch)
    return batch


def learner_update(batch: RLBatch, recompute: bool) -> list[torch.Tensor]:
    model = build_causal_lm("tiny", seed=0)
    learner = Learner(model, torch.optim.SGD(model.parameters(), lr=LR), get_algorithm("grpo")(kl_coef=0.0),
                      max_grad_norm=None, recompute_proximal=recompute)
    stats = learner.update(copy.deepcopy(batch))
    assert (stats["logprob_seconds"] > 0) == recompute
    return [p.detach().clone() for p in model.parameters()]


def by_hand(batch: RLBatch) -> list[torch.Tensor]:
    """One SGD step on the GRPO loss whose old log-probs are the current weights' own, written out:
    ratio π/π_old clipped, π_old/π_behaviour as the importance weight, no KL term."""
    model = build_causal_lm("tiny", seed=0)
    ids, mask = batch.input_ids, batch.mask.float()
    logits = model(input_ids=ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    old = logp.detach()
    ratio = torch.exp(logp - old)
    adv = batch.advantages
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    weight = torch.exp(old - batch.behaviour_logprobs)
    loss = (weight * pg * mask).sum() / mask.sum()
    loss.backward()
    with torch.no_grad():
        return [(p - LR * p.grad).clone() for p in model.parameters()]


def test_the_log_prob_pass_feeds_the_loss_its_old_log_probs():
    batch = stale_batch()
    with_pass = learner_update(batch, recompute=True)
    for a, b in zip(with_pass, by_hand(batch), strict=True):
        assert torch.allclose(a, b, atol=1e-5), float((a - b).abs().max())
    without = learner_update(batch, recompute=False)  # the rollout's own log-probs as the old ones
    assert max(float((a - b).abs().max()) for a, b in zip(with_pass, without, strict=True)) > 1e-4


def _sharded_worker(rank: int, world: int, init: str, path: str, rows: list[list[int]],
                    shardings: list[str]) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    for sharding in shardings:  # one process pair for every sharding: starting processes is the slow part
        _sharded_update(rank, path, rows, sharding)
    leave_process_group()  # after the model and its groups' users are out of scope
    skip_teardown_at_exit()  # no interpreter teardown of torch and transformers per process


def _sharded_update(rank: int, path: str, rows: list[list[int]], sharding: str) -> None:
    torch.set_num_threads(1)
    full = RLBatch(**torch.load(path + ".batch", weights_only=True), group_size=2)
    model = build_causal_lm("tiny", seed=0)
    wrapped = wrap_replica(model, dist.group.WORLD, torch.device("cpu"), sharding)
    learner = Learner(wrapped, torch.optim.SGD(model.parameters(), lr=LR), get_algorithm("grpo")(kl_coef=0.0),
                      max_grad_norm=None, recompute_proximal=True, process_group=dist.group.WORLD)
    learner.update(full.select(torch.tensor(rows[rank])))
    params = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    if rank == 0:
        kinds = sorted({type(p).__name__ for p in model.parameters()})
        torch.save({"params": [p.detach() for p in params], "kinds": kinds}, f"{path}.{sharding}.out")


SHARDINGS = ["fsdp", "zero2"]


@pytest.fixture(scope="module")
def sharded_updates(tmp_path_factory) -> tuple[RLBatch, str]:
    """One update per sharding by two gloo processes with uneven shares; (the batch, the outputs' stem)."""
    tmp = tmp_path_factory.mktemp("shard")
    batch = stale_batch()
    path = str(tmp / "shard")
    torch.save({k: v for k, v in vars(batch).items() if isinstance(v, torch.Tensor)}, path + ".batch")
    spawn_ranks(_sharded_worker, (2, file_init_method(tmp), path, [[0, 1, 2, 3, 4, 5], [6, 7]], SHARDINGS), 2)
    return batch, path


@pytest.mark.slow
@pytest.mark.parametrize("sharding", SHARDINGS)
def test_fsdp2_on_gloo_with_uneven_shares_equals_the_single_process_update(sharded_updates, sharding):
    batch, path = sharded_updates
    out = torch.load(f"{path}.{sharding}.out", weights_only=False)
    assert out["kinds"] == ["DTensor"]  # really sharded
    for a, b in zip(learner_update(batch, recompute=True), out["params"], strict=True):
        assert torch.allclose(a, b, atol=1e-5), float((a - b).abs().max())


def cpu_plan(tmp: Path, backend: str = "hf", **workload) -> Path:
    cluster = ClusterSpec.from_dict({"name": "cpu", "hosts": [{"name": "localhost", "gpus": {"type": "cpu",
                                                                                              "count": 2}}]})
    base = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    base.update({"prompts_per_step": 4, "responses_per_prompt": 4, "ppo_epochs": 1, "mini_batches": 1,
                 "training": {**base["training"], "kl_coef": 0.0}, **workload})
    plan = handwritten_plan(cluster, base, {"actor_gen": ["localhost:0"],
                                            "actor_train": ["localhost:0", "localhost:1"]},
                            shares={"actor_train": [0.75, 0.25]}, sharding={"actor_train": "fsdp"}, backend=backend)
    path = tmp / "plan.json"
    plan.save(path)
    return path


@pytest.mark.slow
def test_hetprof_run_trains_fsdp_with_the_log_prob_pass_and_no_reference(tmp_path):
    plan = cpu_plan(tmp_path)
    assert [t["task"] for t in json.loads(plan.read_text())["tasks"]] == ["actor_gen", "actor_logprob", "actor_train"]
    cmd = ["--db", str(tmp_path / "db.sqlite"), "run", str(plan), "--log", str(tmp_path / "run.jsonl"),
           "--seed", "0", "--timeout", "60", "--verify-sync", "--checkpoint-dir", str(tmp_path / "ckpt"),
           "--checkpoint-every", "2"]
    done = hetprof_here([*cmd, "--iterations", "2"], tmp_path, 180)
    assert done.returncode == 0, done.stderr[-3000:]
    # the sharded trainer's checkpoint holds the whole model, gathered from both shards
    saved = torch.load(tmp_path / "ckpt" / "actor_train" / "iter-000002" / "state.pt", weights_only=True)
    whole = dict(build_causal_lm("tiny", seed=0).named_parameters())
    assert {n: t.shape for n, t in saved["model"].items() if n in whole} == {n: t.shape for n, t in whole.items()}
    resumed = hetprof_here([*cmd, "--iterations", "3", "--resume"], tmp_path, 180)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records = read_log(tmp_path / "run.jsonl")
    assert [r["iteration"] for r in records] == [0, 1, 2]
    assert all(r["sync_verified"] is True for r in records)  # gathered from the shards, before and after
    assert records[0]["layouts"]["actor_train"] == "DP2×TP1×PP1 fsdp"
    assert "ref_infer" not in records[0]["layouts"] and not records[0].get("kl")  # no reference model, no KL
    # the log-prob pass is timed apart from the update, on both replicas, and recorded as its own task
    assert all(r["stages"]["actor_logprob"] > 0 and len(r["replicas"]["actor_logprob"]) == 2 for r in records)
    assert {p["kind"] for p in records[0]["phase_times"]["actor_logprob"]} == {"prefill"}


def test_a_plan_runs_only_with_the_backend_it_was_made_for(tmp_path):
    plan = cpu_plan(tmp_path, backend="vllm")
    from hetprof.specs import Plan

    loaded = Plan.load(plan)
    assert check_backend(loaded, None) == "vllm" and check_backend(loaded, "vllm") == "vllm"
    with pytest.raises(HetprofError, match="planned for the vllm generation backend, not hf"):
        check_backend(loaded, "hf")
    done = hetprof_here(["--db", str(tmp_path / "db.sqlite"), "run", str(plan), "--backend", "hf"], tmp_path, 60)
    assert done.returncode == 2
    message = done.stderr.strip().splitlines()
    assert len(message) == 1 and "vllm" in message[0] and "hf" in message[0]


def test_a_plan_for_an_engine_run_has_no_backend_for_is_refused(tmp_path):
    from hetprof.specs import Plan

    loaded = Plan.load(cpu_plan(tmp_path, backend="static"))
    for asked in (None, "static"):
        with pytest.raises(HetprofError, match=r"static generation backend, which `hetprof run` cannot run "
                                               r"\(it runs hf, vllm\)"):
            check_backend(loaded, asked)
