"""Between the restricted MILP and candidates: a solution read back as a choice, a candidate
written in as CBC's first incumbent, and the cut that excludes a solution already shortlisted."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hetprof.planner.candidate import Candidate
    from hetprof.planner.search.ilp_model import RestrictedModel, Shape


def decode(model: RestrictedModel) -> tuple[tuple[tuple[int, ...], ...], dict[str, Shape]] | None:
    """(GPU counts per group and kind, shape per task) of the solution CBC left; None if unreadable."""
    space = model.space
    try:
        counts = tuple(tuple(next(v for v in range(space.totals[t] + 1) if (model.u[g, t, v].value() or 0) > 0.5)
                             for t in space.types) for g in range(len(space.grouping)))
        chosen = {k: next(c for c in model.shapes[k] if (model.z[k, c].value() or 0) > 0.5) for k in model.tasks}
    except StopIteration:
        return None
    return counts, chosen


def exclude(model: RestrictedModel) -> None:
    """A no-good cut: the next solve must change at least one count or shape of the current solution."""
    import pulp

    ones = [model.u[key] for key in model.u if (model.u[key].value() or 0) > 0.5] + \
        [model.z[key] for key in model.z if (model.z[key].value() or 0) > 0.5]
    model.prob += pulp.lpSum(ones) <= len(ones) - 1


def warm_start(model: RestrictedModel, warm: Candidate) -> bool:
    """Give CBC a candidate's counts and shapes as its first incumbent, when they fit the model."""
    space = model.space
    if tuple(tuple(g) for g in warm.groups) != space.grouping:
        return False
    for g, devs in enumerate(warm.group_devices):
        for t in space.types:
            n = sum(1 for d in devs if d in space.members(t))
            for v in range(space.totals[t] + 1):
                model.u[g, t, v].setInitialValue(1 if v == n else 0)
    for k, lay in warm.layouts:
        c = (lay.tp, lay.pp)
        if c not in model.shapes.get(k, []):
            return False
        for cc in model.shapes[k]:
            model.z[k, cc].setInitialValue(1 if cc == c else 0)
        for (kk, t, cc), var in model.w.items():
            if kk == k:
                n = sum(1 for r in lay.replicas if cc == c and all(d in space.members(t) for d in r))
                var.setInitialValue(min(n, var.upBound))
    return True
