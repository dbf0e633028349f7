"""The benchmark-suite registry: a suite is a small class; adding one never edits a dispatcher.

Built-in suites register with `@register_suite`; third parties publish a `Suite` subclass under the
entry-point group `hetprof.benchmarks` and `hetprof profile --suite NAME` finds it.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import TYPE_CHECKING, ClassVar

from hetprof.errors import SpecError
from hetprof.registry import Registry, subclass_of

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


SUITES: Registry[type[Suite]] = Registry(
    "benchmark suite", ENTRY_POINT_GROUP,
    # Importing the package registers the built-ins (their modules use @register_suite) in the order
    # they run and are listed.
    builtins=dict.fromkeys(["inventory", "compute", "memory", "collectives", "tasks", "dptrain", "link", "vllmgen", "moe"],
                           "hetprof.profiler.suites"),
    check=subclass_of(Suite), expected="a hetprof.profiler.registry.Suite subclass",
    find=lambda group: entry_points(group=group))  # this module's name, so tests can replace it


def register_suite(cls: type[Suite]) -> type[Suite]:
    """Class decorator adding a suite under its `name`."""
    if not cls.name:
        raise TypeError(f"{cls.__name__} needs a `name`")
    return SUITES.register(cls.name, cls)


def available_suites() -> list[str]:
    """Every suite by name: built-ins in run order, then registrations, then entry points."""
    return list(SUITES.items())


def get_suite(name: str) -> type[Suite]:
    """The suite registered as `name`; an unknown name is refused with the known ones."""
    return SUITES.get(name)


def suites_to_run(names: list[str] | None) -> list[type[Suite]]:
    """The suites to run, in the registry's order (the default ones when no names are given); unknown
    names are a SpecError listing the known ones."""
    suites = SUITES.items()
    if not names:
        return [cls for cls in suites.values() if cls.default]
    unknown = [n for n in names if n not in suites]
    if unknown:
        raise SpecError("command line", "--suite", f"one of {', '.join(suites)}", ",".join(unknown))
    return [cls for name, cls in suites.items() if name in names]
