"""Row validation shared by the API, `import` and `merge`.

Everything that enters the database from outside (a teammate's export, another team's .db) passes
through `check_row`: types, lengths, allowed characters, JSON shape and the content address. Limits
are generous for real data and tight enough that a hostile file cannot smuggle huge blobs, code or
SQL-looking names into a place where they would be interpreted.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable
from datetime import datetime, timezone

from hetprof.errors import ImportRefused
from hetprof.profiles.content import canonical_json, content_id, flat_json, sample_id
from hetprof.profiles.schema import TABLES, Table

MAX_SHORT = 256
MAX_JSON = 64 * 1024
MAX_MODEL_JSON = 8 * 1024 * 1024
MAX_JSON_DEPTH = 12
SOURCES = ("measured", "reference", "datasheet", "run", "fitted")  # reference: published figures
# The latest stored time: a year short of datetime's last, so it is a date in every local time zone.
MAX_TIME = datetime(datetime.max.year, 1, 1, tzinfo=timezone.utc).timestamp()
DURATION_METRIC = "seconds"  # a measured time: a sample that took no time (or less) was not measured

_IDENT = re.compile(r"^[A-Za-z0-9_.:+-]{1,64}$")
_BENCHMARK = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+){1,4}$")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,63}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_CONTROL = re.compile(r"[\x00-\x1f]")
_FLOAT_INTS = 2**1023  # an integer at least this large has no finite float value
_NON_TEXT_SCALARS = frozenset({int, float, bool, type(None)})  # exact types; subclasses take the long way


class Invalid(ValueError):
    """A value broke a rule; the message says which."""


def _short(v: object) -> None:
    if not isinstance(v, str):
        raise Invalid(f"expected text, got {type(v).__name__}")
    if len(v) > MAX_SHORT:
        raise Invalid(f"text longer than {MAX_SHORT} characters ({len(v)})")
    if _CONTROL.search(v):
        raise Invalid("text contains control characters")


def _ident(v: object) -> None:
    if not isinstance(v, str) or not _IDENT.match(v):
        raise Invalid(f"expected an identifier [A-Za-z0-9_.:+-], got {str(v)[:40]!r}")


def _benchmark(v: object) -> None:
    if not isinstance(v, str) or not _BENCHMARK.match(v):
        raise Invalid(f"expected a benchmark name like 'compute.matmul', got {str(v)[:40]!r}")


def _count(v: object) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0 or v > 2**62:
        raise Invalid(f"expected a non-negative integer, got {v!r}"[:80])


def _int(v: object) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or abs(v) > 2**62:
        raise Invalid(f"expected an integer, got {v!r}"[:80])


def _real(v: object) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Invalid(f"expected a finite number, got {v!r}"[:80])
    if isinstance(v, int) and abs(v) >= _FLOAT_INTS or not math.isfinite(v):  # isfinite overflows on those
        raise Invalid(f"expected a finite number, got {v!r}"[:80])


def _float(v: object) -> None:
    """A REAL column holds floats only: SQLite stores 1 as 1.0, so an int would come back with another id."""
    if type(v) is not float:
        raise Invalid(f"expected a finite float, got {v!r}"[:80])
    _real(v)


def _time(v: object) -> None:
    """A Unix time every reader can show as a date: from the epoch up to MAX_TIME."""
    _float(v)
    if not 0.0 <= v <= MAX_TIME:  # type: ignore[operator]
        raise Invalid(f"expected a time between 1970 and 9999 (0 to {MAX_TIME:.0f} s), got {v!r}")


def _seconds(v: object) -> None:
    _float(v)
    if v < 0:  # type: ignore[operator]
        raise Invalid(f"expected a non-negative duration, got {v!r}")


def _duration(v: object) -> None:
    """A measured time: a run that took no time (or less) was not measured."""
    _float(v)
    if not v > 0:  # type: ignore[operator]
        raise Invalid(f"expected a positive duration in seconds, got {v!r}")


def _rate(v: object) -> None:
    _float(v)
    if not v > 0:  # type: ignore[operator]
        raise Invalid(f"expected a positive rate, got {v!r}")


def _source(v: object) -> None:
    if v not in SOURCES:
        raise Invalid(f"expected a source in {SOURCES}, got {str(v)[:40]!r}")


def _id(v: object) -> None:
    if not isinstance(v, str) or not _HEX64.match(v):
        raise Invalid(f"expected a 64-hex-digit row id, got {str(v)[:40]!r}")


def _id_or_empty(v: object) -> None:
    if v != "":
        _id(v)


def _parse_json(v: object, limit: int, nested: bool = True) -> object:
    """Parse untrusted JSON text, checking it is canonical; `nested=False` leaves the depth walk and the
    canonical check to callers that reject nesting (they check flat maps faster)."""
    if not isinstance(v, str):
        raise Invalid(f"expected JSON text, got {type(v).__name__}")
    if len(v) > limit:
        raise Invalid(f"JSON longer than {limit} bytes ({len(v)})")
    try:
        # raw_decode skips decode's two whitespace scans; text it does not consume whole is refused.
        parsed, end = _DECODER.raw_decode(v)
    except (ValueError, RecursionError) as exc:
        raise Invalid(f"not valid JSON ({exc})") from None
    if end != len(v):
        raise Invalid(f"not valid JSON (extra text at character {end})")
    if nested:
        _check_depth(parsed, 0)
        _check_canonical(parsed, v, canonical_json)
    return parsed


def _check_canonical(parsed: object, text: str, encode: Callable[[object], str]) -> None:
    """Content addresses hash the text, so it must be the one canonical spelling of its value:
    otherwise the same measurement re-spelled (a space, reordered or duplicated keys) would land twice."""
    try:
        again = encode(parsed)
    except ValueError:
        raise Invalid("JSON holds a non-finite number (NaN or infinity)") from None
    except RecursionError:
        raise Invalid(f"JSON nested deeper than {MAX_JSON_DEPTH}") from None
    if again != text:
        raise Invalid("JSON is not in canonical form (sorted keys, no spaces, no duplicate keys)")


def _no_constant(name: str) -> None:
    raise Invalid(f"JSON constant {name} is not allowed")


# One decoder for all rows: json.loads with a hook builds a new decoder per call.
_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def _check_depth(value: object, depth: int) -> None:
    if depth > MAX_JSON_DEPTH:
        raise Invalid(f"JSON nested deeper than {MAX_JSON_DEPTH}")
    if isinstance(value, dict):
        for k, v in value.items():
            if len(k) > MAX_SHORT:
                raise Invalid("JSON key longer than 256 characters")
            _check_depth(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _check_depth(v, depth + 1)


def _json_object(v: object) -> None:
    if not isinstance(_parse_json(v, MAX_JSON), dict):
        raise Invalid("expected a JSON object")


def _json_model(v: object) -> None:
    if not isinstance(_parse_json(v, MAX_MODEL_JSON), dict):
        raise Invalid("expected a JSON object")


def _json_flat_params(v: object) -> None:
    parsed = _parse_json(v, MAX_JSON, nested=False)
    check_flat(parsed, numbers_only=False)
    _check_canonical(parsed, v, flat_json)  # type: ignore[arg-type]  # checked flat, so the fast encoder


def _json_flat_metrics(v: object) -> None:
    parsed = _parse_json(v, MAX_JSON, nested=False)
    check_flat(parsed, numbers_only=True)
    _check_canonical(parsed, v, flat_json)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=256)  # small: a hostile file's unique key sets cannot hoard memory
def _plain_keys(keys: tuple[object, ...]) -> bool:
    # Samples repeat a few key sets across millions of rows (m, n, k, seconds...): match each once.
    return all(isinstance(k, str) and _KEY.match(k) for k in keys)


def _bad_key(parsed: dict) -> Invalid:
    bad = next(k for k in parsed if not _plain_keys((k,)))
    return Invalid(f"key {str(bad)[:40]!r} is not a plain name")


def check_flat(parsed: object, numbers_only: bool) -> None:
    """A flat {name: scalar} map (sample params) or {name: finite number} map (sample metrics).

    Runs twice per sample on every write and every imported row, so key sets are matched once per
    spelling and common values (floats, ints, short strings) are judged inline; anything else goes
    to the generic checkers, whose messages name the key.
    """
    if not isinstance(parsed, dict):
        raise Invalid("expected a JSON object")
    if not _plain_keys(tuple(parsed)):
        raise _bad_key(parsed)
    if numbers_only:
        for key, val in parsed.items():
            kind = type(val)
            if kind is float and val - val == 0.0 or kind is int and -_FLOAT_INTS < val < _FLOAT_INTS:
                continue  # finite (inf - inf and nan - nan are nan)
            try:
                _real(val)
            except Invalid as exc:
                raise Invalid(f"value of {key!r}: {exc}") from None
        duration = parsed.get(DURATION_METRIC)
        if duration is not None and not duration > 0:
            raise Invalid(f"value of {DURATION_METRIC!r}: expected a positive duration in seconds, got {duration!r}")
        return
    for key, val in parsed.items():
        if type(val) in _NON_TEXT_SCALARS:
            continue  # the common case, judged by one set lookup
        if not (val is None or isinstance(val, (bool, int, float, str))):
            raise Invalid(f"value of {key!r} must be a scalar")
        if isinstance(val, str) and (len(val) > MAX_SHORT or _CONTROL.search(val)):
            try:
                _short(val)
            except Invalid as exc:
                raise Invalid(f"value of {key!r}: {exc}") from None


def _json_str_list(v: object) -> None:
    parsed = _parse_json(v, MAX_JSON)
    if not isinstance(parsed, list) or not all(isinstance(x, str) and len(x) <= MAX_SHORT for x in parsed):
        raise Invalid("expected a JSON list of short strings")


VALIDATORS: dict[str, Callable[[object], None]] = {
    "short": _short, "ident": _ident, "benchmark": _benchmark, "count": _count, "int": _int,
    "real": _float, "seconds": _seconds, "duration": _duration, "rate": _rate, "time": _time, "source": _source, "id": _id,
    "id_or_empty": _id_or_empty, "json_object": _json_object, "json_model": _json_model,
    "json_flat_params": _json_flat_params, "json_flat_metrics": _json_flat_metrics,
    "json_str_list": _json_str_list,
}


# Per table, each column with its checker: looked up once here instead of per value.
_CHECKS: dict[str, tuple[tuple[str, bool, Callable[[object], None]], ...]] = {
    t.name: tuple((f"{t.name}.{c.name}", c.nullable, VALIDATORS[c.kind]) for c in t.columns)
    for t in TABLES.values()}


def check_values(table: Table, values: tuple | list) -> None:
    """Validate a row's content values (without id); raises Invalid naming the column."""
    checks = _CHECKS[table.name]
    if len(values) != len(checks):
        raise Invalid(f"{table.name}: expected {len(checks)} values, got {len(values)}")
    for (name, nullable, check), val in zip(checks, values, strict=True):
        if val is None:
            if not nullable:
                raise Invalid(f"{name}: missing")
            continue
        try:
            check(val)
        except Invalid as exc:
            raise Invalid(f"{name}: {exc}") from None


def _sample_column(name: str, value: object, check: Callable[[object], None]) -> None:
    if value is None:
        raise Invalid(f"samples.{name}: missing")
    try:
        check(value)
    except Invalid as exc:
        raise Invalid(f"samples.{name}: {exc}") from None


_CACHED_PARAMS = 512  # longest params text remembered: 8192 of them hold at most 4 MiB


@functools.lru_cache(maxsize=8192)
def _params_seen(text: str) -> None:
    """`_json_flat_params`, remembered per text: a sweep stores each point's params once per repeat,
    so a million samples hold a few thousand distinct params. Refusals raise and are not remembered."""
    _json_flat_params(text)


def _sample_params(value: object) -> None:
    if type(value) is str and len(value) <= _CACHED_PARAMS:
        _params_seen(value)
    else:
        _json_flat_params(value)


def check_sample(row: tuple | list) -> None:
    """Validate a samples row (id first) from an untrusted source; raises Invalid or UnicodeEncodeError."""
    if len(row) != 5:
        raise Invalid(f"samples: expected 5 columns, got {len(row)}")
    _id(row[0])
    _sample_column("run_id", row[1], _id)
    _sample_column("seq", row[2], _count)
    _sample_column("params", row[3], _sample_params)
    _sample_column("metrics", row[4], _json_flat_metrics)
    if sample_id(*row[1:]) != row[0]:
        raise Invalid("samples: row id does not match its content (altered or corrupt row)")


def check_row(table: Table, row: tuple | list, where: str) -> None:
    """Validate a full row (id first) from an untrusted source; raises ImportRefused."""
    try:
        if table.name == "samples":
            check_sample(row)
            return
        if len(row) != len(table.columns) + 1:
            raise Invalid(f"{table.name}: expected {len(table.columns) + 1} columns, got {len(row)}")
        _id(row[0])
        check_values(table, row[1:])
        expected = sample_id(*row[1:]) if table.name == "samples" else content_id(table.name, row[1:],
                                                                                  table.json_flags)
        if expected != row[0]:
            raise Invalid(f"{table.name}: row id does not match its content (altered or corrupt row)")
    except UnicodeEncodeError:
        raise ImportRefused(f"{where}: {table.name}: text is not valid Unicode (a lone surrogate)") from None
    except Invalid as exc:
        raise ImportRefused(f"{where}: {exc}") from None
