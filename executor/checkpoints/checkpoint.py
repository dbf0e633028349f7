"""Atomic checkpoints of tensors only, so a killed run resumes and a shared checkpoint runs no code.

A checkpoint is a directory `iter-NNNNNN/` holding `state.pt` (a torch.save of nested dicts of
tensors and numbers: models, optimizers, RNG states) and `meta.json` (plan hash, iteration, data
cursor, version counters). It is written under a temporary name and renamed into place, and the
`LATEST` pointer is replaced atomically after it, so a crash mid-write leaves the previous
checkpoint intact. Loading uses `weights_only=True`: a checkpoint file cannot execute code.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hetprof.errors import ExecutionError

LATEST = "LATEST"
STATE = "state.pt"
META = "meta.json"


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(directory: str | Path, iteration: int, state: dict[str, Any], meta: dict[str, Any],
         keep: int = 2) -> Path:
    """Write checkpoint `iteration` atomically and point LATEST at it; keep the newest `keep`."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"iter-{iteration:06d}"

    def write(tmp: Path) -> None:
        torch.save(state, tmp / STATE)
        (tmp / META).write_text(json.dumps({**meta, "iteration": iteration}, indent=1))

    atomic_folder(final, write)
    _write_atomic(root / LATEST, final.name + "\n")
    for old in sorted(root.glob("iter-*"))[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def atomic_folder(final: Path, write: Callable[[Path], None]) -> None:
    """Fill a fresh temporary folder beside `final` with `write(tmp)`, then rename it to `final` (replacing
    an older one): a reader sees the whole folder or none of it, and a failed write leaves nothing."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
    try:
        write(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def latest(directory: str | Path) -> Path | None:
    """The newest complete checkpoint directory, or None if there is none."""
    root = Path(directory)
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / STATE).is_file() and (path / META).is_file() else None


def load(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[dict[str, Any], dict[str, Any]]:
    """(state, meta) of a checkpoint directory; tensors only (weights_only=True)."""
    path = Path(path)
    try:
        meta = json.loads((path / META).read_text())
        state = torch.load(path / STATE, map_location=map_location, weights_only=True)
    except (OSError, json.JSONDecodeError, RuntimeError) as exc:
        raise ExecutionError(f"checkpoint {path}: cannot be read ({exc})") from None
    return state, meta


def rng_state() -> dict[str, torch.Tensor]:
    """The torch RNG states of this process (CPU, and CUDA when present) as tensors."""
    out = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


COMMIT = "COMMITTED.json"


def task_dir(root: str | Path, task: str) -> Path:
    """Each training task's lead writes its own checkpoints (models live on different ranks)."""
    return Path(root) / task


def commit(root: str | Path, iteration: int, meta: dict[str, Any]) -> None:
    """Mark `iteration` complete once every training task has saved it; --resume starts here."""
    path = Path(root) / COMMIT
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, json.dumps({**meta, "iteration": iteration}, indent=1))


def committed(root: str | Path) -> dict[str, Any] | None:
    """The last committed iteration's metadata, or None when no checkpoint was completed."""
    path = Path(root) / COMMIT
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
        int(meta["iteration"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise ExecutionError(f"checkpoint marker {path} is unreadable; delete it to start afresh") from None
    return meta
