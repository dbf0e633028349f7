"""Searches over placements: a registry so a user adds one with a class or an entry point.

Built-in searches live in sibling modules and are imported only when asked for, so listing or
choosing one never pays for Optuna or PuLP it does not use. Third-party searches register under
the entry-point group `hetprof.searches` (name = "module:Class").
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points

from hetprof.errors import SpecError
from hetprof.planner.search.base import Ledger, Search, SearchContext, SearchResult

ENTRY_POINT_GROUP = "hetprof.searches"

# name -> module that defines (and registers) it; imported on first use.
_BUILTIN = {
    "hetrl": "hetprof.planner.search.hetrl",
    "ilp": "hetprof.planner.search.ilp",
    "arealhex": "hetprof.planner.search.arealhex",
    "verl": "hetprof.planner.search.baselines",
    "streamrl": "hetprof.planner.search.baselines",
    "exhaustive": "hetprof.planner.search.exhaustive",
}

_REGISTRY: dict[str, type[Search]] = {}


def register_search(name: str) -> Callable[[type[Search]], type[Search]]:
    """Class decorator: make a Search subclass available as `get_search(name)`."""

    def wrap(cls: type[Search]) -> type[Search]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def search_names() -> list[str]:
    """Every search that can be asked for: built-ins and installed entry points."""
    names = set(_BUILTIN) | set(_REGISTRY)
    names |= {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(names)


def get_search(name: str) -> type[Search]:
    """The Search class registered as `name`; a clear SpecError names the choices otherwise."""
    if name not in _REGISTRY and name in _BUILTIN:
        importlib.import_module(_BUILTIN[name])
    if name not in _REGISTRY:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name == name:
                cls = ep.load()
                if not (isinstance(cls, type) and issubclass(cls, Search)):
                    raise SpecError(None, "search", f"entry point {ep.value} to be a Search subclass", cls)
                _REGISTRY[name] = cls
                cls.name = name
                break
    if name not in _REGISTRY:
        raise SpecError(None, "search", "one of " + ", ".join(search_names()), name)
    return _REGISTRY[name]


__all__ = ["ENTRY_POINT_GROUP", "Ledger", "Search", "SearchContext", "SearchResult", "get_search",
           "register_search", "search_names"]
