"""Built-in benchmark suites; importing this package registers them (see hetprof.profiler.registry).

The import order is the order suites run in and are listed.
"""

from hetprof.profiler.suites import inventory, compute, memory, collectives, tasks, dptrain, link, vllmgen, moe  # noqa: F401, I001
