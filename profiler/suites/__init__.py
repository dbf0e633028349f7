"""Built-in benchmark suites; importing this package registers them (see hetprof.profiler.registry)."""

from hetprof.profiler.suites import tasks  # noqa: F401
