"""Links: the α–β fit on its own, and the real two-host test through torchrun's rendezvous.

The two hosts are network namespaces joined by a veth pair shaped with tc tbf; each runs
`hetprof profile --suite link` exactly as a user would on two machines.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.commands import rendezvous_port

from hetprof.errors import ExecutionError
from hetprof.profiler import testbed
from hetprof.profiler.link_worker import pairs, sweep_sizes
from hetprof.profiler.linkfit import fit_alpha_beta
from hetprof.profiles import ProfileDB

HETPROF = [str(Path(sys.executable).parent / "hetprof")]


def test_fit_recovers_alpha_and_beta_from_noisy_samples():
    rng = np.random.default_rng(0)
    sizes = np.repeat([1e5, 3e5, 1e6, 3e6, 1e7], 5)
    t = (2e-3 + sizes / 1.25e8) * rng.normal(1.0, 0.02, sizes.size)
    fit = fit_alpha_beta(sizes.tolist(), t.tolist())
    assert fit.beta_Bps == pytest.approx(1.25e8, rel=0.03)
    assert fit.alpha_s == pytest.approx(2e-3, rel=0.3)
    assert 0.005 < fit.residual < 0.05
    assert fit.n == sizes.size


def test_fit_ignores_a_straggler():
    sizes = [1e5, 1e5, 1e5, 1e6, 1e6, 1e6, 4e6, 4e6, 4e6]
    t = [1e-3 + x / 1e7 for x in sizes]
    t[-1] *= 3  # one descheduled sample at the largest size
    fit = fit_alpha_beta(sizes, t)
    assert fit.beta_Bps == pytest.approx(1e7, rel=0.01)
    assert fit.residual > 0.1  # but the residual still tells that the samples scattered


def test_fit_floors_a_negative_intercept_but_keeps_it():
    sizes = [1e5, 2e5, 4e5, 8e5]
    fit = fit_alpha_beta(sizes, [s / 1e7 - 1e-3 for s in sizes])
    assert fit.alpha_s == 0.0 and fit.alpha_fit == pytest.approx(-1e-3)
    assert fit.beta_Bps == pytest.approx(1e7)


def test_fit_refuses_what_cannot_show_a_bandwidth():
    with pytest.raises(ExecutionError, match="two or more message sizes"):
        fit_alpha_beta([1e6, 1e6], [0.1, 0.1])
    with pytest.raises(ExecutionError, match="does not grow"):
        fit_alpha_beta([1e3, 1e6], [0.2, 0.1])


def test_sweep_sizes_span_the_target_time():
    sizes = sweep_sizes(1e7, 0.4, 6, 65536)
    assert len(sizes) == 6 and sizes == sorted(sizes)
    assert sizes[-1] == pytest.approx(4e6, rel=0.01)
    assert sizes[0] == pytest.approx(4e6 / 16, rel=0.01)


def test_pairs_every_host_pair_or_one_per_region_pair():
    hosts = [{"host": "a", "region": "eu"}, {"host": "b", "region": "eu"}, {"host": "c", "region": "us"},
             {"host": "d", "region": "us"}]
    assert len(pairs(hosts, per_region=False)) == 6
    assert pairs(hosts, per_region=True) == [(0, 1), (0, 2), (2, 3)]  # eu-eu, eu-us, us-us


def test_link_without_rendezvous_is_a_clear_error(tmp_path):
    done = subprocess.run([*HETPROF, "--db", str(tmp_path / "p.db"), "profile", "--suite", "link"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--rdzv" in done.stderr and "Traceback" not in done.stderr


usable, why = testbed.available()


def _start_link_pair(pair: testbed.ShapedPair, db: Path, rate: int) -> list[subprocess.Popen]:
    port = rendezvous_port()
    procs = []
    for side in (0, 1):
        cmd = [*HETPROF, "--db", str(db), "profile", "--suite", "link", "--quick", "--nnodes", "2",
               "--node-rank", str(side), "--rdzv", f"{pair.addr[0]}:{port}", "--rdzv-id", f"t{rate}",
               "--host", f"host{side}-{rate}", "--region", f"region{side}"]
        procs.append(subprocess.Popen(pair.argv(side, cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    return procs


@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.skipif(not usable, reason=f"two-host link test: {why}")
def test_two_namespaces_shaped_by_tbf_fit_beta_within_10_percent(tmp_path):
    db = tmp_path / "links.db"
    names_before = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    rates = (50, 200)
    with contextlib.ExitStack() as stack:
        # two independent host pairs, one per rate, measured at the same time
        pairs_ = [stack.enter_context(testbed.shaped_pair(rate, tag=f"t{i}")) for i, rate in enumerate(rates)]
        procs = [p for pair, rate in zip(pairs_, rates, strict=True) for p in _start_link_pair(pair, db, rate)]
        for p in procs:
            out, _ = p.communicate(timeout=170)
            assert p.returncode == 0, out[-2000:]
    with ProfileDB(db) as pdb:
        all_links, all_raw = pdb.links(), pdb.samples("link.p2p")
    for rate in rates:
        links = all_links[all_links["src_host"].str.endswith(f"-{rate}")]
        assert len(links) == 2, links  # both directions, each recorded by its sender
        assert set(links["src_region"]) == {"region0", "region1"}
        for beta in links["beta_Bps"]:
            assert beta == pytest.approx(rate * 1e6 / 8, rel=0.10), (rate, beta * 8 / 1e6)
        raw = all_raw[all_raw["src_host"].str.endswith(f"-{rate}")]
        assert raw["size_bytes"].nunique() >= 4 and len(raw) >= 2 * 12
    names_after = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    # only this process's namespaces: another test run on the machine may hold its own meanwhile
    ours = {f"hpt{i}{os.getpid()}{end}" for i in range(len(rates)) for end in "ab"}  # testbed's names
    assert not (names_after - names_before) & ours, "namespaces left behind"


@pytest.mark.netns
@pytest.mark.skipif(not usable, reason=f"namespace cleanup test: {why}")
def test_namespaces_are_removed_when_the_body_fails():
    with pytest.raises(RuntimeError, match="boom"), testbed.shaped_pair(100, tag="f") as pair:
        names = pair.ns
        raise RuntimeError("boom")
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in names)


@pytest.mark.slow
def test_three_hosts_per_region_measure_one_pair_per_region_pair(tmp_path):
    """Three hosts on loopback under one rendezvous: eu, eu, us -> the eu-eu and one eu-us pair."""
    db, port = tmp_path / "p.db", rendezvous_port()
    regions = ("eu", "eu", "us")
    procs = [subprocess.Popen([*HETPROF, "--db", str(db), "profile", "--suite", "link", "--quick", "--nnodes", "3",
                               "--node-rank", str(r), "--rdzv", f"127.0.0.1:{port}", "--rdzv-id", "three",
                               "--host", f"n{r}", "--region", regions[r], "--per-region",
                               "--link-target-s", "0.05"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(3)]
    for p in procs:
        out, _ = p.communicate(timeout=170)
        assert p.returncode == 0, out[-2000:]
    with ProfileDB(db) as pdb:
        links = pdb.links()
    assert len(links) == 4  # two unordered pairs, both directions, each recorded once by its sender
    assert sorted(tuple(sorted(x)) for x in zip(links.src_region, links.dst_region, strict=True)) == [
        ("eu", "eu"), ("eu", "eu"), ("eu", "us"), ("eu", "us")]
    assert (links["beta_Bps"] > 0).all() and links["residual"].notna().all()
