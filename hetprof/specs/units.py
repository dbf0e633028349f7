"""Units and the parsing of human-written quantities ("5Gbps", "10ms", "40GiB").

Internally everything is SI base units: seconds, bytes, bytes per second, FLOP per second.
Network rates are written in bits per second by convention, so "1Gbps" is 1.25e8 bytes/s.
"""

from __future__ import annotations

import re

KB, MB, GB, TB = 1e3, 1e6, 1e9, 1e12
KiB, MiB, GiB, TiB = 1024, 1024**2, 1024**3, 1024**4
TFLOPS = 1e12

_SIZE = {"b": 1, "kb": KB, "mb": MB, "gb": GB, "tb": TB, "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB}
_RATE_BITS = {"bps": 1, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "tbps": 1e12, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_RATE_BYTES = {"b/s": 1, "kb/s": KB, "mb/s": MB, "gb/s": GB, "tb/s": TB}
_TIME = {"s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60, "h": 3600}
_NUM = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ/]*)\s*$")


def _parse(text: object, table: dict[str, float], what: str, default_unit: str) -> float:
    if isinstance(text, bool):
        raise ValueError(f"not a {what}: {text!r}")
    if isinstance(text, (int, float)):
        return float(text) * table[default_unit]
    match = _NUM.match(str(text))
    if not match:
        raise ValueError(f"not a {what}: {text!r}")
    number, unit = float(match.group(1)), (match.group(2) or default_unit).lower()
    if unit not in table:
        raise ValueError(f"unknown {what} unit {unit!r} in {text!r} (use one of {', '.join(table)})")
    return number * table[unit]


def parse_size(text: object) -> float:
    """Bytes from '40GB', '24GiB' or a plain number of bytes."""
    return _parse(text, _SIZE, "size", "b")


def parse_rate(text: object) -> float:
    """Bytes per second from '5Gbps' (bits) or '25GB/s' (bytes); a plain number is bytes/s."""
    if isinstance(text, str) and "/" in text:
        return _parse(text, _RATE_BYTES, "rate", "b/s")
    return _parse(text, {**_RATE_BITS, "": 8}, "rate", "") / 8


def parse_duration(text: object) -> float:
    """Seconds from '10ms', '0.5s' or a plain number of seconds."""
    return _parse(text, _TIME, "duration", "s")


def fmt_bytes(n: float) -> str:
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_seconds(t: float) -> str:
    if t >= 1:
        return f"{t:.2f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} µs"


def fmt_rate(bytes_per_s: float) -> str:
    bits = bytes_per_s * 8
    for unit, size in (("Tbps", 1e12), ("Gbps", 1e9), ("Mbps", 1e6), ("kbps", 1e3)):
        if bits >= size:
            return f"{bits / size:.2f} {unit}"
    return f"{bits:.0f} bps"
