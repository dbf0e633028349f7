"""Export a hetprof plan to the framework a team already trains with (verl, AReaL).

Targets are a registry (hetprof.registry's rules): a built-in is imported when asked for, and a
third party adds one under the entry-point group `hetprof.export_targets` (name = "module:Class").
"""

from __future__ import annotations

from hetprof.exporter.base import Setting, Target
from hetprof.registry import Registry, subclass_of

ENTRY_POINT_GROUP = "hetprof.export_targets"

TARGETS: Registry[type[Target]] = Registry(
    "export target", ENTRY_POINT_GROUP,
    builtins={"verl": "hetprof.exporter.verl:Verl", "areal": "hetprof.exporter.areal:Areal"},
    check=subclass_of(Target), expected="a Target subclass", name_attr="name")


def get_target(name: str) -> Target:
    """An instance of the target registered as `name`; UnknownName lists the others."""
    return TARGETS.get(name)()


def available_targets() -> list[str]:
    return TARGETS.names()


__all__ = ["ENTRY_POINT_GROUP", "TARGETS", "Setting", "Target", "available_targets", "get_target"]
