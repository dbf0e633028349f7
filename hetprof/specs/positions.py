"""Where in a spec file a field is: the line and column a field-path error points at.

`from_data` works on plain data, which has forgotten where each value stood; when it refuses a
field, the file is composed again (YAML's node tree keeps marks; JSON is read the same way) and the
error gets `file:LINE:COLUMN`, so an editor jumps to the mistake.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from hetprof.errors import SpecError
from hetprof.safety import safefiles
from hetprof.specs.loader import MAX_SPEC_BYTES, from_data, read_file
from hetprof.specs.overrides import apply_overrides, from_override, split_field_path

T = TypeVar("T")
MAX_LOCATED_BYTES = 2**20  # composing keeps every node: a large plan file's error goes without a line


def field_position(text: str, field_path: str) -> tuple[int, int] | None:
    """(line, column), 1-based, of the deepest part of `field_path` present in `text`; None if the
    text does not compose (it parsed once, so only a non-YAML JSON oddity gets here)."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    if node is None:
        return None
    mark = node.start_mark
    for part in split_field_path(field_path):
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            entry = next(((k, v) for k, v in node.value if getattr(k, "value", None) == part), None)
            if entry is None:
                break
            mark, node = entry[0].start_mark, entry[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            mark = node.start_mark
        else:
            break
    return mark.line + 1, mark.column + 1


def located(exc: SpecError, path: str | Path) -> SpecError:
    """`exc` with `path:LINE:COLUMN` as its file when the field can be found in the file, else itself."""
    if exc.file != str(path) or Path(path).stat().st_size > MAX_LOCATED_BYTES:
        return exc
    try:
        text = safefiles.read_bounded(Path(path), MAX_SPEC_BYTES).decode("utf-8")
    except (safefiles.NotReadable, UnicodeDecodeError):
        return exc
    where = field_position(text, exc.field)
    if where is None:
        return exc
    return SpecError(exc.file, exc.field, exc.expected, exc.got, position=where)


def load_spec(cls: type[T], path: str | Path, prepare: Callable[[Any], Any] | None = None,
              overrides: Sequence[str] = ()) -> T:
    """`cls` from a spec file (after `prepare` edits its plain data and `--set` overrides apply);
    errors name the override that caused them, else the file, line and column."""
    data = apply_overrides(read_file(path), overrides)
    if prepare is not None:
        data = prepare(data)
    try:
        return from_data(cls, data, file=str(path))
    except SpecError as exc:
        named = from_override(exc, overrides)
        raise (named if named is not exc else located(exc, path)) from None
