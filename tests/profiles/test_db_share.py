"""Sharing between teams: export/import round trips, idempotent merges, and hostile files refused."""

from __future__ import annotations

import gzip
import hashlib
import json
import pickle
import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from hetprof.cli import cli
from hetprof.errors import ImportRefused
from hetprof.profiles import DeviceInfo, ProfileDB, export, import_file, merge
from hetprof.profiles.content import content_id
from hetprof.profiles.schema import TABLES


def fill(path: Path, host: str = "node-a", n: int = 20) -> None:
    with ProfileDB(path) as db:
        dev = db.add_device(DeviceInfo(name="cpu", kind="cpu", catalog_type="cpu", host=host,
                                       extra={"cores": 2}))
        run = db.add_benchmark("compute.matmul", dev, host, {"dtype": "fp32"},
                               [{"params": {"m": 64 * (i + 1), "n": 64, "k": 64, "dtype": "fp32"},
                                 "metrics": {"seconds": 1e-3 * (i + 1), "tflops": 0.1}} for i in range(n)])
        db.add_link(host, "node-z", 1e-3, 6e7, residual=0.01, run_id=run, src_region="eu", dst_region="us")
        db.add_run_records([{"run": "r1", "plan_hash": "p", "iteration": 0, "task": "actor_gen",
                             "seconds": 1.5, "predicted_s": 1.4, "device_ids": [f"{host}:0"], "host": host}])
        db.add_cost_model("fitted", "task.decode", "gbr", {"trees": [[1, 2]]}, {"heldout_mape": 0.05},
                          db.snapshot_hash())


def dump(path: Path) -> dict:
    with ProfileDB(path) as db:
        return db.dump()


def test_export_import_round_trip_is_identical(tmp_path):
    a, b, f = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "a.hpx"
    fill(a)
    with ProfileDB(a) as db:
        export(db, f)
    with ProfileDB(b) as db:
        added = import_file(db, f)
        assert added["samples"] == 20
        again = import_file(db, f)
        assert sum(again.values()) == 0  # importing twice adds nothing
    assert dump(a) == dump(b)


def test_merge_twice_equals_merge_once(tmp_path):
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    fill(a, "node-a")
    fill(b, "node-b")
    merged_once = tmp_path / "once.db"
    with ProfileDB(b) as db:
        merge(db, a)
    shutil.copy(b, merged_once)
    with ProfileDB(b) as db:
        assert sum(merge(db, a).values()) == 0
    assert dump(b) == dump(merged_once)
    with ProfileDB(b) as db:
        info = db.info()
        assert set(info["hosts"]) >= {"node-a", "node-b"}
        assert [o["kind"] for o in info["origins"]] == ["merge", "merge"]  # provenance of each merge


def test_export_filters_keep_references_whole(tmp_path):
    a, f, c = tmp_path / "a.db", tmp_path / "h.hpx", tmp_path / "c.db"
    fill(a, "node-a")
    with ProfileDB(a) as db:
        other = db.add_device(DeviceInfo(name="cpu", kind="cpu", host="node-b"))
        db.add_benchmark("memory.copy", other, "node-b", {}, [{"params": {"size_bytes": 1}, "metrics": {"seconds": 1.0}}])
        counts = export(db, f, host="node-a")
    assert counts["devices"] == 1 and counts["samples"] == 20 and counts["links"] == 1
    with ProfileDB(c) as db:
        import_file(db, f)  # references resolve inside the file
        assert set(db.devices()["host"]) == {"node-a"}


# ---- hostile and broken files -------------------------------------------------------------------

def _lines(path: Path) -> list[bytes]:
    return gzip.decompress(path.read_bytes()).splitlines(keepends=True)


def _write(path: Path, lines: list[bytes], fix_checksum: bool = True) -> Path:
    if fix_checksum:  # an attacker can recompute the checksum; validation must not rely on it alone
        body = [ln for ln in lines[1:] if not ln.startswith(b"{")]
        trailer = json.loads(lines[-1])
        trailer["body_sha256"] = hashlib.sha256(b"".join(body)).hexdigest()
        counts = {name: 0 for name in TABLES}
        for ln in body:
            try:
                counts[json.loads(ln)[0]] += 1
            except Exception:  # noqa: BLE001 - malformed on purpose
                pass
        trailer["counts"] = counts
        lines = [*lines[:-1], (json.dumps(trailer) + "\n").encode()]
    path.write_bytes(gzip.compress(b"".join(lines)))
    return path


def _row_line(table: str, values: list) -> bytes:
    rid = content_id(table, values, TABLES[table].json_flags)
    return (json.dumps([table, rid, *values]) + "\n").encode()


def _sample_values(lines: list[bytes]) -> list:
    for ln in lines:
        item = json.loads(ln)
        if isinstance(item, list) and item[0] == "samples":
            return item[2:]
    raise AssertionError


def _hostile_files(good: Path, tmp: Path) -> dict[str, Path]:
    lines = _lines(good)
    sv = _sample_values(lines)
    raw = good.read_bytes()
    files: dict[str, Path] = {}

    def add(name: str, data: bytes) -> None:
        files[name] = tmp / f"{name}.hpx"
        files[name].write_bytes(data)

    add("empty", b"")
    add("not_gzip", b"hello, I am plain text\n")
    add("pickle", pickle.dumps({"a": 1}))
    add("gzip_of_pickle", gzip.compress(pickle.dumps(object)))
    add("truncated_gzip", raw[: len(raw) // 2])
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 0x40
    add("bit_flip", bytes(flipped))
    add("sqlite_file_renamed", (tmp / "a.db").read_bytes() if (tmp / "a.db").exists() else b"SQLite format 3\0")
    files["no_end_marker"] = _write(tmp / "no_end.hpx", lines[:-1], fix_checksum=False)
    files["truncated_rows"] = _write(tmp / "trunc_rows.hpx", [*lines[:3], lines[-1]], fix_checksum=False)
    files["wrong_format"] = _write(tmp / "wf.hpx", [b'{"format": "other"}\n', *lines[1:]])
    head = json.loads(lines[0])
    files["newer_schema"] = _write(tmp / "ns.hpx", [(json.dumps({**head, "schema_version": 999}) + "\n").encode(),
                                                     *lines[1:]])
    files["header_not_json"] = _write(tmp / "hnj.hpx", [b"{not json\n", *lines[1:]], fix_checksum=False)
    assert any(b'\\"tflops\\":0.1' in ln for ln in lines)
    tampered = [ln.replace(b'\\"tflops\\":0.1', b'\\"tflops\\":9.9') for ln in lines]
    files["altered_value_same_id"] = _write(tmp / "alt.hpx", tampered)
    files["checksum_mismatch"] = _write(tmp / "cm.hpx", tampered, fix_checksum=False)
    files["unknown_table"] = _write(tmp / "ut.hpx", [*lines[:-1], b'["sqlite_master", "x"]\n', lines[-1]])
    files["missing_column"] = _write(tmp / "mc.hpx", [*lines[:-1], _row_line("samples", sv)[:-3] + b"]\n",
                                                      lines[-1]])
    files["extra_column"] = _write(tmp / "ec.hpx", [*lines[:-1], (json.dumps(
        ["samples", "0" * 64, *sv, "extra"]) + "\n").encode(), lines[-1]])
    files["wrong_type"] = _write(tmp / "wt.hpx", [*lines[:-1], _row_line("samples", [sv[0], "one", *sv[2:]]),
                                                  lines[-1]])
    files["huge_string"] = _write(tmp / "hs.hpx", [*lines[:-1], _row_line(
        "devices", ["x" * 100_000, "cpu", None, None, "h", None, None, None, None, "{}", "measured"]), lines[-1]])
    files["sql_in_benchmark_name"] = _write(tmp / "sql.hpx", [*lines[:-1], _row_line(
        "runs", ["x'); DROP TABLE samples; --", None, "h", "{}", 0, "0", 1.0, "measured"]), lines[-1]])
    files["nan_metric"] = _write(tmp / "nan.hpx", [*lines[:-1], _row_line(
        "samples", [sv[0], 999, '{"m":1}', '{"seconds":NaN}']), lines[-1]])
    files["nested_metric"] = _write(tmp / "nest.hpx", [*lines[:-1], _row_line(
        "samples", [sv[0], 998, '{"m":1}', '{"seconds":{"__reduce__":"os.system"}}']), lines[-1]])
    deep = "[" * 200 + "]" * 200
    files["deep_json"] = _write(tmp / "deep.hpx", [*lines[:-1], _row_line(
        "devices", ["x", "cpu", None, None, "h", None, None, None, None, '{"a":' + deep + "}", "measured"]),
        lines[-1]])
    files["dangling_reference"] = _write(tmp / "dr.hpx", [*lines[:-1], _row_line(
        "samples", ["f" * 64, 0, '{"m":1}', '{"seconds":1.0}']), lines[-1]])
    files["bad_source"] = _write(tmp / "bs.hpx", [*lines[:-1], _row_line(
        "devices", ["x", "cpu", None, None, "h", None, None, None, None, "{}", "trusted"]), lines[-1]])
    files["control_chars"] = _write(tmp / "cc.hpx", [*lines[:-1], _row_line(
        "devices", ["x\x1b[2J", "cpu", None, None, "h", None, None, None, None, "{}", "measured"]), lines[-1]])
    files["negative_count"] = _write(tmp / "neg.hpx", [*lines[:-1], _row_line(
        "samples", [sv[0], -5, '{"m":1}', '{"seconds":1.0}']), lines[-1]])
    files["data_after_end"] = _write(tmp / "dae.hpx", [*lines, lines[1]], fix_checksum=False)
    files["counts_lie"] = tmp / "cl.hpx"
    trailer = json.loads(lines[-1])
    trailer["counts"]["samples"] += 1
    files["counts_lie"].write_bytes(gzip.compress(b"".join([*lines[:-1], (json.dumps(trailer) + "\n").encode()])))
    return files


def test_hostile_files_are_refused_and_the_database_is_unchanged(tmp_path):
    a, target, good = tmp_path / "a.db", tmp_path / "target.db", tmp_path / "good.hpx"
    fill(a)
    with ProfileDB(a) as db:
        export(db, good)
    fill(target, "node-t")
    before = dump(target)
    files = _hostile_files(good, tmp_path)
    assert len(files) >= 20
    for name, path in files.items():
        with ProfileDB(target) as db, pytest.raises(ImportRefused) as info:
            import_file(db, path)
        message = str(info.value)
        assert str(path) in message, (name, message)
        assert dump(target) == before, name
    with ProfileDB(target) as db:
        assert db.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.info()["origins"] == []


def test_a_hostile_database_is_refused_by_merge(tmp_path):
    a, target = tmp_path / "a.db", tmp_path / "t.db"
    fill(a)
    fill(target, "node-t")
    before = dump(target)
    conn = sqlite3.connect(a)
    conn.execute("UPDATE samples SET metrics = '{\"seconds\":0.5,\"tflops\":0.1}' WHERE seq = 3")
    conn.commit()
    conn.close()
    with ProfileDB(target) as db, pytest.raises(ImportRefused, match="does not match its content"):
        merge(db, a)
    assert dump(target) == before
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"garbage" * 1000)
    with ProfileDB(target) as db, pytest.raises(ImportRefused, match="not a readable"):
        merge(db, junk)
    assert dump(target) == before


def test_cli_info_export_import_merge_list_show(tmp_path):
    a, b, f = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "a.hpx"
    fill(a)
    runner = CliRunner()
    out = runner.invoke(cli, ["--db", str(a), "db", "info", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["counts"]["samples"] == 20 and data["hosts"] == ["node-a", "node-z"]
    assert runner.invoke(cli, ["--db", str(a), "db", "export", str(f)]).exit_code == 0
    out = runner.invoke(cli, ["db", "import", str(f), "--db", str(b)])
    assert out.exit_code == 0 and "20 samples" in out.output, out.output
    out = runner.invoke(cli, ["--db", str(b), "db", "merge", str(a)])
    assert out.exit_code == 0 and "added 0 devices" in out.output
    out = runner.invoke(cli, ["--db", str(b), "db", "list", "--benchmark", "compute."])
    assert out.exit_code == 0 and "compute.matmul" in out.output
    with ProfileDB(b) as db:
        run_id = db.runs()["id"][0]
    out = runner.invoke(cli, ["--db", str(b), "db", "show", run_id[:10]])
    assert out.exit_code == 0 and "samples (20 of 20)" in out.output, out.output
    out = runner.invoke(cli, ["--db", str(b), "db", "import", str(tmp_path / "missing.hpx")])
    assert out.exit_code != 0 and "no such file" in out.output


def _many_runs(path: Path, host: str, runs: int = 12) -> None:
    with ProfileDB(path) as db:
        dev = db.add_device(DeviceInfo(name="cpu", kind="cpu", host=host))
        for r in range(runs):
            db.add_benchmark("memory.copy", dev, host, {"r": r},
                             [{"params": {"size_bytes": i, "r": r}, "metrics": {"seconds": 1e-3 * (i + 1)}}
                              for i in range(50)])


def test_a_large_merge_is_checked_in_two_processes_and_equals_the_in_process_merge(tmp_path, monkeypatch):
    from hetprof.profiles import staging

    a, serial, parallel = tmp_path / "a.db", tmp_path / "serial.db", tmp_path / "parallel.db"
    _many_runs(a, "node-a")
    _many_runs(serial, "node-b")
    shutil.copy(serial, parallel)
    with ProfileDB(serial) as db:
        merge(db, a)
    monkeypatch.setattr(staging, "MIN_ROWS", 1)
    with ProfileDB(parallel) as db:
        src = sqlite3.connect(a)
        assert len(staging.plan(src)) == 2  # the staging path is the one under test
        src.close()
        assert merge(db, a)["samples"] == 600
        assert sum(merge(db, a).values()) == 0
    assert dump(parallel) == dump(serial)


@pytest.mark.parametrize("which", ["first", "last"])  # the range this process checks, and the worker's
def test_a_hostile_sample_is_refused_in_either_staged_range(tmp_path, monkeypatch, which):
    from hetprof.profiles import staging

    a, target = tmp_path / "a.db", tmp_path / "t.db"
    _many_runs(a, "node-a")
    _many_runs(target, "node-t")
    before = dump(target)
    conn = sqlite3.connect(a)
    run = conn.execute(f"SELECT run_id FROM samples ORDER BY run_id {'ASC' if which == 'first' else 'DESC'}").fetchone()[0]
    conn.execute("UPDATE samples SET metrics = '{\"seconds\":7.0}' WHERE run_id = ? AND seq = 3", (run,))
    conn.commit()
    conn.close()
    monkeypatch.setattr(staging, "MIN_ROWS", 1)
    with ProfileDB(target) as db, pytest.raises(ImportRefused, match="does not match its content") as info:
        merge(db, a)
    assert str(a) in str(info.value)
    assert dump(target) == before
