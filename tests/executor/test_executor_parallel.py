"""Tensor- and pipeline-parallel training across real gloo processes, checked against one device.

One RL update of the tiny Qwen3 actor (tied embeddings, per-head q/k norms: the two places where a
sharded update can silently differ) with TP2×DP2, PP2×DP2 (uneven batch shares) and TP2×PP2 must
give the parameters a single-process update of the whole batch gives, up to float rounding; the
critic likewise with PP2; the weights gathered for sync must arrive bitwise on a generator; and a
checkpoint written per (stage, TP position) must restore the same state on other ranks.
One spawn runs every case (starting processes is the slow part).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers.inprocess import spawn_ranks

from hetprof.errors import ExecutionError
from hetprof.executor.algorithms import AlgorithmConfig, RLBatch, get_algorithm
from hetprof.executor.algorithms.learner import Learner
from hetprof.executor.launch.checks import check_supported
from hetprof.executor.launch.handwritten_plan import handwritten_plan
from hetprof.executor.models.modeling import build_causal_lm, build_reward_model, build_value_model
from hetprof.executor.parallel.process_groups import ProcessGroups
from hetprof.executor.parallel.sharded import ShardedModel
from hetprof.executor.parallel.topology import Topology
from hetprof.executor.parallel.weightsync import WeightSync, copy_into, state_digest
from hetprof.runtime.distributed import file_init_method, leave_process_group
from hetprof.safety.processes import skip_teardown_at_exit
from hetprof.specs import ClusterSpec, Plan, WorkloadSpec

pytestmark = pytest.mark.slow  # multi-process: `make test-fast` leaves it out

ROOT = Path(__file__).resolve().parents[2]
WORLD = 4
DEVS = [f"localhost:{i}" for i in range(WORLD)]


def make_plan(train: dict, algorithm: str = "grpo", ref: dict | None = None) -> Plan:
    """A 4-slot plan whose training tasks take the given layouts.

    `train[task]` = (replicas, shares) where each replica is a list of stages and each stage a list
    of TP devices, e.g. [[["localhost:0"], ["localhost:1"]]] is one PP2 replica.
    """
    cluster = ClusterSpec.from_dict({"name": "cpu", "hosts": [{"name": "localhost", "gpus": {"type": "cpu",
                                                                                              "count": WORLD}}]})
    wl = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    wl.update({"prompts_per_step": 2, "responses_per_prompt": 2, "ppo_epochs": 1, "mini_batches": 1,
               "algorithm": algorithm})
    if algorithm == "ppo":
        wl["models"] = {"actor": "tiny", "critic": "tiny"}
    placement = {"actor_gen": ["localhost:0"], "ref_infer": ["localhost:0"], "actor_train": ["localhost:0"],
                 "critic_infer": ["localhost:0"], "critic_train": ["localhost:0"]}
    d = handwritten_plan(cluster, wl, {k: v for k, v in placement.items()
                                  if k in ("actor_gen", "ref_infer", "actor_train")
                                  or algorithm == "ppo"}).to_dict()
    layouts = dict(train, **(ref or {}))
    if "actor_train" in layouts:  # the log-prob pass follows its trainer's layout
        layouts["actor_logprob"] = layouts["actor_train"]
    for t in d["tasks"]:
        if t["task"] not in layouts:
            continue
        replicas, shares = layouts[t["task"]]
        pp, tp = len(replicas[0]), len(replicas[0][0])
        bounds = [(0, 1), (1, 2)] if pp == 2 else [(0, 2)]
        t["layout"] = {"dp": len(replicas), "tp": tp, "pp": pp}
        t["tasklets"] = [{"replica": r, "stage": s, "devices": devs, "layer_start": bounds[s][0],
                          "layer_end": bounds[s][1], "batch_share": shares[r]}
                         for r, stages in enumerate(replicas) for s, devs in enumerate(stages)]
    d["groups"] = [{"name": "g0", "tasks": [t["task"] for t in d["tasks"]], "devices": DEVS}]
    for t in d["tasks"]:
        t["group"] = "g0"
    return Plan.from_dict(d)


CASES = {
    # name: task, {task: (replicas, shares)}
    "tp2xdp2": ("actor_train", {"actor_train": ([[DEVS[0:2]], [DEVS[2:4]]], [0.625, 0.375])}),
    "pp2xdp2": ("actor_train", {"actor_train": ([[[DEVS[1]], [DEVS[0]]], [[DEVS[2]], [DEVS[3]]]], [0.375, 0.625])}),
    "tp2xpp2": ("actor_train", {"actor_train": ([[DEVS[0:2], DEVS[2:4]]], [1.0])}),
    "critic_pp2xdp2": ("critic_train", {"critic_train": ([[[DEVS[0]], [DEVS[1]]], [[DEVS[2]], [DEVS[3]]]],
                                                         [0.5, 0.5])}),
}


def rl_batch(seed: int = 3) -> RLBatch:
    g = torch.Generator().manual_seed(seed)
    n, width = 8, 12
    ids = torch.randint(1, 64, (n, width), generator=g)
    attn = torch.ones(n, width, dtype=torch.long)
    attn[1, :3] = 0  # left padding
    attn[5, :2] = 0
    mask = torch.zeros(n, width - 1)
    mask[:, 5:] = 1
    mask[2, 9:] = 0
    batch = RLBatch(input_ids=ids, attention_mask=attn, mask=mask, rewards=torch.rand(n, generator=g),
                    behaviour_logprobs=-torch.rand(n, width - 1, generator=g) * 4, group_size=2,
                    ref_logprobs=-torch.rand(n, width - 1, generator=g) * 4,
                    values=torch.randn(n, width - 1, generator=g))
    return batch


def algorithm(name: str):
    return get_algorithm(name)(AlgorithmConfig(kl_coef=0.05 if name == "grpo" else 0.0))


def reference_update(task: str) -> dict[str, torch.Tensor]:
    """The single-device update of the whole batch (what every sharded layout must reproduce)."""
    alg = algorithm("grpo" if task == "actor_train" else "ppo")
    model = build_causal_lm("tiny", seed=0) if task == "actor_train" else build_value_model("tiny", seed=1)
    batch = rl_batch()
    alg.advantages(batch)
    learner = Learner(model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0), alg, ppo_epochs=2,
                      role="actor" if task == "actor_train" else "critic", recompute_proximal=False)
    learner.update(batch)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def sharded_update(plan: Plan, task: str, rank: int, ckpt: Path):
    topo = Topology(plan, {d: i for i, d in enumerate(DEVS)})
    groups = ProcessGroups.build(topo)
    tr = topo.tasks[task]
    if rank not in tr.all_ranks:
        return topo, groups, None, None
    alg = algorithm("grpo" if task == "actor_train" else "ppo")
    model = build_causal_lm("tiny", seed=0) if task == "actor_train" else build_value_model("tiny", seed=1)
    sharded = ShardedModel(model, topo, groups, task, rank, torch.device("cpu"), "lm" if task == "actor_train" else "value")
    opt = torch.optim.AdamW(sharded.parameters(), lr=1e-2, weight_decay=0.0)
    learner = Learner(sharded.module, opt, alg, ppo_epochs=2, role="actor" if task == "actor_train" else "critic",
                      recompute_proximal=False, parallel=sharded)
    batch = rl_batch()
    alg.advantages(batch)  # over the whole batch, as the runtime's leader does
    counts = [round(s * len(batch)) for s in tr.shares]
    lo = sum(counts[:tr.replica_of(rank)])
    stats = learner.update(batch.select(torch.arange(lo, lo + counts[tr.replica_of(rank)])))
    assert stats["grad_norm"] > 0
    return topo, groups, sharded, opt


def _worker(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    _checks(rank, Path(out))
    leave_process_group()
    skip_teardown_at_exit()  # no interpreter teardown of torch and transformers per process


def _checks(rank: int, out: Path) -> None:
    for name, (task, layouts) in CASES.items():
        plan = make_plan(layouts, algorithm="grpo" if task == "actor_train" else "ppo")
        topo, groups, sharded, opt = sharded_update(plan, task, rank, out)
        full = sharded.full_state() if sharded is not None else None
        lead = topo.tasks[task].lead
        if rank == lead:
            torch.save({n: t.clone() for n, t in full.items()}, out / f"{name}-full.pt")
        # weight sync from the trainer's first rank to a plain model on another rank, bitwise
        other = next(r for r in range(WORLD) if r != lead)
        group = dist.new_group(sorted({lead, other}))
        ref = (build_causal_lm if task == "actor_train" else build_value_model)("tiny", seed=7)
        if rank in (lead, other):
            sync = WeightSync(group, lead, ref.named_parameters(), bucket_mb=0.01)
            if rank == lead:
                sync.send(full.items(), 1)
                digest = state_digest(full.items())
            else:
                sync.receive(copy_into(ref), target=ref)
                digest = state_digest(ref.named_parameters())
            torch.save(digest, out / f"{name}-digest-r{rank}.pt")
        # checkpoint: replica 0 writes its units, every rank reloads its own into a fresh copy
        if sharded is not None:
            if sharded.pos.replica == 0:
                torch.save(sharded.local_state(opt), out / f"{name}-{sharded.pos.unit}.pt")
            dist.barrier(group=groups.replica(task, sharded.pos.replica))
        dist.barrier()
        if sharded is not None:
            fresh_topo = topo
            model = (build_causal_lm if task == "actor_train" else build_value_model)("tiny", seed=5)
            again = ShardedModel(model, fresh_topo, groups, task, rank, torch.device("cpu"),
                                 "lm" if task == "actor_train" else "value")
            opt2 = torch.optim.AdamW(again.parameters(), lr=1e-2, weight_decay=0.0)
            state = torch.load(out / f"{name}-{again.pos.unit}.pt", weights_only=True)
            again.load_local_state(opt2, state)
            restored = again.full_state()
            if rank == lead:
                torch.save(restored, out / f"{name}-restored.pt")
            same = all(torch.equal(_loc(a), _loc(b)) for a, b in zip(again.parameters(), sharded.parameters(),
                                                                       strict=True))
            assert same, f"{name}: rank {rank} did not restore its shard"
            assert len(opt2.state) == len(opt.state)
        dist.barrier()
        if name == "critic_pp2xdp2":  # a pipelined forward of a scalar-head (reward) model
            model = build_reward_model("tiny", seed=2)
            pipe = ShardedModel(model, topo, groups, task, rank, torch.device("cpu"), "value").pipeline
            batch = rl_batch()
            values = pipe.forward(batch.input_ids, batch.attention_mask)
            torch.save(values, out / f"reward-values-r{rank}.pt")
    dist.barrier()


def _loc(t):
    return t.to_local() if hasattr(t, "to_local") else t


@pytest.fixture(scope="module")
def spawned(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("parallel")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spawn_ranks(_worker, (file_init_method(out), str(out)), WORLD)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_sharded_update_equals_the_single_device_update(spawned, name, one_thread):
    task = CASES[name][0]
    want = reference_update(task)
    got = torch.load(spawned / f"{name}-full.pt", weights_only=True)
    assert list(got) == list(want)  # every parameter, in the generators' order
    start = dict((build_causal_lm("tiny", seed=0) if task == "actor_train"
                  else build_value_model("tiny", seed=1)).named_parameters())
    moved = 0
    for n, w in want.items():
        # Adam divides each gradient element by its own magnitude, so an element whose gradient is
        # ~0 can turn float rounding into a visible share of its step (lr = 1e-2): 1 % of lr allowed.
        torch.testing.assert_close(got[n], w, rtol=1e-4, atol=1e-4, msg=lambda m, n=n: f"{name} {n}: {m}")
        moved += int(not torch.equal(w, start[n]))
    assert moved > len(want) // 2  # the update really moved the weights


@pytest.mark.parametrize("name", list(CASES))
def test_gathered_weights_reach_a_generator_bitwise(spawned, name):
    digests = {torch.load(p, weights_only=True) for p in spawned.glob(f"{name}-digest-r*.pt")}
    assert len(list(spawned.glob(f"{name}-digest-r*.pt"))) == 2 and len(digests) == 1


@pytest.mark.parametrize("name", list(CASES))
def test_per_shard_checkpoint_restores_the_same_weights(spawned, name):
    got = torch.load(spawned / f"{name}-full.pt", weights_only=True)
    restored = torch.load(spawned / f"{name}-restored.pt", weights_only=True)
    assert all(torch.equal(got[n], restored[n]) for n in got)


def test_check_supported_runs_tp_and_pp_training_and_refuses_pipelined_generation():
    assert check_supported(make_plan(CASES["tp2xpp2"][1])) == "gloo"
    assert check_supported(make_plan(CASES["critic_pp2xdp2"][1], algorithm="ppo")) == "gloo"
    pp_ref = {"ref_infer": ([[[DEVS[0]], [DEVS[1]]]], [1.0])}
    assert check_supported(make_plan({}, ref=pp_ref)) == "gloo"
    with pytest.raises(ExecutionError, match=r"task actor_gen has layout DP1×TP1×PP2: this executor runs no "
                                             r"pipeline stages for actor_gen"):
        check_supported(make_plan({}, ref={"actor_gen": ([[[DEVS[0]], [DEVS[1]]]], [1.0])}))
    with pytest.raises(ExecutionError, match=r"task critic_infer has layout DP1×TP1×PP2"):
        check_supported(make_plan({}, algorithm="ppo", ref={"critic_infer": ([[[DEVS[0]], [DEVS[1]]]], [1.0])}))


def test_pipelined_forward_of_a_scalar_head_model_equals_the_whole_model_on_every_stage(spawned, one_thread):
    batch = rl_batch()
    want = build_reward_model("tiny", seed=2)(batch.input_ids, batch.attention_mask)
    for rank in range(WORLD):
        torch.testing.assert_close(torch.load(spawned / f"reward-values-r{rank}.pt", weights_only=True), want,
                                   rtol=1e-5, atol=1e-6)
