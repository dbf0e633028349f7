"""Weight sync and tensor-dict messages across real gloo processes.

The trainer's weights must arrive on every generator bitwise, in several buckets and dtypes, over
a sub-group that leaves some ranks out (as the plan's sync edge does).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers.inprocess import spawn_ranks
from torch import nn

from hetprof.executor.parallel.weightsync import (
    WeightSync,
    copy_into,
    flatten_params,
    make_buckets,
    state_digest,
)
from hetprof.runtime.distributed import file_init_method, leave_process_group
from hetprof.safety.processes import skip_teardown_at_exit

pytestmark = pytest.mark.slow  # multi-process: `make test-fast` leaves it out

WORLD = 4
SYNC_RANKS = [0, 1, 3]  # rank 2 is on no sync edge, like an inference-only device


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 8))
    model[3].double()  # a second dtype: buckets are per dtype
    return model


def _worker(rank: int, init: str, out: str) -> None:
    """One spawn does every multi-process check (starting processes is the slow part)."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    _checks(rank, out)
    leave_process_group()
    skip_teardown_at_exit()  # no interpreter teardown of torch and transformers per process


def _checks(rank: int, out: str) -> None:
    group = dist.new_group(SYNC_RANKS)
    for wire, flat in ((None, False), ("bfloat16", False), (None, True)):
        _sync_rounds(rank, group, Path(out) / f"{wire}-{flat}", wire, flat)
    if rank < 2:
        _p2p(rank, out)


def _sync_rounds(rank: int, group, out: Path, wire: str | None, flat: bool) -> None:
    out.mkdir(exist_ok=True)
    model = _model(seed=rank)  # every rank starts different
    if flat:  # parameters as views of per-bucket buffers: the broadcast reads/writes them in place
        assert flatten_params(model, bucket_mb=0.001) > 2
    wire_dtype = getattr(torch, wire) if wire else None
    sync = WeightSync(group, 0, model.named_parameters(), bucket_mb=0.001, device="cpu", wire_dtype=wire_dtype)
    for version in (1, 2):
        if rank == 0:
            with torch.no_grad():  # the trainer moves on between syncs
                for p in model.parameters():
                    p.add_(torch.randn_like(p))
            sync.send(model.named_parameters(), version)
            got = version
        elif rank in SYNC_RANKS:
            if wire_dtype is not None:  # a generator computing in the wire dtype
                model = model.to(wire_dtype)
                sync = WeightSync(group, 0, model.named_parameters(), bucket_mb=0.001, wire_dtype=wire_dtype)
            _, got = sync.receive(copy_into(model), target=model)
        else:
            got = None
        torch.save({"state": {k: v.detach() for k, v in model.named_parameters()}, "version": got,
                    "buckets": len(sync.buckets)}, out / f"r{rank}-v{version}.pt")


@pytest.fixture(scope="module")
def spawned(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sync")
    spawn_ranks(_worker, (file_init_method(out), str(out)), WORLD)
    return out


@pytest.mark.parametrize("wire,flat", [(None, False), ("bfloat16", False), (None, True)])
def test_generators_hold_the_trainers_weights_bitwise_after_each_sync(spawned, wire, flat):
    tmp_path = spawned / f"{wire}-{flat}"
    for version in (1, 2):
        sender = torch.load(tmp_path / f"r0-v{version}.pt", weights_only=True)
        assert sender["buckets"] > 2  # a tiny bucket size forces several buckets
        for rank in (1, 3):
            got = torch.load(tmp_path / f"r{rank}-v{version}.pt", weights_only=True)
            assert got["version"] == version
            for name, tensor in sender["state"].items():
                expected = tensor.to(getattr(torch, wire)) if wire else tensor
                assert got["state"][name].dtype == expected.dtype
                assert torch.equal(got["state"][name], expected), f"rank {rank} {name} v{version}"
        outsider = torch.load(tmp_path / f"r2-v{version}.pt", weights_only=True)
        assert not torch.equal(outsider["state"]["1.weight"], sender["state"]["1.weight"])


def test_buckets_respect_the_size_bound_and_keep_dtypes_apart():
    model = _model(0)
    buckets = make_buckets(model.named_parameters(), bucket_bytes=2000)
    names = [n for b in buckets for n in b.names]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    for b in buckets:
        assert len({dict(model.named_parameters())[n].dtype for n in b.names}) == 1
        assert b.nbytes <= 2000 or len(b.names) == 1


def test_state_digest_sees_a_single_changed_bit():
    model = _model(0)
    before = state_digest(model.named_parameters())
    with torch.no_grad():
        w = model[1].weight
        w.view(-1)[0] = torch.nextafter(w.view(-1)[0], torch.tensor(1e9))
    assert state_digest(model.named_parameters()) != before


def _p2p(rank: int, out: str) -> None:
    from hetprof.executor.loop.messages import Outbox, recv_tensors

    if rank == 0:
        box = Outbox()
        for batch in range(3):  # several messages in flight before the receiver looks
            box.send({"ids": torch.arange(batch + 5).view(1, -1), "lp": torch.randn(2, 3, dtype=torch.float64),
                      "empty": torch.empty(0, 4)}, dst=1, tag=batch * 16 + 1, device=torch.device("cpu"))
        box.flush()
    else:
        got = [recv_tensors(0, batch * 16 + 1, torch.device("cpu")) for batch in (2, 0, 1)]
        torch.save(got, Path(out) / "got.pt")


def test_tensor_dicts_arrive_by_tag_with_dtypes_and_shapes(spawned):
    got = torch.load(spawned / "got.pt", weights_only=True)
    assert [g["ids"].shape[1] for g in got] == [7, 5, 6]
    assert all(g["lp"].dtype == torch.float64 and g["empty"].shape == (0, 4) for g in got)
