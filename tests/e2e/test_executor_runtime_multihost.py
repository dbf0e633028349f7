"""A two-host run: two network namespaces joined by a veth pair, one `hetprof run` in each.

The hosts meet through torch's elastic c10d rendezvous on node 0's address and then talk gloo
over the veth link only; the plan puts generation on one host and training on the other, so the
rollouts and the weight sync really cross the link. Namespaces and addresses are private to the
test and removed afterwards, also when it fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from helpers.commands import rendezvous_port

from hetprof.executor.launch.handwritten_plan import handwritten_plan
from hetprof.executor.records.run_log import read_log
from hetprof.specs import WorkloadSpec

pytestmark = pytest.mark.slow  # multi-process: `make test-fast` leaves it out

ROOT = Path(__file__).resolve().parents[2]
HETPROF = str(Path(sys.executable).with_name("hetprof"))


def _netns_ok() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "needs root for ip netns"
    probe = f"hpprobe{uuid.uuid4().hex[:6]}"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        return False, "ip netns add is not permitted here"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True, ""


OK, WHY = _netns_ok()


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def two_hosts():
    """(ns_a, ns_b, addr_a, addr_b, if_a, if_b); everything is deleted on the way out."""
    tag = uuid.uuid4().hex[:6]
    ns = (f"hpa{tag}", f"hpb{tag}")
    ifs = (f"hva{tag}", f"hvb{tag}")
    octet = int(tag[:2], 16) % 250 + 1
    addrs = (f"10.213.{octet}.1", f"10.213.{octet}.2")
    try:
        for n in ns:
            ip("netns", "add", n)
        ip("link", "add", ifs[0], "type", "veth", "peer", "name", ifs[1])
        for n, i, a in zip(ns, ifs, addrs, strict=True):
            ip("link", "set", i, "netns", n)
            ip("-n", n, "addr", "add", f"{a}/24", "dev", i)
            ip("-n", n, "link", "set", i, "up")
            ip("-n", n, "link", "set", "lo", "up")
        yield ns, addrs, ifs
    finally:
        for n in ns:  # deleting a namespace deletes its end of the veth pair, and the pair with it
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
        subprocess.run(["ip", "link", "del", ifs[0]], capture_output=True)


@pytest.mark.skipif(not OK, reason=WHY)
def test_two_hosts_meet_by_rendezvous_and_complete_an_iteration(tmp_path, two_hosts):
    ns, addrs, ifs = two_hosts
    cluster = {"name": "two", "hosts": [{"name": "hosta", "gpus": {"type": "cpu", "count": 1}, "address": addrs[0]},
                                        {"name": "hostb", "gpus": {"type": "cpu", "count": 1}, "address": addrs[1]}]}
    workload = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    workload.update({"prompts_per_step": 4, "responses_per_prompt": 4})
    plan = handwritten_plan(cluster, workload, {"actor_gen": ["hosta:0"], "ref_infer": ["hostb:0"],
                                           "actor_train": ["hostb:0"]})
    plan.save(tmp_path / "plan.json")
    port = rendezvous_port()
    procs = []
    for rank in (0, 1):
        cmd = ["ip", "netns", "exec", ns[rank], "env", f"GLOO_SOCKET_IFNAME={ifs[rank]}", HETPROF,
               "--db", str(tmp_path / f"db{rank}.sqlite"), "run", str(tmp_path / "plan.json"),
               "--iterations", "2", "--nnodes", "2", "--node-rank", str(rank), "--rdzv", f"{addrs[0]}:{port}",
               "--log", str(tmp_path / f"run{rank}.jsonl"), "--timeout", "60", "--verify-sync"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=170))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    # the leader (actor_train's first replica) sits on host b: its node writes the log
    records = read_log(tmp_path / "run1.jsonl")
    assert [r["iteration"] for r in records] == [0, 1]
    assert records[0]["devices"]["actor_gen"] == ["hosta:0"]
    assert records[0]["devices"]["actor_train"] == ["hostb:0"]
    assert all(r["sync_verified"] is True and r["sync_bytes"] > 0 for r in records)
    assert not (tmp_path / "run0.jsonl").exists()
