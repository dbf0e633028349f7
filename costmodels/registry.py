"""Cost models by name: built-ins, runtime registrations, and third-party entry points.

A user plugs in a model by registering a factory (`register_cost_model`) or by declaring an entry
point in the group `hetprof.costmodels` whose target is a CostModel subclass or a callable taking
`db=`. Built-ins are named by import path so that looking one up imports only what it needs
(the fitted model pulls in scikit-learn only when asked for). The rules are hetprof.registry's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from hetprof.registry import Registry

ENTRY_POINT_GROUP = "hetprof.costmodels"

COST_MODELS: Registry[Callable[..., Any]] = Registry(
    "cost model", ENTRY_POINT_GROUP,
    builtins={"analytical": "hetprof.costmodels.analytical:AnalyticalCostModel",
              "fitted": "hetprof.costmodels.fitted:FittedCostModel"},
    find=lambda group: entry_points(group=group))  # this module's name, so tests can replace it
_registered = COST_MODELS.entries


def register_cost_model(name: str, factory: Callable[..., Any] | None = None) -> Any:
    """Register `factory` (a CostModel class or a callable taking db=) under `name`.

    Usable as a decorator: `@register_cost_model("mine") class Mine(CostModel): ...`.
    """
    return COST_MODELS.register(name, factory)


def available_cost_models() -> list[str]:
    """Every name get_cost_model accepts."""
    return COST_MODELS.names()


def get_cost_model(name: str, db: Any | None = None, catalog: Any | None = None, **options: Any) -> Any:
    """A fresh cost model by name, reading its calibration from `db` (a ProfileDB) if given and its
    GPU types from `catalog` (a hetprof.specs.catalog.Catalog; the built-in one if None). A registered
    factory that takes no `catalog` keeps working on the built-in catalog."""
    factory = COST_MODELS.get(name)
    if catalog is not None and _accepts(factory, "catalog"):
        options["catalog"] = catalog
    return factory(db=db, **options)


def _accepts(factory: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
