"""The profile database under concurrent writers, killed writers, migrations and the pandas views."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from helpers.old_databases import sample, v3_database

from hetprof.errors import ProfileDBError
from hetprof.profiles import DeviceInfo, ProfileDB, merge
from hetprof.profiles.content import canonical_json, sample_id
from hetprof.profiles.schema import SCHEMA_VERSION, TABLES, _ddl


def _writer(path: str, writer: int, batches: int, per_batch: int) -> None:
    with ProfileDB(path) as db:
        dev = db.add_device(DeviceInfo(name=f"cpu-{writer}", kind="cpu", host=f"h{writer}"))
        for b in range(batches):
            db.add_benchmark("memory.copy", dev, f"h{writer}", {"batch": b, "writer": writer},
                             [sample(b * per_batch + i, writer) for i in range(per_batch)])


def test_eight_concurrent_writers_lose_nothing(db_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(db_path), w, 25, 20)) for w in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 8  # a "database is locked" would be a non-zero exit
    with ProfileDB(db_path) as db:
        df = db.samples("memory.copy")
        assert len(df) == 4000
        assert df.groupby("writer").size().tolist() == [500] * 8
        assert db.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


class _SlowSamples(list):
    """Signals half-way through being written, then dawdles: the parent kills the writer there."""

    def __init__(self, items, marker: str):
        super().__init__(items)
        self.marker = marker

    def __iter__(self):
        for i, item in enumerate(super().__iter__()):
            if i == len(self) // 2:
                Path(self.marker).write_text("half")
                time.sleep(60)
            yield item


def _doomed_writer(path: str, marker: str) -> None:
    with ProfileDB(path) as db:
        db.add_benchmark("memory.copy", None, "h", {"doomed": True},
                         _SlowSamples([sample(i) for i in range(2000)], marker))


def test_sigkill_mid_batch_leaves_all_or_nothing(db_path, tmp_path):
    with ProfileDB(db_path) as db:
        db.add_benchmark("memory.copy", None, "h", {"first": True}, [sample(i) for i in range(10)])
    marker = tmp_path / "marker"
    proc = mp.get_context("spawn").Process(target=_doomed_writer, args=(str(db_path), str(marker)))
    proc.start()
    deadline = time.time() + 60
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert marker.exists()
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    with ProfileDB(db_path) as db:
        assert db.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.counts()["runs"] == 1 and db.counts()["samples"] == 10  # the killed batch: nothing
        db.add_benchmark("memory.copy", None, "h", {"after": True}, [sample(1)])  # still writable


def test_rows_are_content_addressed(db_path):
    with ProfileDB(db_path) as db:
        a = db.add_device(DeviceInfo(name="x", kind="cpu", host="h"))
        b = db.add_device(DeviceInfo(name="x", kind="cpu", host="h"))
        c = db.add_device(DeviceInfo(name="x", kind="cpu", host="h2"))
        assert a == b != c
        assert db.counts()["devices"] == 2


def test_samples_view_flattens_params_and_metrics(db_path):
    with ProfileDB(db_path) as db:
        dev = db.add_device(DeviceInfo(name="cpu", kind="cpu", catalog_type="cpu", host="h"))
        db.add_benchmark("compute.matmul", dev, "h", {"dtype": "fp32"},
                         [{"params": {"m": 64, "n": 64, "k": 64, "dtype": "fp32"},
                           "metrics": {"seconds": 1e-3, "tflops": 0.5}}])
        db.add_benchmark("task.decode", dev, "h", {}, [{"params": {"batch": 2}, "metrics": {"seconds": 0.1}}])
        df = db.samples("compute.")
        assert list(df["m"]) == [64] and list(df["tflops"]) == [0.5] and df["catalog_type"][0] == "cpu"
        assert len(db.samples("task.")) == 1 and len(db.samples()) == 2
        assert db.samples("nothing.").empty


def test_param_and_metric_may_not_share_a_name(db_path):
    with ProfileDB(db_path) as db, pytest.raises(ProfileDBError, match="both a param and a metric"):
        db.add_benchmark("compute.matmul", None, "h", {}, [{"params": {"seconds": 1}, "metrics": {"seconds": 1}}])
    with ProfileDB(db_path) as db:
        assert db.counts()["runs"] == 0


def test_bad_values_are_refused_naming_the_column(db_path):
    with ProfileDB(db_path) as db:
        with pytest.raises(ProfileDBError, match="samples.metrics"):
            db.add_benchmark("compute.matmul", None, "h", {}, [{"params": {}, "metrics": {"seconds": float("nan")}}])
        with pytest.raises(ProfileDBError, match="runs.benchmark"):
            db.add_benchmark("DROP TABLE runs;", None, "h", {}, [])


def test_snapshot_hash_changes_with_data(db_path):
    with ProfileDB(db_path) as db:
        empty = db.snapshot_hash()
        db.add_link("a", "b", 1e-3, 1e8)
        assert db.snapshot_hash() != empty


def test_an_old_database_is_migrated(db_path):
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL)")
    for table in TABLES.values():
        conn.execute(_ddl(table))
    conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    conn.commit()
    conn.close()
    with ProfileDB(db_path) as db:
        assert db.info()["schema_version"] == SCHEMA_VERSION
        names = {r[0] for r in db.conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert "runs_by_benchmark" in names and "samples_by_run" not in names  # v4: the key serves it
        sql = db.conn.execute("SELECT sql FROM sqlite_master WHERE name='samples'").fetchone()[0]
        assert "WITHOUT ROWID" in sql and "PRIMARY KEY (run_id, seq, id)" in sql


def test_a_v3_database_keeps_every_sample_through_the_v4_migration(tmp_path):
    old, copy, fresh = tmp_path / "old.db", tmp_path / "copy.db", tmp_path / "fresh.db"
    v3_database(old)
    conn = sqlite3.connect(old)
    assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("3",)
    before = sorted(conn.execute("SELECT * FROM samples").fetchall())
    conn.close()
    shutil.copy(old, copy)
    with ProfileDB(fresh) as db:  # merge reads a v3 file as it is (read-only, not migrated)
        assert merge(db, old)["samples"] == 6
    with ProfileDB(copy) as db:  # opening it writable migrates it in place
        assert db.info()["schema_version"] == SCHEMA_VERSION
        assert sorted(db.dump()["samples"]) == before
        assert db.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        run_id = before[0][1]
        db.write(lambda c: db._insert(c, "samples", [before[0]]))  # content-addressed: a duplicate adds nothing
        assert db.counts()["samples"] == 6
        assert [s for _, _, s, _, _ in db.conn.execute("SELECT * FROM samples WHERE run_id = ?", (run_id,))] \
            == [0, 1, 2]  # a run's samples come back in seq order, from the key alone
        assert sum(merge(db, fresh).values()) == 0  # the same rows, merged back: nothing new
        with ProfileDB(fresh, readonly=True) as merged:
            assert db.dump() == merged.dump()


def test_a_newer_database_is_refused(db_path):
    with ProfileDB(db_path) as db:
        db.conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(ProfileDBError, match="newer than this hetprof"):
        ProfileDB(db_path)


def test_not_a_database_is_refused(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ProfileDBError, match="not a readable profile database"):
        ProfileDB(junk)


def test_default_path_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HETPROF_DB", str(tmp_path / "sub" / "x.db"))
    with ProfileDB() as db:
        assert db.path == tmp_path / "sub" / "x.db"
    assert (tmp_path / "sub" / "x.db").exists()


def test_the_sample_hash_shortcut_equals_the_generic_content_address():
    from hetprof.profiles.content import content_id
    from hetprof.profiles.schema import TABLES

    run = "ab" * 32
    for params, metrics in (({"m": 1, "dtype": "bf16"}, {"seconds": 1e-4}),
                            ({"név": "ü\\\"x", "flag": True, "none": None}, {"t": -0.0, "big": 1e300})):
        values = (run, 7, canonical_json(params), canonical_json(metrics))
        assert sample_id(*values) == content_id("samples", values, TABLES["samples"].json_flags)
