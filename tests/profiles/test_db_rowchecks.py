"""Row validation's fast paths refuse and accept exactly what the generic checkers do."""

from __future__ import annotations

import json

import pytest

from hetprof.errors import ImportRefused
from hetprof.profiles.content import canonical_json, flat_json, sample_id
from hetprof.profiles.rowchecks import Invalid, check_flat, check_row
from hetprof.profiles.schema import TABLES

RUN = "cd" * 32
GOOD_PARAMS = [{}, {"m": 1, "dtype": "bf16", "flag": True, "none": None, "x": -0.0, "big": 2**62},
               {"name": "ü\\\"quoted\"", "s": "x" * 256, "f": 1e300, "n.sub_key": 3}]
GOOD_METRICS = [{}, {"seconds": 1e-4, "tflops": 1100.0}, {"n": 3, "neg": -2.5, "big": 2**1022, "tiny": 5e-324}]
BAD_PARAMS = [[], "x", {"m": [1]}, {"m": {"a": 1}}, {"s": "x" * 257}, {"s": "a\x1bb"}, {"s": "tab\t"},
              {"1bad": 1}, {"": 1}, {"k" * 65: 1}, {"sp ace": 1}, {"m;drop": 1}]
BAD_METRICS = [{"s": "1"}, {"s": None}, {"s": True}, {"s": float("nan")}, {"s": float("inf")},
               {"s": -float("inf")}, {"s": 2**1023}, {"s": -(10**400)}, {"s": [1.0]}, {"bad key": 1.0}]


@pytest.mark.parametrize("value", GOOD_PARAMS + GOOD_METRICS)
def test_flat_json_is_canonical_json(value):
    assert flat_json(value) == canonical_json(value)


def test_flat_json_refuses_what_canonical_json_refuses():
    for bad in ({"s": float("nan")}, {"s": float("inf")}, {"s": object()}):
        with pytest.raises((ValueError, TypeError)):
            flat_json(bad)


@pytest.mark.parametrize("value", GOOD_PARAMS)
def test_good_params_pass(value):
    check_flat(value, numbers_only=False)


@pytest.mark.parametrize("value", GOOD_METRICS)
def test_good_metrics_pass(value):
    check_flat(value, numbers_only=True)


@pytest.mark.parametrize("value", BAD_PARAMS + BAD_METRICS[-1:])
def test_bad_params_are_refused(value):
    with pytest.raises(Invalid):
        check_flat(value, numbers_only=False)


@pytest.mark.parametrize("value", BAD_PARAMS + BAD_METRICS)
def test_bad_metrics_are_refused(value):
    with pytest.raises(Invalid):
        check_flat(value, numbers_only=True)


def _row(params: str, metrics: str, seq: int = 0) -> tuple:
    return (sample_id(RUN, seq, params, metrics), RUN, seq, params, metrics)


def test_a_sample_row_with_a_matching_id_passes():
    check_row(TABLES["samples"], _row('{"m":1}', '{"seconds":1.0}'), "here")


@pytest.mark.parametrize(("params", "metrics"), [
    ('{"m":1}', '{"seconds":1' + "0" * 400 + "}"),  # an integer too large for a float: refused, not a crash
    ('{"m":1}', '{"seconds":1.0} {"x":2}'),           # trailing text after the object
    ('{"m":1}', '{"seconds":1.0}x'),
    ('{"m":1}', '{"seconds":Infinity}'),
    ('{"m":1}', '{"seconds":-Infinity}'),
    ('{"m":1}', "null"),
    ('[1]', '{"seconds":1.0}'),
    ('{"m":1', '{"seconds":1.0}'),
    ('{"m":"\\u001b[2J"}', '{"seconds":1.0}'),  # an escaped control character is still one
    ('{"m":1}', '{"1x":1.0}'),
])
def test_hostile_sample_rows_are_refused(params, metrics):
    with pytest.raises(ImportRefused, match="here"):
        check_row(TABLES["samples"], _row(params, metrics), "here")


def test_a_sample_whose_id_does_not_match_is_refused():
    sid, *rest = _row('{"m":1}', '{"seconds":1.0}')
    for altered in ([RUN, 1, *rest[2:]], [RUN, 0, '{"m":2}', rest[3]], ["ab" * 32, *rest[1:]]):
        with pytest.raises(ImportRefused, match="does not match its content"):
            check_row(TABLES["samples"], (sid, *altered), "here")


def test_large_json_and_key_sets_are_bounded():
    huge = json.dumps({f"k{i}": 1.0 for i in range(10_000)}, separators=(",", ":"))
    with pytest.raises(ImportRefused, match="longer than"):
        check_row(TABLES["samples"], _row('{"m":1}', huge), "here")
