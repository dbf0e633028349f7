"""Canonical JSON and content addresses.

A row's id is the sha256 of its content written as canonical JSON, so the same measurement made
anywhere gets the same id and merging two databases can never duplicate it. Canonical means: keys
sorted, no whitespace, UTF-8 kept as is, no NaN/Infinity (they have no portable JSON spelling).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_encode = _ENCODER.encode


def canonical_json(value: object) -> str:
    """The one spelling of `value` that every writer agrees on; raises ValueError for NaN/Infinity."""
    return _encode(value)


def _not_json(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# The C encoder `_ENCODER.encode` builds afresh on every call, built once with the same settings.
# It keeps no record of the containers it is inside (that record is what catches cycles), so it
# is only for flat maps, which cannot contain themselves.
_C_FLAT = json.encoder.c_make_encoder and json.encoder.c_make_encoder(
    None, _not_json, json.encoder.c_encode_basestring, None, ":", ",", True, False, False)


def flat_json(value: dict) -> str:
    """`canonical_json` of a map already checked to be flat (sample params and metrics): the hot path."""
    if _C_FLAT is None:  # a Python without the C accelerator
        return _encode(value)
    return "".join(_C_FLAT(value, 0))


def _piece(value: object, is_json_text: bool) -> str:
    if is_json_text:
        return value  # type: ignore[return-value]  # already canonical JSON text
    if value is None:
        return "null"
    return _encode(value)


def content_id(table: str, values: Sequence[object], json_text: Sequence[bool]) -> str:
    """sha256 over canonical JSON of [table, *values].

    Columns flagged in `json_text` hold canonical JSON text and are spliced in unparsed, which is
    what makes verifying a million imported rows cheap: the hash input is exactly the canonical
    JSON of the parsed row, without a second encode.
    """
    parts = [_encode(table)]
    parts.extend(_piece(v, j) for v, j in zip(values, json_text, strict=True))
    return hashlib.sha256(("[" + ",".join(parts) + "]").encode()).hexdigest()


def sample_id(run_id: str, seq: int, params_json: str, metrics_json: str) -> str:
    """`content_id` of a samples row, spelled out: the hot path of profilers, imports and merges.

    Only for values already checked (a hex run id and an integer seq need no JSON escaping), where it
    yields exactly the text `content_id("samples", ...)` hashes, without the generic per-column work.
    """
    text = f'["samples","{run_id}",{seq},{params_json},{metrics_json}]'
    return hashlib.sha256(text.encode()).hexdigest()
