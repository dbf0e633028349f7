"""The benchmark-suite registry: a suite is a small class; adding one never edits a dispatcher.

Built-in suites register with `@register`; third parties publish a `Suite` subclass under the
entry-point group `hetprof.benchmarks` and `hetprof profile --suite NAME` finds it.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import TYPE_CHECKING, ClassVar

from hetprof.errors import SpecError

if TYPE_CHECKING:
    from hetprof.profiler.context import ProfileContext

ENTRY_POINT_GROUP = "hetprof.benchmarks"


class Suite:
    """One family of microbenchmarks.

    scope decides how often it runs: "device" once per profiled device, "host" once per host over
    all its local devices (collectives), "cluster" across hosts under a rendezvous (links).
    `default` suites run when `--suite` is not given.
    """

    name: ClassVar[str] = ""
    scope: ClassVar[str] = "device"
    default: ClassVar[bool] = True
    help: ClassVar[str] = ""

    def steps(self, ctx: ProfileContext) -> int:
        """How many progress steps `run` will report (for the progress bar)."""
        return 1

    def run(self, ctx: ProfileContext) -> None:
        raise NotImplementedError


_REGISTRY: dict[str, type[Suite]] = {}


def register(cls: type[Suite]) -> type[Suite]:
    if not cls.name:
        raise TypeError(f"{cls.__name__} needs a `name`")
    _REGISTRY[cls.name] = cls
    return cls


def _load_builtins() -> None:
    # Importing the package registers the built-in suites (their modules use @register).
    import hetprof.profiler.suites  # noqa: F401


def available() -> dict[str, type[Suite]]:
    _load_builtins()
    out = dict(_REGISTRY)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in out:
            cls = ep.load()
            if not (isinstance(cls, type) and issubclass(cls, Suite)):
                raise SpecError(f"entry point {ep.value}", ep.name, "a hetprof.profiler.registry.Suite subclass",
                                cls)
            out[ep.name] = cls
    return out


def resolve(names: list[str] | None) -> list[type[Suite]]:
    """The suites to run, in the registry's order; unknown names are a SpecError listing the known ones."""
    suites = available()
    if not names:
        return [cls for cls in suites.values() if cls.default]
    unknown = [n for n in names if n not in suites]
    if unknown:
        raise SpecError("command line", "--suite", f"one of {', '.join(suites)}", ",".join(unknown))
    return [cls for name, cls in suites.items() if name in names]
