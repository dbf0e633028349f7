"""`--set key.path=value` overrides of a spec's plain data, before it is checked.

The value is read as YAML (`3`, `1e-6`, `true`, `[0.9, 0.95]`, `null`, `cosine`), the key as a field
path (`training.lr`, `optimizer.betas[1]`), so an override is checked exactly like the same value
written in the file; an error that comes from an override names the override, not the file. A file
field's relative path is taken from the current folder (FILE_FIELDS).
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Sequence
from typing import Any

import yaml

from hetprof.errors import SpecError
from hetprof.specs.training_setup import FILE_FIELDS

_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
_PART = re.compile(r"\[(\d+)\]|([^.\[\]]+)")


def split_field_path(field_path: str) -> list[str | int]:
    """'hosts[2].gpus.type' -> ['hosts', 2, 'gpus', 'type']."""
    return [int(index) if index else name for index, name in _PART.findall(field_path)]


def parse_override(item: str) -> tuple[str, Any]:
    """('training.lr', 1e-06) from 'training.lr=1e-6'; refuses a malformed item naming it."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key or not split_field_path(key):
        raise SpecError("--set", item, "KEY.PATH=VALUE (for example training.lr=1e-6)")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError as exc:
        raise SpecError("--set", key, "a YAML value", f"{text} ({getattr(exc, 'problem', exc)})") from None
    if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
        value = float(value)  # YAML 1.1 reads 1e-6 (no dot) as text; on a command line it is a number
    if key in FILE_FIELDS and isinstance(value, str) and value:
        value = os.path.abspath(os.path.expanduser(value))
    return key, value


def apply_overrides(data: Any, items: Sequence[str]) -> Any:
    """A copy of `data` with each `key.path=value` set, creating missing mappings on the way."""
    if not items:
        return data
    if not isinstance(data, dict):
        raise SpecError("--set", "", "a spec whose top level is a mapping", type(data).__name__)
    out = copy.deepcopy(data)
    for item in items:
        key, value = parse_override(item)
        *parents, last = split_field_path(key)
        node: Any = out
        for depth, part in enumerate(parents):
            if isinstance(node, dict) and isinstance(part, str):
                node = node.setdefault(part, {})
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                node = node[part]
            else:
                raise SpecError("--set", key, f"a mapping or list at '{_spell(parents[:depth + 1])}'", node)
        if isinstance(last, int) and not isinstance(node, list):  # an index into a default: set it whole
            raise SpecError("--set", key, f"a list written at '{_spell(parents)}' in the file (or set it whole: "
                            f"{_spell(parents)}=[...])", node or None)
        if isinstance(last, int) and last >= len(node):
            raise SpecError("--set", key, f"an index below {len(node)} in '{_spell(parents)}'", last)
        if isinstance(node, dict) or isinstance(last, int):
            node[last] = value
        else:
            raise SpecError("--set", key, f"a field or list index under '{_spell(parents)}'", node)
    return out


def from_override(exc: SpecError, items: Sequence[str]) -> SpecError:
    """`exc` naming the override that set its field (or a parent of it), if one did."""
    for item in items:
        key = item.partition("=")[0].strip()
        if exc.field == key or exc.field.startswith((key + ".", key + "[")) or key.startswith(exc.field + "."):
            return SpecError(f"--set {item}", exc.field, exc.expected, exc.got)
    return exc


def _spell(parts: Sequence[str | int]) -> str:
    out = ""
    for part in parts:
        out = f"{out}[{part}]" if isinstance(part, int) else (f"{out}.{part}" if out else part)
    return out or "<root>"
