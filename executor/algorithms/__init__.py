"""RL algorithms: a small interface, a registry, and the built-in GRPO and PPO.

An algorithm turns a batch of scored rollouts into advantages and a differentiable loss; the
`Learner` runs the optimisation loop around it. A third party adds one by subclassing `Algorithm`
and calling `register_algorithm("name")` or declaring an entry point in `hetprof.algorithms`.
The rules are hetprof.registry's.
"""

from __future__ import annotations

from collections.abc import Callable

from hetprof.executor.algorithms.base import Algorithm, AlgorithmConfig, RLBatch
from hetprof.registry import Registry, subclass_of

ENTRY_POINT_GROUP = "hetprof.algorithms"

ALGORITHMS: Registry[type[Algorithm]] = Registry(
    "algorithm", ENTRY_POINT_GROUP,
    builtins={"grpo": "hetprof.executor.algorithms.grpo", "ppo": "hetprof.executor.algorithms.ppo"},
    check=subclass_of(Algorithm), expected="an Algorithm subclass", name_attr="name")


def register_algorithm(name: str) -> Callable[[type[Algorithm]], type[Algorithm]]:
    """Class decorator adding an algorithm under `name`."""
    return ALGORITHMS.register(name)


def available_algorithms() -> list[str]:
    """Every name get_algorithm accepts."""
    return ALGORITHMS.names()


def get_algorithm(name: str) -> type[Algorithm]:
    """The algorithm class registered as `name`, in any case ("GRPO" is "grpo");
    instantiate it with an `AlgorithmConfig`."""
    return ALGORITHMS.get(name.lower())


__all__ = ["Algorithm", "AlgorithmConfig", "RLBatch", "available_algorithms", "get_algorithm",
           "register_algorithm", "ENTRY_POINT_GROUP"]
