"""The torch runtime pieces the profiler and the executor share.

What runs a model: sampling and the `hf` generation loop, packed forward passes and their
varlen attention, token-budget micro-batching, data-parallel and process-group set-up, the vLLM
engine and its worker extension, CPU core slots and host memory. The profiler times exactly the
code the executor runs, so both import it from here; nothing here imports a stage.
"""
