"""Expert parallelism over 2 gloo ranks (executor/parallel/experts.py) against one rank: the tiny
Qwen3-MoE's loss, every gradient and the clip norm equal, to rounding; the gathered weights and
checkpoint state are the whole model's; forward passes of different counts per rank run in lockstep.

One spawn runs 4 ranks as 2 EP groups of 2 (DP4 EP2); each takes a quarter of a batch (data
parallelism), holds half of every MoE layer's experts, exchanges tokens with the other rank of its
group in the layers' all-to-alls, and averages its experts' gradients with the other group's rank
holding the same experts.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers.inprocess import spawn_ranks

from hetprof.executor.models.modeling import build_causal_lm
from hetprof.executor.parallel.experts import ExpertParallel, expert_lockstep
from hetprof.runtime.distributed import file_init_method, leave_process_group
from hetprof.safety.processes import skip_teardown_at_exit

pytestmark = pytest.mark.slow  # multi-process: `make test-fast` leaves it out

WORLD, EP = 4, 2
SEQUENCES, LENGTH = 8, 12


def _batch() -> torch.Tensor:
    return torch.randint(0, 64, (SEQUENCES, LENGTH), generator=torch.Generator().manual_seed(3))


def _loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (every row the same length, so halves' means average to the whole's)."""
    logits = model(input_ids=ids).logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _worker(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group, in order
    peers = [dist.new_group([0, 2]), dist.new_group([1, 3])]  # the ranks holding the same experts
    place = rank % EP

    def placed(model: torch.nn.Module) -> ExpertParallel:
        return ExpertParallel(model, groups[rank // EP], dist.group.WORLD, peers[place], replicas=WORLD)

    model = build_causal_lm("tiny-moe", seed=11)
    ep = placed(model)
    share = SEQUENCES // WORLD
    loss = _loss(model, _batch()[rank * share:(rank + 1) * share])
    loss.backward()
    ep.finish_gradients()
    norm = ep.clip_grad_norm_(1e9)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    full = {n: t.clone() for n, t in ep.full_state().items()}  # the optimizer steps below
    # forwards of different counts (a group's place 0 two, place 1 one) in lockstep, each rank's rows its own
    with torch.no_grad(), expert_lockstep(model):
        rows = _batch()[:2 + place]
        logits = torch.cat([model(input_ids=part).logits for part in rows.split(2 - place)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.step()  # moments to gather, then restore in another model
    saved = ep.full_training_state(optimizer)
    fresh = placed(build_causal_lm("tiny-moe", seed=12))
    fresh_opt = torch.optim.AdamW(fresh.module.parameters(), lr=1e-3)
    fresh.load_full_training_state(fresh_opt, saved)
    restored = fresh.full_training_state(fresh_opt)
    torch.save({"loss": mean / WORLD, "grads": grads, "first": [s.first for s in ep.shards], "norm": norm,
                "full": full, "logits": logits, "saved": saved, "restored": restored},
               Path(out) / f"rank{rank}.pt")
    leave_process_group()
    skip_teardown_at_exit()


@pytest.fixture(scope="module")
def spawned(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("experts")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spawn_ranks(_worker, (file_init_method(out), str(out)), WORLD)
    return out


def test_ep2_loss_and_gradients_equal_one_rank(spawned):
    model = build_causal_lm("tiny-moe", seed=11)
    loss = _loss(model, _batch())
    loss.backward()
    want = dict(model.named_parameters())
    for rank in range(WORLD):
        got = torch.load(spawned / f"rank{rank}.pt", weights_only=True)
        torch.testing.assert_close(got["loss"], loss.detach(), rtol=1e-5, atol=1e-6)
        for name, g in got["grads"].items():
            ref = want[name].grad
            if ".experts." in name:  # this rank's experts: its slice of the whole layer's
                first = got["first"][int(name.split(".layers.")[1].split(".")[0])]
                ref = ref[first:first + g.shape[0]]
            torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-6, msg=f"rank {rank}: {name}")


def test_the_clip_norm_and_gathered_weights_are_the_whole_models(spawned):
    model = build_causal_lm("tiny-moe", seed=11)
    _loss(model, _batch()).backward()
    want = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    whole = dict(model.named_parameters())
    for rank in range(WORLD):
        got = torch.load(spawned / f"rank{rank}.pt", weights_only=True)
        assert abs(got["norm"] - float(want)) <= 1e-5 * float(want)
        assert set(got["full"]) == set(whole)
        for name, t in got["full"].items():
            torch.testing.assert_close(t, whole[name].detach(), rtol=0, atol=0, msg=name)


def test_forwards_of_different_counts_run_in_lockstep(spawned):
    model = build_causal_lm("tiny-moe", seed=11)
    with torch.no_grad():
        want = model(input_ids=_batch()[:3]).logits
    for rank in range(WORLD):
        got = torch.load(spawned / f"rank{rank}.pt", weights_only=True)["logits"]
        torch.testing.assert_close(got, want[:2 + rank % EP], rtol=1e-4, atol=1e-5)


def test_checkpoint_state_is_the_whole_models_and_restores(spawned):
    got = torch.load(spawned / "rank0.pt", weights_only=True)
    saved, restored = got["saved"], got["restored"]
    experts = [k for k in saved["model"] if ".experts." in k]
    assert experts and all(saved["model"][k].shape[0] == 8 for k in experts)  # every expert of the layer
    moments = [st["exp_avg"] for st in saved["optimizer"]["state"].values()]
    assert {m.shape[0] for m in moments if m.dim() == 3} == {8}
    for k, v in saved["model"].items():
        torch.testing.assert_close(restored["model"][k], v, rtol=0, atol=0, msg=k)
    for i, st in saved["optimizer"]["state"].items():
        for k, v in st.items():
            torch.testing.assert_close(restored["optimizer"]["state"][i][k], v, rtol=0, atol=0)


def test_every_rank_holds_half_of_each_layers_experts(spawned):
    firsts = [torch.load(spawned / f"rank{r}.pt", weights_only=True)["first"] for r in range(WORLD)]
    assert firsts == [[0, 0], [4, 4]] * 2  # tiny-moe: 2 MoE layers of 8 experts
