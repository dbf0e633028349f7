"""`hetprof` commands run inside the test process, for end-to-end runs that need no process of their own.

A separate `hetprof run` imports torch and the CLI, then starts a worker server that imports torch
and transformers again: seconds of CPU before the first worker exists. Inside the test process those
imports are done once, and multiprocessing keeps one worker server per process, so every later run
on the same pytest worker forks its workers at once. The command, its options, the launcher and the
workers are the same code; tests that signal the launcher or read what the user's terminal shows
(killed or hung workers, warnings on stderr, two hosts) keep a process of their own.

`spawn_ranks` starts a test's own gloo ranks from that same server, for the same reason. A command
run here leaves the test process as it found it: its signal handlers and torch's thread count.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from multiprocessing import forkserver
from pathlib import Path

from click.testing import CliRunner

from hetprof.safety.process_guard import descendants

# torch's launcher installs its own handlers for these and leaves them; the test process gets its own back
HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


@contextlib.contextmanager
def _workers_killed_after(timeout_s: float) -> Iterator[None]:
    """Past `timeout_s`, SIGKILL every process below this one: the launcher then sees its workers die
    and the command returns failing, where a hung run would hold the test process forever."""
    fired = threading.Event()

    def kill() -> None:
        fired.set()
        for pid in descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    timer = threading.Timer(timeout_s, kill)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
    assert not fired.is_set(), f"the command ran past {timeout_s:.0f} s and its workers were killed"


def spawn_ranks(fn: Callable, args: tuple, nprocs: int) -> None:
    """`torch.multiprocessing.spawn(fn, args, nprocs)`, forked from the worker server `hetprof run`
    uses (started as the launcher starts it, if no run has yet): `fn(rank, *args)` in each process,
    and any rank's exception raised here."""
    import torch.multiprocessing as mp

    from hetprof.executor.launch.elastic import worker_server

    with worker_server(cpu=True):
        forkserver.ensure_running()
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


def hetprof_here(args: list[str], cwd: Path, timeout_s: float = 150) -> subprocess.CompletedProcess:
    """`hetprof ARGS` run in this process from `cwd`, as a CompletedProcess (exit status, stdout, stderr)."""
    import torch

    from hetprof.cli import cli

    handlers = {s: signal.getsignal(s) for s in HANDLED}
    threads = torch.get_num_threads()  # `hetprof profile` sets its own
    try:
        with contextlib.chdir(cwd), _workers_killed_after(timeout_s):
            result = CliRunner().invoke(cli, args, catch_exceptions=False)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess(["hetprof", *args], result.exit_code, result.stdout, result.stderr)
