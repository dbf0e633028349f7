"""A worker that fails because a peer went away waits before exiting, so the dead peer is the one named.

Torch's elastic agent looks at its workers every monitor interval (0.2 s), reports the first dead one
it finds and stops the rest. When a worker is killed (SIGKILL, the OOM killer), its peers fail within
milliseconds with gloo's "Connection reset by peer" or "Connection closed by peer" — usually before
the agent's next look — and the agent used to report a survivor, with that bare message and its own
address, instead of the worker that died first. Survivors of a lost peer therefore stay alive for
LINGER_S: the agent finds the killed worker first, names it by its signal, and stops them itself.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

LINGER_S = 5.0  # many monitor intervals, so a busy host's agent still looks in time
_PEER_LOST = re.compile(r"connection (reset|closed) by peer|broken pipe|socket closed|connection refused|"
                        r"end of file|recvBytes|sendBytes", re.IGNORECASE)


def peer_lost(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from, says a peer's connection went away."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _PEER_LOST.search(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False


def linger_if_peer_lost(exc: BaseException, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Wait LINGER_S when `exc` is a lost peer's consequence; True when it waited."""
    if not peer_lost(exc):
        return False
    sleep(LINGER_S)
    return True
