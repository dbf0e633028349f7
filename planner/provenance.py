"""What a plan's numbers rest on, per GPU type: measured, reference or datasheet inputs.

A predicted iteration time is only as trustworthy as its inputs, so every plan report says, for
each GPU type of the cluster, where its compute, memory and link numbers came from — the profile
database's measured rows, imported reference rows (published figures), or the catalog's datasheet
peaks times efficiency curves (with the curves' sources) — and warns when `--cost-model fitted`
has no fitted model for a type, saying what it falls back to.
"""

from __future__ import annotations

from collections import Counter

from hetprof.costmodels.features import TASK_PHASE

KINDS = ("compute", "memory", "link")


def _inputs(cost_model, device_type: str) -> dict[str, str]:
    ask = getattr(cost_model, "inputs", None)
    if ask is not None:
        return ask(device_type)
    return {"all numbers": cost_model.device_source(device_type)}  # a registered model without inputs()


def _curves(catalog, device_type: str) -> str:
    curves = catalog.lookup(device_type).efficiency
    by_source: dict[str, list[str]] = {}
    for name in ("matmul", "attention", "memory", "decode_memory", "collective"):
        by_source.setdefault(getattr(curves, name).source, []).append(name)
    return "; ".join(f"{', '.join(names)}: {source}" for source, names in by_source.items())


def provenance_lines(sim) -> list[str]:
    """One line per GPU type of the cluster: the kind of each input, and the curves' sources where datasheet."""
    counts = Counter(d.type for d in sim.devices.values())
    lines = []
    for device_type in sorted(counts):
        inputs = _inputs(sim.cost_model, device_type)
        parts = ", ".join(f"{k} {v}" for k, v in inputs.items())
        line = f"{device_type} ({counts[device_type]} GPUs): {parts}"
        if any(inputs.get(k) == "datasheet" for k in KINDS):
            line += f" — catalog peaks × efficiency curves ({_curves(sim.catalog, device_type)})"
        lines.append(line)
    return lines


def fitted_warnings(sim) -> list[str]:
    """With a fitted cost model: GPU types (or task types on them) it has no fitted model for."""
    fitted_tasks = getattr(sim.cost_model, "fitted_tasks", None)
    if fitted_tasks is None:
        return []
    out = []
    for device_type in sorted({d.type for d in sim.devices.values()}):
        have = set(fitted_tasks(device_type))
        missing = [t for t in TASK_PHASE if t not in have]
        if not missing:
            continue
        inputs = _inputs(sim.cost_model.analytical, device_type)
        basis = ", ".join(f"{k} {v}" for k, v in inputs.items())
        what = "no fitted models" if not have else "no fitted " + ", ".join(missing) + " model"
        out.append(f"--cost-model fitted has {what} for {device_type} (profile it with `hetprof profile --suite "
                   f"tasks` and run `hetprof fit`): those phases fall back to the analytical model ({basis})")
    return out
