"""The executor's folders import one way (executor/__init__.py LAYERS): a folder never imports a
folder after it, type-only imports included, so each can be read and tested with what is below it."""

from __future__ import annotations

import ast
from pathlib import Path

from hetprof.executor import LAYERS

EXECUTOR = Path(__file__).resolve().parents[2] / "executor"


def _imported_folders(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n.split(".")[2] for n in names if n.startswith("hetprof.executor.") and n.count(".") >= 2}


def test_every_executor_folder_imports_only_the_folders_before_it():
    assert {p.name for p in EXECUTOR.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(LAYERS)
    upward = []
    for folder in LAYERS:
        allowed = set(LAYERS[:LAYERS.index(folder) + 1]) | {"options"}
        for path in sorted((EXECUTOR / folder).rglob("*.py")):
            upward += [f"{path.relative_to(EXECUTOR)} imports {name}/" for name in _imported_folders(path) - allowed]
    assert not upward, upward
