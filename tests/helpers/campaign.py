"""The hostile-input campaign's shared parts: how many inputs each fuzz test tries, and the tally.

Every fuzz test of a shared-file surface (exports, databases, specs, plans, prompt files, checkpoint
markers, run logs) draws its inputs under `FUZZ` and records each outcome with `tally`: the input was
refused in one line, or accepted with only valid data. The suite tries a few dozen inputs per
surface; `make campaign` sets HYPOTHESIS_PROFILE=campaign (thousands per surface) and
HETPROF_CAMPAIGN_TALLY (a file the outcomes are appended to), then prints one table for every surface.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, settings

CAMPAIGN = os.environ.get("HYPOTHESIS_PROFILE") == "campaign"
TALLY_ENV = "HETPROF_CAMPAIGN_TALLY"
SIZE_ENV = "HETPROF_CAMPAIGN_EXAMPLES"  # inputs per fuzz test in the campaign (default 2000)
OUTCOMES = ("refused", "accepted")


def fuzz(suite_examples: int, campaign_examples: int = 2000) -> settings:
    """Hypothesis settings for one fuzz test: a few dozen inputs in the suite, thousands in the campaign
    (SIZE_ENV overrides how many); no example database (a fixed suite), no deadline (a loaded machine
    is slow, not wrong)."""
    if CAMPAIGN:
        campaign_examples = int(os.environ.get(SIZE_ENV, campaign_examples))
    return settings(max_examples=campaign_examples if CAMPAIGN else suite_examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


_COUNTS: Counter[tuple[str, str]] = Counter()


def tally(surface: str, outcome: str) -> None:
    """Record one input of `surface`: `refused` (one line, nothing changed) or `accepted` (valid data only)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome {outcome!r} is not one of {OUTCOMES}")
    _COUNTS[surface, outcome] += 1
    path = os.environ.get(TALLY_ENV)
    if path:  # one line per input, appended: pytest-xdist workers share the file
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"surface": surface, "outcome": outcome}) + "\n")


def summary() -> str:
    """This process's outcomes, one surface per line (printed by the fuzz modules under `-s`)."""
    surfaces = sorted({s for s, _ in _COUNTS})
    return "\n".join(f"{s}: {sum(_COUNTS[s, o] for o in OUTCOMES)} tried, "
                     + ", ".join(f"{_COUNTS[s, o]} {o}" for o in OUTCOMES) for s in surfaces)


def read_tally(path: Path) -> dict[str, Counter[str]]:
    """The outcomes appended to a tally file, per surface."""
    per: dict[str, Counter[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        per.setdefault(entry["surface"], Counter())[entry["outcome"]] += 1
    return per


def main(argv: list[str]) -> None:
    """Print the campaign's table from its tally file (`make campaign`)."""
    from rich.console import Console
    from rich.table import Table

    per = read_tally(Path(argv[0]))
    table = Table(title="hostile-input campaign: every input refused in one line or accepted with valid data")
    for column in ("surface", "tried", *OUTCOMES):
        table.add_column(column, justify="left" if column == "surface" else "right")
    for surface, counts in sorted(per.items()):
        table.add_row(surface, f"{sum(counts.values()):,}", *(f"{counts[o]:,}" for o in OUTCOMES))
    total: Counter[str] = sum(per.values(), Counter())
    table.add_row("all", f"{sum(total.values()):,}", *(f"{total[o]:,}" for o in OUTCOMES))
    Console().print(table)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
