"""The CBC solver behind the MILP searches, found the way the installed PuLP expects.

PuLP < 4 bundles a CBC binary (`PULP_CBC_CMD`, deprecated there); PuLP 4 drops it in favour of an
installed `cbc` (`pip install pulp[cbc]`, `COIN_CMD`). Both take the same options, so the searches
ask here and never name either.
"""

from __future__ import annotations

import warnings
from typing import Any


def cbc(**options: Any) -> Any:
    """A PuLP CBC solver command with `options` (timeLimit, threads, warmStart, logPath, maxNodes, msg)."""
    import pulp

    coin = pulp.COIN_CMD(**options)
    if coin.available():
        return coin
    with warnings.catch_warnings():  # the bundled binary is what PuLP < 4 (pinned) offers
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(**options)
