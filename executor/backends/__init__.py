"""Generation backends: a small interface, a registry, and the built-in `hf` and `vllm` engines.

A third party adds an engine by subclassing `GenerationBackend` and either calling
`register_backend("name")` or declaring an entry point in the group `hetprof.backends`; the runtime
asks for one by the name the user gave (`hetprof run --backend NAME`), never by a hard-coded branch.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

from hetprof.errors import SpecError
from hetprof.executor.backends.base import GenerationBackend, Rollout

ENTRY_POINT_GROUP = "hetprof.backends"
_REGISTRY: dict[str, type[GenerationBackend]] = {}


def register_backend(name: str) -> Callable[[type[GenerationBackend]], type[GenerationBackend]]:
    """Class decorator adding a backend under `name` (a later registration of a name replaces it)."""

    def deco(cls: type[GenerationBackend]) -> type[GenerationBackend]:
        if not (isinstance(cls, type) and issubclass(cls, GenerationBackend)):
            raise TypeError(f"backend {name!r} must subclass GenerationBackend")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def _builtin() -> None:
    # Importing the modules registers them; vllm's module imports vLLM only when it is used.
    from hetprof.executor.backends import hf, vllm  # noqa: F401


def available_backends() -> list[str]:
    """Registered names plus those advertised by installed entry points."""
    _builtin()
    names = set(_REGISTRY)
    names.update(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def get_backend(name: str) -> type[GenerationBackend]:
    """The backend class registered as `name` (built-in, registered, or from an entry point)."""
    _builtin()
    if name in _REGISTRY:
        return _REGISTRY[name]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            cls = ep.load()
            if not (isinstance(cls, type) and issubclass(cls, GenerationBackend)):
                raise SpecError(None, "backend", f"entry point {ep.value} to name a GenerationBackend", cls)
            _REGISTRY[name] = cls
            return cls
    raise SpecError(None, "backend", f"one of {available_backends()}", name)


__all__ = ["GenerationBackend", "Rollout", "available_backends", "get_backend", "register_backend",
           "ENTRY_POINT_GROUP"]
