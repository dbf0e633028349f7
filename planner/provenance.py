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
    """With a fitted cost model and GPU types (or task types on them) it has no fitted model for: one line
    naming them all and the numbers their phases fall back to — one line, since an empty database
    leaves every type uncovered and a warning per type would bury the report."""
    fitted_tasks = getattr(sim.cost_model, "fitted_tasks", None)
    if fitted_tasks is None:
        return []
    bare: list[str] = []
    partial: dict[str, list[str]] = {}
    basis: dict[str, list[str]] = {}
    for device_type in sorted({d.type for d in sim.devices.values()}):
        have = set(fitted_tasks(device_type))
        missing = [t for t in TASK_PHASE if t not in have]
        if not missing:
            continue
        if have:
            partial.setdefault(", ".join(missing), []).append(device_type)
        else:
            bare.append(device_type)
        basis.setdefault(_basis(_inputs(sim.cost_model.analytical, device_type)), []).append(device_type)
    if not basis:
        return []
    gaps = ([f"no fitted models for {', '.join(bare)}"] if bare else []) + [
        f"no fitted {tasks} model for {', '.join(types)}" for tasks, types in partial.items()]
    falls = "; ".join(f"{b} for {', '.join(types)}" for b, types in basis.items())
    return [f"--cost-model fitted has {'; '.join(gaps)}: those phases fall back to the analytical model on "
            f"{falls} (profile with `hetprof profile --suite tasks`, then `hetprof fit`)"]


def _basis(inputs: dict[str, str]) -> str:
    """`datasheet numbers` when every input is the datasheet's (or all one kind), else each input's kind."""
    kinds = set(inputs.values())
    if len(kinds) == 1:
        return f"{kinds.pop()} numbers"
    return ", ".join(f"{k} {v}" for k, v in inputs.items())
