"""hetprof: profile, model, plan and run RL post-training on heterogeneous GPUs and networks.

This package holds the CLI and the vocabulary every stage shares (specs, units, errors, the GPU
catalog, model shapes). It imports none of the stages; they import it.
"""

__version__ = "0.1.0"
