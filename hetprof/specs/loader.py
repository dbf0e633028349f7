"""Typed loading of plain data (YAML/JSON) into dataclasses, with errors that name the field.

The specs are dataclasses whose type hints are the schema. `from_data` walks the hints and the
data together, so a mistake deep in a file is reported as `hosts[2].gpus.type: expected one of
...` with the file's name — the one thing a user needs to fix it. A field's `metadata["help"]`
documents it; `metadata["check"]` is an extra predicate with its expectation text. A type held
in memory in another shape than its file's names that shape as `FILE_FORM` (a dataclass the loader
checks field by field) with `from_file_form(entry)` and `to_file_form()`: the file's schema stays
declared, the program works on the type.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from hetprof.errors import SpecError
from hetprof.safety import safefiles

T = TypeVar("T")


def field(default: Any = dataclasses.MISSING, *, help: str = "", check=None, expect: str = "",
          default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field whose help and optional check travel with it."""
    meta = {"help": help, "check": check, "expect": expect}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


MAX_SPEC_BYTES = 64 * 2**20  # a plan with a long search trace is a few MB (JSON: parsed in about a second)
# YAML is parsed in Python at ~0.3 MB/s (libyaml's loader still builds every node in Python): a
# hand-written cluster or workload spec is a few KB, so 2 MiB still names a mistake within seconds.
MAX_YAML_BYTES = 2 * 2**20
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's scanner where installed
MAX_DEPTH = 64  # specs nest a handful of levels; deeper is not a spec
MAX_VALUES = 2_000_000  # values in one file, counted as a tree


def read_file(path: str | Path) -> Any:
    """Plain data from a .yaml/.yml/.json file; any problem is a SpecError naming the file (and line).

    The file is someone else's: it must be a regular file of at most MAX_SPEC_BYTES, UTF-8, nested
    at most MAX_DEPTH deep, with finite numbers and text without lone surrogates.
    """
    path = Path(path)
    try:
        text = safefiles.read_bounded(path, MAX_SPEC_BYTES if path.suffix == ".json" else MAX_YAML_BYTES
                                      ).decode("utf-8")
    except safefiles.NotReadable as exc:
        raise SpecError(str(path), "", "a readable file", str(exc)) from None
    except UnicodeDecodeError as exc:
        raise SpecError(str(path), "", "UTF-8 text", f"byte {exc.object[exc.start]:#04x} at offset {exc.start}") from None
    try:
        data = json.loads(text, parse_constant=_no_constant) if path.suffix == ".json" else yaml.load(text, Loader=YAML_LOADER)
    except (yaml.YAMLError, ValueError) as exc:
        where, problem = syntax_error_position(exc)
        raise SpecError(str(path), "", "valid YAML/JSON", problem, position=where) from None
    except RecursionError:
        raise SpecError(str(path), "", f"data nested at most {MAX_DEPTH} deep", "deeper") from None
    check_plain(data, str(path))
    return data


def syntax_error_position(exc: Exception) -> tuple[tuple[int, int] | None, str]:
    """((line, column) 1-based or None, the problem in one line) of a YAML or JSON syntax error."""
    if isinstance(exc, json.JSONDecodeError):
        return (exc.lineno, exc.colno), exc.msg
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return None, problem
    return (mark.line + 1, mark.column + 1), problem


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def check_plain(data: Any, file: str | None, path: str = "") -> None:
    """Refuse what no spec holds and what would break a later reader: deep nesting, more than
    MAX_VALUES values (YAML aliases can make a small file a huge tree), NaN/infinity, lone
    surrogates (they cannot be written back as UTF-8). Paths are spelled out only for the error."""
    stack: list[tuple[Any, tuple | None, int]] = [(data, None, 0)]  # (value, (parent chain, key), depth)
    seen = 0
    while stack:
        value, chain, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise SpecError(file, path, f"at most {MAX_VALUES:,} values (YAML aliases expand)", "more")
        if depth > MAX_DEPTH:
            raise SpecError(file, _spell(path, chain), f"data nested at most {MAX_DEPTH} deep", "deeper")
        kind = type(value)
        if kind is float and not math.isfinite(value):
            raise SpecError(file, _spell(path, chain), "a finite number", value)
        if kind is str and not value.isascii():
            _check_text(value, file, _spell(path, chain))
        elif kind is dict:
            for k, v in value.items():
                if type(k) is str and not k.isascii():
                    _check_text(k, file, _spell(path, chain))
                stack.append((v, (chain, k), depth + 1))
        elif kind is list:
            stack.extend((v, (chain, i), depth + 1) for i, v in enumerate(value))


def _spell(path: str, chain: tuple | None) -> str:
    keys = []
    while chain is not None:
        chain, key = chain
        keys.append(key)
    for key in reversed(keys):
        path = f"{path}[{key}]" if isinstance(key, int) else _join(path, str(key))
    return path


def _check_text(text: str, file: str | None, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise SpecError(file, path, "text without lone surrogates", text.encode("utf-8", "backslashreplace")
                        .decode("ascii")) from None


def from_data(cls: type[T], data: Any, file: str | None = None, path: str = "") -> T:
    """Build `cls` from plain data, checking every field's type; raises SpecError naming the field."""
    check_plain(data, file, path)
    return _convert(cls, data, file, path)


def to_data(obj: Any) -> Any:
    """Plain data (dicts, lists, scalars) from a dataclass tree, omitting None values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        if hasattr(obj, "to_file_form"):
            return to_data(obj.to_file_form())
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is not None:
                out[f.name] = to_data(value)
        return out
    if isinstance(obj, dict):
        return {str(k): to_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_data(v) for v in obj]
    return obj


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _convert(tp: Any, data: Any, file: str | None, path: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return data
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if data is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, data, file, path)
            except SpecError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        deeper = [e for e in errors if e.field != path]  # one form got in further: its mistake is the one
        if len(deeper) == 1:
            raise deeper[0]
        raise SpecError(file, path, " or ".join(_describe(a) for a in args if a is not type(None)), data)
    if origin is Literal:
        options = get_args(tp)
        if data not in options:
            close = difflib.get_close_matches(str(data), [str(o) for o in options], n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise SpecError(file, path, "one of " + ", ".join(repr(o) for o in options) + hint, data)
        return data
    if origin in (list, tuple):
        if not isinstance(data, list):
            raise SpecError(file, path, "a list", data)
        (item_tp, *_) = get_args(tp) or (Any,)
        items = [_convert(item_tp, v, file, f"{path}[{i}]") for i, v in enumerate(data)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(data, dict):
            raise SpecError(file, path, "a mapping", data)
        key_tp, val_tp = get_args(tp) or (str, Any)
        return {_convert(key_tp, k, file, path): _convert(val_tp, v, file, _join(path, str(k)))
                for k, v in data.items()}
    if hasattr(tp, "FILE_FORM"):
        return _convert_file_form(tp, data, file, path)
    if dataclasses.is_dataclass(tp):
        return _convert_dataclass(tp, data, file, path)
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise SpecError(file, path, "a number", data)
        return float(data)
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise SpecError(file, path, "an integer", data)
        return data
    if tp is bool:
        if not isinstance(data, bool):
            raise SpecError(file, path, "true or false", data)
        return data
    if tp is str:
        if not isinstance(data, (str, int, float)) or isinstance(data, bool):
            raise SpecError(file, path, "a string", data)
        return str(data)
    raise TypeError(f"unsupported spec type {tp!r} at {path}")


def _convert_file_form(cls: Any, data: Any, file: str | None, path: str) -> Any:
    """A type written in another shape: the shape (`cls.FILE_FORM`) checked, then turned into `cls`."""
    if isinstance(data, cls):
        return data
    entry = _convert(cls.FILE_FORM, data, file, path)
    try:
        return cls.from_file_form(entry)
    except SpecError as exc:  # paths relative to the entry: anchor them here
        raise SpecError(file, _join(path, exc.field) if exc.field else path, exc.expected, exc.got) from None


def _convert_dataclass(cls: Any, data: Any, file: str | None, path: str) -> Any:
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise SpecError(file, path, f"a mapping ({cls.__name__})", data)
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields), key=str)
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), list(fields), n=1)
        hint = f"'{close[0]}' (did you mean it?) or another of " if close else "one of "
        raise SpecError(file, _join(path, str(unknown[0])),
                        hint + "the known fields " + ", ".join(sorted(fields)), "an unknown field")
    kwargs = {}
    for name, f in fields.items():
        sub = _join(path, name)
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SpecError(file, sub, "a value (this field is required)", None)
            continue
        value = _convert(hints[name], data[name], file, sub)
        check = f.metadata.get("check")
        if check is not None and value is not None and not check(value):
            raise SpecError(file, sub, f.metadata.get("expect") or "a valid value", data[name])
        kwargs[name] = value
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate()
        except SpecError as exc:
            # validate() reports paths relative to the object; anchor them here.
            raise SpecError(file, _join(path, exc.field) if exc.field else path, exc.expected, exc.got) from None
    return obj


def _describe(tp: Any) -> str:
    if dataclasses.is_dataclass(tp):
        return f"a mapping ({tp.__name__})"
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(o) for o in get_args(tp))
    if origin in (list, tuple):
        return "a list"
    return {float: "a number", int: "an integer", str: "a string", bool: "true or false"}.get(tp, str(tp))


def positive(x: float) -> bool:
    return x > 0


def non_negative(x: float) -> bool:
    return x >= 0


