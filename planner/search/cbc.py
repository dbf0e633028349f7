"""The CBC solver behind the MILP searches, found the way the installed PuLP expects.

PuLP < 4 bundles a CBC binary (`PULP_CBC_CMD`, deprecated there); PuLP 4 drops it in favour of an
installed `cbc` (`pip install pulp[cbc]`, `COIN_CMD`). Both take the same options, so the searches
ask here and never name either.

CBC runs serial: no `threads` option is passed. Its threaded path (taken even for `threads=1`) now
and then stalls 10 s before exiting on a model it solved at once, so a small MILP (AReaL-Hex's
rollout phase) took 10 s at random; the serial path does not.
"""

from __future__ import annotations

import warnings
from typing import Any


def cbc(**options: Any) -> Any:
    """A serial PuLP CBC solver command with `options` (timeLimit, warmStart, logPath, maxNodes, msg)."""
    import pulp

    if "threads" in options:
        raise ValueError("cbc: the searches run CBC serial; its threaded path stalls (module docstring)")

    coin = pulp.COIN_CMD(**options)
    if coin.available():
        return coin
    with warnings.catch_warnings():  # the bundled binary is what PuLP < 4 (pinned) offers
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(**options)
