"""Searches over placements: a registry so a user adds one with a class or an entry point.

Built-in searches live in sibling modules and are imported only when asked for, so listing or
choosing one never pays for Optuna or PuLP it does not use. Third-party searches register under
the entry-point group `hetprof.searches` (name = "module:Class"). The rules are hetprof.registry's.
"""

from __future__ import annotations

from collections.abc import Callable

from hetprof.planner.search.base import Ledger, Search, SearchContext, SearchResult
from hetprof.registry import Registry, subclass_of

ENTRY_POINT_GROUP = "hetprof.searches"

# name -> module that defines (and registers) it; imported on first use.
SEARCHES: Registry[type[Search]] = Registry(
    "search", ENTRY_POINT_GROUP,
    builtins={"hetrl": "hetprof.planner.search.hetrl", "ilp": "hetprof.planner.search.ilp",
              "arealhex": "hetprof.planner.search.arealhex", "verl": "hetprof.planner.search.verl",
              "streamrl": "hetprof.planner.search.streamrl", "exhaustive": "hetprof.planner.search.exhaustive"},
    check=subclass_of(Search), expected="a Search subclass", name_attr="name")


def register_search(name: str) -> Callable[[type[Search]], type[Search]]:
    """Class decorator: make a Search subclass available as `get_search(name)`."""
    return SEARCHES.register(name)


def available_searches() -> list[str]:
    """Every search that can be asked for: built-ins, registrations and installed entry points."""
    return SEARCHES.names()


def get_search(name: str) -> type[Search]:
    """The Search class registered as `name`; a clear SpecError names the choices otherwise."""
    return SEARCHES.get(name)


__all__ = ["ENTRY_POINT_GROUP", "Ledger", "Search", "SearchContext", "SearchResult", "available_searches",
           "get_search", "register_search"]
