"""A `cpu` slot's process stays on its core: which core, when none, and that a block gives it back."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from hetprof.runtime import cpuslots

binds = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="the platform cannot bind threads to cores")


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {4, 5, 6, 7})


@binds
def test_each_slot_owns_the_core_of_its_index_among_the_usable_ones(four_cores):
    assert [cpuslots.binding_core(i, 4) for i in range(4)] == [4, 5, 6, 7]
    assert cpuslots.binding_core(1, 2) == 5


@binds
def test_more_slots_than_cores_stay_unbound(four_cores):
    # five slots on four cores share them: binding two to one core would leave another idle
    assert cpuslots.binding_core(0, 5) is None


@binds
def test_a_slot_outside_the_host_is_refused(four_cores):
    with pytest.raises(ValueError, match="slot index 2 is not one of the host's 2 slots"):
        cpuslots.binding_core(2, 2)


def test_slot_core_wraps_the_local_rank_onto_the_cores(four_cores, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert cpuslots.slot_core() == 5
    assert cpuslots.slot_core(2) == 6


@binds
def test_on_slot_core_binds_for_the_block_and_gives_the_cores_back():
    before = os.sched_getaffinity(0)
    with cpuslots.on_slot_core(0, 1) as core:
        assert core == min(before)
        assert os.sched_getaffinity(0) == {core}
    assert os.sched_getaffinity(0) == before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a per-thread nice value is Linux's")
def test_yield_to_work_lowers_only_the_calling_thread():
    seen = {}

    def helper():
        cpuslots.yield_to_work()
        seen["helper"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    thread = threading.Thread(target=helper)
    thread.start()
    thread.join()
    assert seen["helper"] == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before  # the working thread keeps its own
