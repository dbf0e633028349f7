"""The planner's one memoisation mechanism: a bounded per-instance cache for pure pricing methods.

Every pricing answer is a pure function of frozen inputs (a layout, a stage signature, a batch),
so a cache may drop any answer and recompute it bit for bit; the bound only keeps a long search's
memory in check. `functools.lru_cache` does the work: least recently used answers go first.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Generic, TypeVar

R = TypeVar("R")


class memoised(Generic[R]):  # noqa: N801 - a decorator, named like functools' own
    """Method decorator: each instance gets its own LRU cache of at most `limit` answers.

    A per-instance cache (not one per class) so an object's answers live and die with it. The
    cache is built on first access and stored in the instance's `__dict__`, where later lookups find
    it before this (non-data) descriptor: a hit costs one C-level call.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a memo holds at least one answer (got limit={limit})")
        self.limit = limit
        self.fn: Callable[..., R] | None = None
        self.name = ""

    def __call__(self, fn: Callable[..., R]) -> memoised[R]:
        self.fn = fn
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]
        return self

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        bound = functools.lru_cache(maxsize=self.limit)(self.fn.__get__(obj, owner))  # type: ignore[union-attr]
        obj.__dict__[self.name] = bound  # frozen dataclasses too: a cache is no field
        return bound
