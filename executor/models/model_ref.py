"""Which model a role runs: a preset name, or the absolute path of a local Hugging Face folder.

Kept apart from the model builders so the launcher can name the model (to load its tokenizer and
check the prompts) without importing transformers' modeling stack, which only the workers need.
"""

from __future__ import annotations

from pathlib import Path

from hetprof.specs import WorkloadSpec
from hetprof.specs.models import PRESETS


def model_ref(workload: WorkloadSpec, role: str) -> str:
    """A preset name, or the absolute path of a local HF model (relative to the workload file)."""
    ref = getattr(workload.models, role) or workload.models.actor
    if ref.strip().lower() in PRESETS:
        return ref.strip().lower()
    path = Path(ref)
    if not path.is_absolute() and workload.base_dir:
        path = Path(workload.base_dir) / path
    return str(path)
