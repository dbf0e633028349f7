"""Generation backends: a small interface, a registry, and the built-in `hf` and `vllm` engines.

A third party adds an engine by subclassing `GenerationBackend` and either calling
`register_backend("name")` or declaring an entry point in the group `hetprof.backends`; the runtime
asks for one by the name the user gave (`hetprof run --backend NAME`), never by a hard-coded branch.
The rules are hetprof.registry's.
"""

from __future__ import annotations

from collections.abc import Callable

from hetprof.executor.backends.base import GenerationBackend, Rollout
from hetprof.registry import Registry, subclass_of

ENTRY_POINT_GROUP = "hetprof.backends"

# Built-ins register themselves when imported; vllm's module imports vLLM only when it is used.
BACKENDS: Registry[type[GenerationBackend]] = Registry(
    "backend", ENTRY_POINT_GROUP,
    builtins={"hf": "hetprof.executor.backends.hf", "vllm": "hetprof.executor.backends.vllm"},
    check=subclass_of(GenerationBackend), expected="a GenerationBackend subclass", name_attr="name")


def register_backend(name: str) -> Callable[[type[GenerationBackend]], type[GenerationBackend]]:
    """Class decorator adding a backend under `name` (a later registration of a name replaces it)."""
    return BACKENDS.register(name)


def available_backends() -> list[str]:
    """Registered names plus those advertised by installed entry points."""
    return BACKENDS.names()


def get_backend(name: str) -> type[GenerationBackend]:
    """The backend class registered as `name` (built-in, registered, or from an entry point)."""
    return BACKENDS.get(name)


__all__ = ["GenerationBackend", "Rollout", "available_backends", "get_backend", "register_backend",
           "ENTRY_POINT_GROUP"]
