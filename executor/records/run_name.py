"""A run's name: the folder its TensorBoard events, W&B run and checkpoints are kept under.

A name may come back from a shared checkpoint folder, so it is one path component and nothing else:
letters, digits, '.', '_', '-', at most 128 characters, never ".." or "/".
"""

from __future__ import annotations

import re
from typing import Any

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # one path component, never ".." or "/"


def run_name_problem(name: Any) -> str | None:
    """Why `name` cannot be a run name (a folder under --tensorboard-dir), or None if it can."""
    if not isinstance(name, str) or not RUN_NAME.fullmatch(name):
        return f"a run name of letters, digits, '.', '_', '-' (one path component, at most 128 characters), got {name!r:.80}"
    return None
