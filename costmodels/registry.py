"""Cost models by name: built-ins, runtime registrations, and third-party entry points.

A user plugs in a model by registering a factory (`register_cost_model`) or by declaring an entry
point in the group `hetprof.costmodels` whose target is a CostModel subclass or a callable taking
`db=`. Built-ins are named by import path so that looking one up imports only what it needs
(the fitted model pulls in scikit-learn only when asked for).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from hetprof.errors import HetprofError

ENTRY_POINT_GROUP = "hetprof.costmodels"

_BUILTIN = {
    "analytical": "hetprof.costmodels.analytical:AnalyticalCostModel",
    "fitted": "hetprof.costmodels.fitted:FittedCostModel",
}
_registered: dict[str, Callable[..., Any]] = {}


def register_cost_model(name: str, factory: Callable[..., Any] | None = None):
    """Register `factory` (a CostModel class or a callable taking db=) under `name`.

    Usable as a decorator: `@register_cost_model("mine") class Mine(CostModel): ...`.
    """

    def add(f: Callable[..., Any]) -> Callable[..., Any]:
        if not name or not isinstance(name, str):
            raise ValueError("a cost model needs a non-empty name")
        _registered[name] = f
        return f

    return add(factory) if factory is not None else add


def available_cost_models() -> list[str]:
    """Every name get_cost_model accepts."""
    return sorted(set(_BUILTIN) | set(_registered) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def _load(target: str) -> Callable[..., Any]:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def get_cost_model(name: str, db: Any | None = None, **options: Any):
    """A fresh cost model by name, reading its calibration from `db` (a ProfileDB) if given."""
    if name in _registered:
        factory = _registered[name]
    elif name in _BUILTIN:
        factory = _load(_BUILTIN[name])
    else:
        eps = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
        if name not in eps:
            raise HetprofError(f"unknown cost model {name!r}; available: {', '.join(available_cost_models())}")
        try:
            factory = eps[name].load()
        except Exception as exc:
            raise HetprofError(f"cost model {name!r}: loading entry point {eps[name].value} failed: {exc}") from exc
    return factory(db=db, **options)
