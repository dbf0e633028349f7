"""Expert parallelism over 2 gloo ranks (executor/parallel/experts.py) against one rank: the tiny
Qwen3-MoE's loss and every gradient equal, to rounding.

One spawn runs both ranks; each takes half of a batch (data parallelism), holds half of every MoE
layer's experts and exchanges tokens with the other rank in the layers' all-to-alls.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers.inprocess import spawn_ranks

from hetprof.executor.models.modeling import build_causal_lm
from hetprof.executor.parallel.experts import average_expert_grads, shard_experts
from hetprof.runtime.distributed import file_init_method, leave_process_group
from hetprof.safety.processes import skip_teardown_at_exit

WORLD = 2
SEQUENCES, LENGTH = 4, 12


def _batch() -> torch.Tensor:
    return torch.randint(0, 64, (SEQUENCES, LENGTH), generator=torch.Generator().manual_seed(3))


def _loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (every row the same length, so halves' means average to the whole's)."""
    logits = model(input_ids=ids).logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _worker(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    model = build_causal_lm("tiny-moe", seed=11)
    shards = shard_experts(model)
    half = SEQUENCES // WORLD
    loss = _loss(model, _batch()[rank * half:(rank + 1) * half])
    loss.backward()
    average_expert_grads(shards)
    expert = {id(p) for s in shards for p in s.parameters()}
    grads = {}
    for name, p in model.named_parameters():
        g = p.grad.clone()
        if id(p) not in expert:  # data parallelism averages what every rank holds whole
            dist.all_reduce(g)
            g /= WORLD
        grads[name] = g
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    torch.save({"loss": mean / WORLD, "grads": grads, "first": [s.first for s in shards]},
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


def test_every_rank_holds_half_of_each_layers_experts(spawned):
    firsts = [torch.load(spawned / f"rank{r}.pt", weights_only=True)["first"] for r in range(WORLD)]
    assert firsts == [[0, 0], [4, 4]]  # tiny-moe: 2 MoE layers of 8 experts
