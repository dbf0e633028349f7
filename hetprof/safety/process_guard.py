"""Helper processes that cannot outlive the process that started them, however it dies.

A run's worker starts a vLLM engine: processes of vLLM's own, started by vLLM, over tens of seconds
on CPU. A worker killed in that time (SIGKILL runs no clean-up) would leave them running, holding
cores and memory. `guard_children()`, called before they start, closes that window: it makes the
caller the leader of a new process group — every process started after it inherits the group,
from its first instruction, whatever starts it — and starts a guardian in a session of its own that
waits for the caller to die and then kills the whole group. Membership is given at creation, so no
helper can escape between its start and a watch being set up; the kernel does not hand out a
process group's id as a new pid while a member lives, so the guardian's kill reaches only the group.

Run as a program (`python -m hetprof.safety.process_guard PID START`), this module is the guardian.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

from hetprof.safety.processes import child_env, python_argv, safe_cwd

POLL_S = 0.2
PATROL_S = 1.0  # stopped workers: one pass over /proc a second costs the cores the workers use next to nothing


def proc_stat(pid: int) -> list[str] | None:
    """The fields of `/proc/PID/stat` after the command name (state first; None: gone or not Linux).
    Split after the last ')' because the command name may itself hold spaces and parentheses."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot; None: gone, a zombie, or not Linux),
    which tells a process apart from a later one given the same pid."""
    fields = proc_stat(pid)
    return None if fields is None or fields[0] == "Z" else int(fields[19])


def guard_children() -> subprocess.Popen | None:
    """Put this process in a process group of its own and start a guardian that kills the group
    once this process is gone; call it before starting the processes to guard. None where the
    guard cannot work (no /proc: not Linux)."""
    me = os.getpid()
    started = start_time(me)
    if started is None:
        return None
    if os.getpgid(0) != me:
        os.setpgid(0, 0)
    # started like every hetprof helper (hetprof/safety/processes.py): no current folder on its path
    return subprocess.Popen(python_argv("-m", "hetprof.safety.process_guard", str(me), str(started)), cwd=safe_cwd(),
                            env=child_env(), start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL)


def descendants(root: int) -> list[int]:
    """Every live process below `root` (children, their children, ...), from one pass over /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit() and (fields := proc_stat(int(entry))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


@contextlib.contextmanager
def stopped_descendants_killed(limit_s: float, poll_s: float = PATROL_S) -> Iterator[set[int]]:
    """While the block runs, SIGKILL any descendant of this process that stays stopped (SIGSTOP, a
    debugger) past `limit_s`: its peers would wait in a collective that no timeout of theirs ends,
    while a killed worker is seen by the launcher at once and the run ends naming it. Yields the set
    of pids it killed, so the report can say why they died."""
    done = threading.Event()
    me = os.getpid()
    killed: set[int] = set()

    def patrol() -> None:
        since: dict[tuple[int, int], float] = {}  # (pid, start time) -> first seen stopped
        while not done.wait(poll_s):
            now, seen = time.monotonic(), set()
            for pid in descendants(me):
                fields = proc_stat(pid)
                if fields is None or fields[0] not in ("T", "t"):
                    continue
                key = (pid, int(fields[19]))
                seen.add(key)
                if now - since.setdefault(key, now) > limit_s:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                        killed.add(pid)
            since = {k: v for k, v in since.items() if k in seen}

    thread = threading.Thread(target=patrol, name="hetprof-stopped-workers", daemon=True)
    thread.start()
    try:
        yield killed
    finally:
        done.set()
        thread.join()


LAUNCHER_ENV = "HETPROF_LAUNCHER"  # "PID:START_TIME" of the process whose workers must not outlive it


@contextlib.contextmanager
def workers_die_with_me() -> Iterator[None]:
    """While the block runs, processes started below this one (through any forkserver: multiprocessing's
    keeps running while any child holds its pipe, so a parent-death signal never reaches them) find
    this process in LAUNCHER_ENV; `die_with_launcher()` in each makes it end once this process is gone."""
    me = os.getpid()
    before = os.environ.get(LAUNCHER_ENV)
    os.environ[LAUNCHER_ENV] = f"{me}:{start_time(me)}"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(LAUNCHER_ENV, None)
        else:
            os.environ[LAUNCHER_ENV] = before


def die_with_launcher() -> bool:
    """End this process (SIGKILL: a dead launcher cannot collect anything) within POLL_S of the
    process LAUNCHER_ENV names being gone; whether a launcher was named. A watcher thread polls it."""
    pid, _, started = os.environ.get(LAUNCHER_ENV, "").partition(":")
    if not (pid.isdigit() and started.isdigit()):
        return False

    def watcher() -> None:
        while start_time(int(pid)) == int(started):
            time.sleep(POLL_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watcher, name="hetprof-launcher-watch", daemon=True).start()
    return True


def watch(pid: int, started: int) -> None:
    """Wait until `pid` (started at `started`) has died, then kill its process group."""
    while start_time(pid) == started:
        time.sleep(POLL_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


if __name__ == "__main__":
    if len(sys.argv) != 3 or not all(a.isdigit() for a in sys.argv[1:]):
        sys.exit("usage: python -m hetprof.safety.process_guard PID START_TIME")
    watch(int(sys.argv[1]), int(sys.argv[2]))
