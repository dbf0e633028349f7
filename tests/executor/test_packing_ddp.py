"""Packed token-budget micro-batches across two data-parallel replicas with uneven shares give the
single-process padded update: the replicas agree on a micro-batch count, and the loss denominators
stay global."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from helpers.inprocess import spawn_ranks
from helpers.packing_batches import ragged_batch

from hetprof.executor.algorithms import RLBatch, get_algorithm
from hetprof.executor.algorithms.learner import Learner
from hetprof.executor.models.modeling import build_causal_lm
from hetprof.runtime.distributed import file_init_method, leave_process_group
from hetprof.safety.processes import skip_teardown_at_exit

pytestmark = pytest.mark.usefixtures("one_thread")

# Rank 0 holds six short sequences (78 tokens: one pack of 80), rank 1 the two longest (43 + 64
# tokens: two packs); the agreed count of two makes rank 0 split its pack.
SHARES = [[1, 2, 3, 5, 6, 7], [0, 4]]
BUDGET = 80


def _grads(model: torch.nn.Module, batch: RLBatch, **kwargs) -> list[torch.Tensor]:
    learner = Learner(model, torch.optim.SGD(model.parameters(), lr=0.0),
                      get_algorithm("grpo")(kl_coef=0.1, clip_eps=0.1), max_grad_norm=None, **kwargs)
    learner.update(batch)
    return [p.grad.detach().clone() for p in model.parameters()]


def _worker(rank: int, world: int, init: str, path: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.set_num_threads(1)
    full = RLBatch(**torch.load(path + ".batch", weights_only=True), group_size=2)
    mine = full.select(torch.tensor(SHARES[rank]))
    ddp = torch.nn.parallel.DistributedDataParallel(build_causal_lm("tiny", seed=0))
    grads = _grads(ddp, mine, max_tokens_per_microbatch=BUDGET)
    if rank == 0:
        torch.save(grads, path + ".out")
    del ddp
    leave_process_group()
    skip_teardown_at_exit()  # no interpreter teardown of torch and transformers per process


@pytest.mark.slow
def test_packed_ddp_with_uneven_shares_equals_the_single_process_padded_update(tmp_path):
    batch = ragged_batch()
    get_algorithm("grpo")().advantages(batch)
    fields = {k: v for k, v in vars(batch).items() if isinstance(v, torch.Tensor)}
    path = str(tmp_path / "packed")
    torch.save(fields, path + ".batch")
    spawn_ranks(_worker, (2, file_init_method(tmp_path), path), 2)
    distributed = torch.load(path + ".out", weights_only=True)
    single = _grads(build_causal_lm("tiny", seed=0), copy.deepcopy(batch))
    for a, b in zip(single, distributed, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4), float((a - b).abs().max())
