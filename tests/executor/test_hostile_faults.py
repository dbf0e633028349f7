"""Faults end the run (issue 37): a worker armed with die_with_parent ends when its launcher is
SIGKILLed (which runs no clean-up), instead of training on as an orphan."""

from __future__ import annotations

import subprocess
import sys
import time

from hetprof.safety.process_guard import proc_stat

CHILD = ("import os, sys, time\n"
         "from hetprof.safety.processes import die_with_parent\n"
         "assert die_with_parent()\n"
         "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
         "time.sleep(120)\n")
PARENT = ("import subprocess, sys, time\n"
          "subprocess.Popen([sys.executable, '-c', sys.argv[2], sys.argv[1]])\n"
          "time.sleep(120)\n")


def _alive(pid: int) -> bool:
    fields = proc_stat(pid)
    return fields is not None and fields[0] != "Z"


def test_a_worker_ends_within_seconds_of_its_launcher_being_killed(tmp_path):
    pidfile = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(pidfile), CHILD])
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.is_file() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pidfile.read_text())
        assert _alive(child)
    finally:
        parent.kill()  # SIGKILL: the launcher runs no clean-up
        parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the child outlived its killed parent by 10 s"


def test_a_stopped_descendant_is_killed_after_the_timeout():
    import os
    import signal

    from hetprof.safety.process_guard import stopped_descendants_killed

    # a grandchild, as a worker forked by the launcher's forkserver is
    middle = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
                               "print(p.pid, flush=True)\ntime.sleep(120)\n"], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(middle.stdout.readline())
        started = time.monotonic()
        with stopped_descendants_killed(limit_s=1.0, poll_s=0.1):
            os.kill(worker, signal.SIGSTOP)
            while _alive(worker) and time.monotonic() - started < 15:
                time.sleep(0.1)
        assert not _alive(worker), "a worker stopped past the timeout was left stopped"
        assert time.monotonic() - started < 11  # --timeout (here 1 s) + 10 s
        assert middle.poll() is None  # running processes are left alone
    finally:
        middle.kill()
        middle.wait()


WORKER = ("import os, sys, time\n"
          "from hetprof.safety.process_guard import die_with_launcher\n"
          "assert die_with_launcher()\n"
          "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
          "time.sleep(120)\n")
FORKSERVER = ("import subprocess, sys, time\n"  # stands between, and outlives the launcher, as a forkserver does
              "subprocess.Popen([sys.executable, '-c', sys.argv[2], sys.argv[1]])\n"
              "print(flush=True)\ntime.sleep(120)\n")
LAUNCHER = ("import subprocess, sys, time\n"
            "from hetprof.safety.process_guard import workers_die_with_me\n"
            "with workers_die_with_me():\n"
            "    subprocess.Popen([sys.executable, '-c', sys.argv[3], sys.argv[1], sys.argv[2]], start_new_session=True)\n"
            "time.sleep(120)\n")


def test_a_worker_behind_a_forkserver_ends_when_its_launcher_is_killed(tmp_path):
    pidfile = tmp_path / "worker.pid"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(pidfile), WORKER, FORKSERVER])
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.is_file() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        worker = int(pidfile.read_text())
        middle = int(proc_stat(worker)[1])
        assert _alive(worker) and middle != launcher.pid
    finally:
        launcher.kill()
        launcher.wait()
    try:
        deadline = time.monotonic() + 10
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker), "the worker outlived its killed launcher by 10 s"
    finally:
        import os
        import signal

        if _alive(middle):
            os.kill(middle, signal.SIGKILL)
