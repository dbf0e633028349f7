"""RL algorithms: a small interface, a registry, and the built-in GRPO and PPO.

An algorithm turns a batch of scored rollouts into advantages and a differentiable loss; the
`Learner` runs the optimisation loop around it. A third party adds one by subclassing `Algorithm`
and calling `register_algorithm("name")` or declaring an entry point in `hetprof.algorithms`.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

from hetprof.errors import SpecError
from hetprof.executor.algorithms.base import Algorithm, AlgorithmConfig, RLBatch

ENTRY_POINT_GROUP = "hetprof.algorithms"
_REGISTRY: dict[str, type[Algorithm]] = {}


def register_algorithm(name: str) -> Callable[[type[Algorithm]], type[Algorithm]]:
    """Class decorator adding an algorithm under `name`."""

    def deco(cls: type[Algorithm]) -> type[Algorithm]:
        if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
            raise TypeError(f"algorithm {name!r} must subclass Algorithm")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def _builtin() -> None:
    from hetprof.executor.algorithms import grpo, ppo  # noqa: F401  (importing registers them)


def available_algorithms() -> list[str]:
    _builtin()
    return sorted(set(_REGISTRY) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def get_algorithm(name: str) -> type[Algorithm]:
    """The algorithm class registered as `name`; instantiate it with an `AlgorithmConfig`."""
    _builtin()
    key = name.lower()
    if key in _REGISTRY:
        return _REGISTRY[key]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == key:
            cls = ep.load()
            if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
                raise SpecError(None, "algorithm", f"entry point {ep.value} to name an Algorithm", cls)
            _REGISTRY[key] = cls
            return cls
    raise SpecError(None, "algorithm", f"one of {available_algorithms()}", name)


__all__ = ["Algorithm", "AlgorithmConfig", "RLBatch", "available_algorithms", "get_algorithm",
           "register_algorithm", "ENTRY_POINT_GROUP"]
