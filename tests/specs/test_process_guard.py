"""A guarded process's helpers die with it, even when it is SIGKILLed right after starting them
(the window in which a run's worker starts its vLLM engine)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hetprof.safety.process_guard import start_time

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="the guard reads /proc (Linux)")

# a worker that guards itself, starts a helper, reports the helper's pid and (if asked) dies at once
WORKER = """
import os, signal, subprocess, sys
from hetprof.safety.process_guard import guard_children
guard_children()
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(helper.pid, flush=True)
if sys.argv[1] == "die":
    os.kill(os.getpid(), signal.SIGKILL)
sys.stdin.read()
"""


def _gone(pid: int, within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s  # a generous bound: the guardian polls every 0.2 s
    while time.monotonic() < deadline:
        if start_time(pid) is None:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("how", ["die", "killed later"])
def test_a_killed_worker_takes_the_helpers_it_started_with_it(how):
    worker = subprocess.Popen([sys.executable, "-c", WORKER, how], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    helper = int(worker.stdout.readline())
    try:
        if how != "die":
            assert start_time(helper) is not None  # alive while its worker is
            worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        assert _gone(helper), "the helper outlived its worker"
    finally:
        if start_time(helper) is not None:
            os.kill(helper, signal.SIGKILL)
        worker.kill()
