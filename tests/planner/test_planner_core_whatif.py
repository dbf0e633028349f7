"""What-if edits of a cluster: parsing, the changed fleet, and clear errors for bad edits."""

from __future__ import annotations

import pytest

from hetprof.errors import SpecError
from hetprof.planner.whatif import apply_what_if
from hetprof.specs import ClusterSpec


@pytest.fixture
def cluster() -> ClusterSpec:
    return ClusterSpec.from_dict({"name": "fleet", "hosts": [
        {"name": "a100", "gpus": {"type": "A100-40GB", "count": 8}, "region": "us-east", "count": 2},
        {"name": "l4", "gpus": {"type": "L4", "count": 8}, "region": "eu-west", "count": 2}],
        "network": {"inter_region": {"latency": "10ms", "bandwidth": "5Gbps"},
                    "links": [{"between": ["eu-west", "us-east"], "latency": "20ms", "bandwidth": "2Gbps"}]}})


def test_add_gpus_in_a_region(cluster):
    out = apply_what_if(cluster, "add 12xH100@us-east")
    assert out.gpu_counts()["H100-SXM"] == 12
    added = [h for h in out.expanded_hosts() if h.gpus.type == "H100-SXM"]
    assert [h.gpus.count for h in added] == [8, 4] and {h.region for h in added} == {"us-east"}
    assert cluster.gpu_counts().get("H100-SXM") is None  # the input is untouched
    spread = apply_what_if(cluster, "add 8×L40S@ap-south per-host 2")
    assert [h.gpus.count for h in spread.expanded_hosts() if h.gpus.type == "L40S"] == [2, 2, 2, 2]
    twice = apply_what_if(apply_what_if(cluster, "add 8xL4@us-east"), "add 8xL4@us-east")
    assert len(set(twice.host_names())) == len(twice.host_names())


def test_remove_gpus_takes_from_the_last_hosts(cluster):
    out = apply_what_if(cluster, "remove 4xL4")
    assert out.gpu_counts() == {"A100-40GB": 16, "L4": 12}
    assert [h.gpus.count for h in out.expanded_hosts() if h.gpus.type == "L4"] == [8, 4]
    gone = apply_what_if(cluster, "remove 16xL4")
    assert "L4" not in gone.gpu_counts()
    assert all("eu-west" not in link.between for link in gone.network.links)  # dangling link dropped
    regional = apply_what_if(cluster, "remove 8xA100@us-east")
    assert regional.gpu_counts()["A100-40GB"] == 8


def test_link_edit_replaces_or_adds(cluster):
    out = apply_what_if(cluster, "link us-east:eu-west 5ms 25Gbps")
    (link,) = out.network.links
    assert set(link.between) == {"us-east", "eu-west"} and link.params.beta_Bps == 25e9 / 8
    assert out.link_between("a100-0", "l4-1").alpha_s == pytest.approx(5e-3)
    hosts = apply_what_if(cluster, "link a100-0:l4-0 1ms 100Gbps; add 8xH100@us-east")
    assert len(hosts.network.links) == 2 and hosts.gpu_counts()["H100-SXM"] == 8


@pytest.mark.parametrize("edit, phrase", [
    ("remove 40xL4", "at most 16 L4"),
    ("remove 1xL4@us-east", "at most 0 L4"),
    ("add 8xWARP9@us-east", "known GPU type"),
    ("link mars:us-east 1ms 1Gbps", "region or host names"),
    ("link us-east:eu-west fast 1Gbps", "latency like 10ms"),
    ("make it faster", "add N×TYPE@REGION"),
    ("", "add N×TYPE@REGION"),
    ("remove 16xA100; remove 16xL4", "at least one GPU"),
])
def test_bad_edits_say_what_is_expected(cluster, edit, phrase):
    with pytest.raises(SpecError, match=phrase):
        apply_what_if(cluster, edit)
