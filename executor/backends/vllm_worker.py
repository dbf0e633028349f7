"""The code vLLM runs inside its workers to take new weights (named by import path, as vLLM asks).

Kept apart from `vllm.py` so that vLLM's worker processes import only this small module.
"""

from __future__ import annotations

import torch


class WeightUpdateExtension:
    """Mixed into vLLM's worker class through `worker_extension_cls`."""

    def hetprof_load_weights(self, items: list[tuple[str, torch.Tensor]]) -> None:
        """Take a full set of checkpoint-named tensors.

        Through vLLM's in-place reload rather than the model's `load_weights`: on CPU vLLM repacks
        each linear layer's weight into its GEMM kernel's layout after loading and frees the
        original, so only a reload (which re-runs that step) reaches the weights the kernels read.
        """
        device = self.device
        self.reload_weights(weights_iterator=[(n, t.to(device)) for n, t in items])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
