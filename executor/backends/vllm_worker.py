"""The code vLLM runs inside its workers to take new weights (named by import path, as vLLM asks).

Kept apart from `vllm.py` so that vLLM's worker processes import only this small module.
"""

from __future__ import annotations

import torch


class WeightUpdateExtension:
    """Mixed into vLLM's worker class through `worker_extension_cls`."""

    def hetprof_load_weights(self, items: list[tuple[str, torch.Tensor]]) -> None:
        device = self.device  # the worker's GPU
        self.model_runner.model.load_weights(weights=[(n, t.to(device)) for n, t in items])
        torch.cuda.synchronize(device)
