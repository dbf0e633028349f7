"""hetprof: profile, model, plan and run RL post-training on heterogeneous GPUs and networks.

This package is the floor every stage stands on, and imports none of them:
- `specs/`: the vocabulary and the files users write and share (cluster, workload, plan), with the
  GPU catalog, model shapes and units they are read against;
- `runtime/`: the torch pieces the profiler and the executor both run (generation, packed passes,
  process groups, the vLLM engine);
- `safety/`: starting child processes and opening other people's files safely;
- at the root: the CLI entry point, errors, the plug-in registry, paths and terminal display.
"""

__version__ = "0.1.0"
