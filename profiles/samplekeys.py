"""A run's samples are numbered 0..n_samples-1, each number once: checked for every imported sample.

Content addresses make the same sample land once, but two different samples claiming the same
place of a run (or a place past its end) would make the run's data ambiguous for every later fit.
"""

from __future__ import annotations

from hetprof.errors import ImportRefused
from hetprof.profiles.db import ProfileDB

_RUN_N = 5  # the runs row's n_samples, after id, benchmark, device_id, host, params


def check_sample_places(db: ProfileDB, rows: dict[str, list[tuple]], origin: str) -> None:
    """Every incoming sample's (run_id, seq) is within its run and taken once, here and in the database."""
    sizes = {r[0]: r[_RUN_N] for r in rows["runs"]}
    places: dict[str, dict[int, str]] = {}
    for sid, run_id, seq, *_ in rows["samples"]:
        taken = places.get(run_id)
        if taken is None:
            taken = places[run_id] = _stored(db, run_id, sizes)
        n = sizes.get(run_id)
        where = f"{origin}: samples row {sid[:16]!r}"
        if n is not None and seq >= n:
            raise ImportRefused(f"{where}: seq {seq} is outside its run's {n} samples (n_samples)")
        other = taken.setdefault(seq, sid)
        if other != sid:
            raise ImportRefused(f"{where}: run {run_id[:12]}… already holds another sample at seq {seq}")


def _stored(db: ProfileDB, run_id: str, sizes: dict[str, int]) -> dict[int, str]:
    """The places the database already fills in a run (and the run's size, if the file lacks the run)."""
    if run_id not in sizes:
        found = db.conn.execute("SELECT n_samples FROM runs WHERE id = ?", (run_id,)).fetchone()
        if found is not None:
            sizes[run_id] = found[0]
    return dict(db.conn.execute("SELECT seq, id FROM samples WHERE run_id = ?", (run_id,)).fetchall())
