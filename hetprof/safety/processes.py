"""Starting child Python processes so that files in the current folder cannot run in them.

`python -c …` (how multiprocessing's spawn, its resource tracker and torch's elastic workers start)
puts the current folder first on `sys.path`: a `json.py` or `selectors.py` lying next to a shared
database or plan would be imported in place of the standard module. Every start-up path of hetprof
goes through this module: commands it builds itself get `-P` and a safe working directory; start-ups
that others build (multiprocessing, torch) run inside `isolated_children`, whose PYTHONSAFEPATH=1
the children inherit — the same rule as `-P`.

It also turns SIGTERM and SIGHUP into an ordinary exit while a command holds scratch files or
helpers, so its `finally` blocks and `atexit` handlers clean up on a kill as on Ctrl-C.

And a worker process that finished its work can end without the interpreter's module teardown
(`skip_teardown_at_exit`): with torch and transformers loaded that teardown costs seconds of CPU per
process, times the workers of a host, and has nothing left to do.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

SAFE_PATH_ENV = "PYTHONSAFEPATH"


def python_argv(*args: str) -> list[str]:
    """This interpreter with `-P` (no script or current folder on sys.path), then `args`.

    Before Python 3.11 there is no `-P`; `-I` (isolated: also ignores PYTHON* variables and the user's
    site folder) keeps the current folder off the path there.
    """
    return [sys.executable, "-P" if sys.version_info >= (3, 11) else "-I", *args]


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with PYTHONSAFEPATH=1 and PYTHONPATH kept to
    absolute folders: an empty or relative entry would put the child's working folder back on the path."""
    env = dict(os.environ if base is None else base)
    env[SAFE_PATH_ENV] = "1"
    if "PYTHONPATH" in env:
        kept = [p for p in env["PYTHONPATH"].split(os.pathsep) if p and os.path.isabs(p)]
        if kept:
            env["PYTHONPATH"] = os.pathsep.join(kept)
        else:
            del env["PYTHONPATH"]
    return env


def safe_cwd() -> str:
    """A working folder for helpers that no shared file lands in: the interpreter's own installation."""
    return sys.prefix


@contextmanager
def isolated_children() -> Iterator[None]:
    """While inside, every Python child started by a library (multiprocessing spawn and its resource
    tracker, torch's elastic launcher) inherits the safe environment of `child_env`."""
    saved = {k: os.environ.get(k) for k in (SAFE_PATH_ENV, "PYTHONPATH")}
    safe = child_env()
    os.environ[SAFE_PATH_ENV] = "1"
    if "PYTHONPATH" in safe:
        os.environ["PYTHONPATH"] = safe["PYTHONPATH"]
    else:
        os.environ.pop("PYTHONPATH", None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class Terminated(SystemExit):
    """The process was asked to stop by a signal; raised so that cleanup runs on the way out."""


@contextmanager
def exit_on_signals(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Inside, the given signals raise `Terminated` (exit 128 + signal) instead of killing the process
    outright, so scratch folders are removed and helper processes stopped. Only in the main thread."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        raise Terminated(128 + signum)

    previous = {s: signal.signal(s, stop) for s in signals}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def leave_without_teardown() -> None:
    """The exit handler `skip_teardown_at_exit` installs: run the other exit handlers (queue feeders,
    finalizers, logging) exactly once, flush the standard streams, then end the process at once."""
    atexit.unregister(leave_without_teardown)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def skip_teardown_at_exit() -> None:
    """Call once a worker process's work has succeeded and its files, groups and engines are closed:
    at exit it ends with code 0 after the exit handlers but without module teardown. Only on
    success, so a failing process still exits through its own path with its own code."""
    atexit.register(leave_without_teardown)


PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send `sig` to this process when its parent dies (Linux's PR_SET_PDEATHSIG);
    whether it is armed. A run's workers call it first: a launcher killed by SIGKILL runs no clean-up,
    and its workers would otherwise train on, holding cores, memory and devices. A parent already
    gone before the call (this process re-parented to init) ends this process at once."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if parent == 1 or os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True
