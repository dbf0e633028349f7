"""One registry for every pluggable family: built-ins by import path, registrations, entry points.

Cost models, benchmark suites, generation backends, RL algorithms and rewards are each a table of
names that a user extends without editing a dispatcher — in code with `register`, or from another
distribution with an entry point. The rules are the same for all of them, so they live here once:
a registration wins over a built-in and a built-in over an entry point; a built-in is imported only
when it is asked for (listing names, or choosing the analytical cost model, never pays for torch,
scikit-learn or vLLM); what an entry point yields is checked before use, so a broken plugin is
refused by name instead of failing later; an unknown name is refused with the names that exist.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar, overload

from hetprof.errors import HetprofError, SpecError

T = TypeVar("T")


class UnknownName(SpecError):
    """A name no entry answers to. A SpecError, because the name came from a spec or a command line."""

    def __init__(self, kind: str, name: str, available: Iterable[str], alternatives: str = ""):
        self.file, self.field, self.got = None, kind, name
        self.expected = f"one of {', '.join(available) or '(none)'}{alternatives}"
        HetprofError.__init__(self, f"unknown {kind} {name!r}; expected {self.expected}")


def subclass_of(base: type) -> Callable[[Any], bool]:
    """A `check` accepting classes derived from `base` (what most families register)."""
    return lambda obj: isinstance(obj, type) and issubclass(obj, base)


class Registry(Generic[T]):
    """Entries of one kind by name.

    kind: what an entry is, in words ("cost model"), for messages. group: the entry-point group.
    builtins: name → "module:attr" (the entry is that attribute) or "module" (importing it registers
    the name), imported on first use. check/expected: what every entry must satisfy, and that in
    words. name_attr: an attribute set on each entry to the name it answers to. adapt: turns what an
    entry point yields into an entry. find: the entry-point lookup, `find(group=...)`; a family
    passes its own so that its tests can replace it.
    """

    def __init__(self, kind: str, group: str, *, builtins: Mapping[str, str] | None = None,
                 check: Callable[[Any], bool] | None = None, expected: str = "",
                 name_attr: str | None = None, adapt: Callable[[str, Any], T] | None = None,
                 find: Callable[..., Iterable[EntryPoint]] | None = None):
        self.kind, self.group = kind, group
        self.builtins = dict(builtins or {})
        self.check, self.expected = check, expected or f"a valid {kind}"
        self.name_attr, self.adapt, self.find = name_attr, adapt, find
        self.entries: dict[str, T] = {}

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, obj: T) -> T: ...

    def register(self, name: str, obj: Any = None) -> Any:
        """Add `obj` under `name`, replacing an earlier one; without `obj`, a decorator that does."""
        if not name or not isinstance(name, str):
            raise ValueError(f"a {self.kind} needs a non-empty name")

        def add(entry: T) -> T:
            if self.check is not None and not self.check(entry):
                raise TypeError(f"{self.kind} {name!r} must be {self.expected}, got {entry!r}")
            self._stamp(name, entry)
            self.entries[name] = entry
            return entry

        return add if obj is None else add(obj)

    def names(self) -> list[str]:
        """Every name `get` accepts, sorted; imports no built-in and loads no entry point."""
        return sorted(set(self.entries) | set(self.builtins) | set(self._entry_points()))

    def __contains__(self, name: object) -> bool:
        return name in self.entries or name in self.builtins or name in self._entry_points()

    def get(self, name: str) -> T:
        """The entry called `name`; UnknownName lists the names there are."""
        if name in self.entries:
            return self.entries[name]
        if name in self.builtins:
            return self._builtin(name)
        ep = self._entry_points().get(name)
        if ep is None:
            raise UnknownName(self.kind, name, self.names())
        return self._load(ep)

    def items(self) -> dict[str, T]:
        """Every entry, loaded: registrations in the order they were made (built-ins' modules
        imported first), then the other built-ins, then entry points."""
        loaded = {name: self.get(name) for name in self.builtins}
        out = dict(self.entries)
        out.update((name, entry) for name, entry in loaded.items() if name not in out)
        for name, ep in self._entry_points().items():
            if name not in out:
                out[name] = self._load(ep)
        return out

    def _entry_points(self) -> dict[str, EntryPoint]:
        # Looked up on every call rather than cached, so a plugin installed (or a test's fake) counts.
        found = self.find(group=self.group) if self.find is not None else entry_points(group=self.group)
        return {ep.name: ep for ep in found}

    def _builtin(self, name: str) -> T:
        module, _, attr = self.builtins[name].partition(":")
        imported = importlib.import_module(module)
        if attr:
            return getattr(imported, attr)
        if name not in self.entries:
            raise HetprofError(f"{self.kind} {name!r}: importing {module} did not register it")
        return self.entries[name]

    def _load(self, ep: EntryPoint) -> T:
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plugin is the user's to fix: say which, without a traceback
            raise HetprofError(f"{self.kind} {ep.name!r}: loading entry point {ep.value} failed: {exc}") from exc
        if self.check is not None and not self.check(obj):
            raise SpecError(f"entry point {ep.value}", self.kind, self.expected, obj)
        self._stamp(ep.name, obj)
        return self.adapt(ep.name, obj) if self.adapt is not None else obj

    def _stamp(self, name: str, entry: Any) -> None:
        if self.name_attr is not None:
            setattr(entry, self.name_attr, name)
