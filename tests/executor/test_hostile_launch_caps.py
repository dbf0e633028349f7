"""Plans within what the launcher and this host can hold (issue 37): the support check is linear in
the plan's devices, and a plan that oversubscribes the host's cores or memory is refused up front."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetprof.errors import HetprofError
from hetprof.executor.launch import checks as launch_checks
from hetprof.executor.launch.checks import check_host_capacity, check_supported
from hetprof.executor.launch.handwritten_plan import handwritten_plan
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.specs.cluster import ClusterSpec as Cluster

ROOT = Path(__file__).resolve().parents[2]


def _plan(slots: int, workload: dict | None = None):
    cluster = ClusterSpec.from_dict({"name": "c", "hosts": [{"name": "h", "gpus": {"type": "cpu", "count": slots}}]})
    base = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    base.update({"prompts_per_step": 8, "responses_per_prompt": 2, **(workload or {})})
    devices = [d.id for d in cluster.devices()]
    half = slots // 2
    return handwritten_plan(cluster, base, {"actor_gen": devices[:half], "ref_infer": devices[half:],
                                            "actor_train": devices[half:]})


def test_the_support_check_expands_the_cluster_a_bounded_number_of_times(monkeypatch):
    plan = _plan(512)
    calls = []
    real = Cluster.devices

    def counted(self):
        calls.append(1)
        return real(self)

    monkeypatch.setattr(Cluster, "devices", counted)
    assert check_supported(plan) == "gloo"
    assert len(calls) <= 4  # was one expansion per planned device: quadratic (240 s at 8,192 replicas)


def test_more_cpu_slots_than_cores_can_share_is_refused_up_front():
    plan = _plan(16)
    check_host_capacity(plan, "h", cores=4, available=1 << 40)
    with pytest.raises(HetprofError, match="16 cpu-slot workers on host h, which has 2 usable cores") as err:
        check_host_capacity(plan, "h", cores=2, available=1 << 40)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)


def test_more_memory_than_the_host_has_is_refused_up_front(monkeypatch):
    monkeypatch.setattr(launch_checks, "_own_resident_bytes", lambda: 300 << 20)
    plan = _plan(4)
    check_host_capacity(plan, "h", cores=4, available=2 << 30)
    with pytest.raises(HetprofError, match=r"4 workers on host h need at least 1\.2 GiB.*0\.5 GiB") as err:
        check_host_capacity(plan, "h", cores=4, available=512 << 20)
    assert err.value.exit_code == 2
