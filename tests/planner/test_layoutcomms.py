"""The learner's own all-reduces, priced by hand (planner/layoutcomms.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hetprof.costmodels import LinkSpec, comm
from hetprof.planner.layoutcomms import learner_collectives


class _Links:
    def __init__(self, link: LinkSpec) -> None:
        self.link = link

    def slowest(self, hosts):
        return self.link if len(set(hosts)) > 1 else None

    def between(self, a, b):
        return self.link


def _costs(budget: int | None, hosts: tuple[str, ...]) -> SimpleNamespace:
    workload = SimpleNamespace(ppo_epochs=2, mini_batches=4,
                               training=SimpleNamespace(max_tokens_per_microbatch=budget))
    devices = {f"d{i}": SimpleNamespace(host=h) for i, h in enumerate(hosts)}
    return SimpleNamespace(workload=workload, devices=devices, links=_Links(LinkSpec(alpha_s=1e-4, beta_Bps=1e9)),
                           cm=SimpleNamespace(collective_time=lambda op, size, n, link: comm.collective_time(
                               op, size, n, link.alpha_s, link.beta_Bps)))


def _layout(dp: int) -> SimpleNamespace:
    return SimpleNamespace(dp=dp, devices=lambda: [f"d{i}" for i in range(dp)])


def test_learner_collectives_are_one_denominator_and_one_pack_count_all_reduce_an_update():
    # 2 epochs x 4 mini-batches = 8 values; a 2-rank ring all-reduce takes 2 steps of α and moves
    # the message once: denominators 2e-4 + 32 B / 1 GB/s, pack counts 2e-4 + 64 B / 1 GB/s
    packed = learner_collectives(_costs(512, ("a", "b")), _layout(2))
    assert packed == pytest.approx(2e-4 + 32e-9 + 2e-4 + 64e-9)
    assert learner_collectives(_costs(None, ("a", "b")), _layout(2)) == pytest.approx(2e-4 + 32e-9)  # padded
    assert learner_collectives(_costs(512, ("a",)), _layout(1)) == 0.0  # one replica: no collective
