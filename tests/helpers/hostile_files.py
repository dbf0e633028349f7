"""Builders of the files an adversary would share: exports with chosen lines, databases with chosen tables."""

from __future__ import annotations

import gzip
import hashlib
import json
import sqlite3
from pathlib import Path

from hetprof.profiles import DeviceInfo, ProfileDB
from hetprof.profiles.content import content_id
from hetprof.profiles.schema import SCHEMA_VERSION, TABLES


def fill(path: Path, host: str = "node-a", n: int = 20, name: str = "cpu") -> str:
    """A small real profile: a device, a run of `n` samples, a link, a run record, a model. Returns the run id."""
    with ProfileDB(path) as db:
        dev = db.add_device(DeviceInfo(name=name, kind="cpu", catalog_type="cpu", host=host, extra={"cores": 2}))
        run = db.add_benchmark("compute.matmul", dev, host, {"dtype": "fp32"},
                               [{"params": {"m": 64 * (i + 1), "n": 64}, "metrics": {"seconds": 1e-3 * (i + 1)}}
                                for i in range(n)])
        db.add_link(host, "node-z", 1e-3, 6e7, residual=0.01, run_id=run)
        db.add_run_records([{"run": "r1", "plan_hash": "p", "iteration": 0, "task": "iteration",
                             "seconds": 1.5, "predicted_s": 1.4, "device_ids": [f"{host}:0"]}])
        db.add_cost_model("fitted", "task.decode", "gbr", {"trees": [[1, 2]]}, {"mape": 0.05})
    return run


def dump(path: Path) -> dict:
    with ProfileDB(path) as db:
        return db.dump()


def file_bytes(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


def export_lines(lines: list[bytes], counts: dict[str, int] | None = None) -> bytes:
    """A gzip'd export of these row lines, with a matching header, checksum and counts trailer."""
    body = hashlib.sha256()
    for line in lines:
        body.update(line)
    if counts is None:
        counts = {name: 0 for name in TABLES}
        for line in lines:
            counts[json.loads(line)[0]] += 1
    header = {"format": "hetprof-profile-export", "format_version": 1, "schema_version": SCHEMA_VERSION}
    trailer = {"end": True, "counts": counts, "body_sha256": body.hexdigest()}
    text = json.dumps(header).encode() + b"\n" + b"".join(lines) + json.dumps(trailer).encode() + b"\n"
    return gzip.compress(text, compresslevel=1)


def row_line(table: str, values: list, spelled: dict[int, str] | None = None) -> bytes:
    """One export line of `table` with a correct content id; `spelled` gives JSON columns' exact text
    (the id is computed over that text, as an adversary recomputing ids would)."""
    t = TABLES[table]
    values = list(values)
    for i, text in (spelled or {}).items():
        values[i] = text
    rid = content_id(table, values, t.json_flags)
    return (json.dumps([table, rid, *values], ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def device_values(name: str = "cpu", host: str = "node-a") -> list:
    return [name, "cpu", "cpu", None, host, None, None, None, None, "{}", "measured"]


def run_values(device_id: str | None, n: int, host: str = "node-a") -> list:
    return ["compute.matmul", device_id, host, "{}", n, "0.1", 1.0, "measured"]


def sample_line(run_id: str, seq: int, params: str = '{"m":1}', metrics: str = '{"seconds":0.001}') -> bytes:
    return row_line("samples", [run_id, seq, params, metrics])


def line_id(line: bytes) -> str:
    return json.loads(line)[1]


def database_with(path: Path, statements: list[str]) -> None:
    """A real profile database, then the given SQL applied to it (replacing tables with views, say)."""
    fill(path)
    conn = sqlite3.connect(path)
    conn.executescript(";".join(statements))
    conn.commit()
    conn.close()
