"""Issue 37, item 0: a profile database opened directly (`--db theirs.db`) is checked before use.

One test per defect the campaign found on that surface. Each refusal is exit 2, one line naming the
file and the object, field or limit, within seconds; the merge's own defences are in test_hostile_db.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from hetprof.cli import cli
from hetprof.profiles import DeviceInfo, ProfileDB, export
from hetprof.profiles.content import content_id
from hetprof.profiles.rowchecks import MAX_MODEL_JSON
from hetprof.profiles.schema import SCHEMA_VERSION, TABLES

REPO = Path(__file__).resolve().parents[2]
QUICK_S = 20.0  # CPU seconds: every refusal here takes well under one, and other processes do not count
ENDLESS = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT {cols} FROM r"


def _fill(path: Path, n: int = 20) -> str:
    """A small real profile: a device, a run of `n` samples, a link, a run record, a model. Returns the run id."""
    with ProfileDB(path) as db:
        dev = db.add_device(DeviceInfo(name="cpu", kind="cpu", catalog_type="cpu", host="node-a"))
        run = db.add_benchmark("compute.matmul", dev, "node-a", {"dtype": "fp32"},
                               [{"params": {"m": 64 * (i + 1)}, "metrics": {"seconds": 1e-3 * (i + 1)}}
                                for i in range(n)])
        db.add_link("node-a", "node-z", 1e-3, 6e7, run_id=run)
        db.add_run_records([{"run": "r1", "plan_hash": "p", "iteration": 0, "task": "iteration", "seconds": 1.5}])
        db.add_cost_model("fitted", "task.decode", "gbr", {"trees": [[1, 2]]}, {"mape": 0.05})
    return run


def _theirs(tmp_path: Path, statements: list[str], name: str = "theirs.db") -> Path:
    """A real profile database, then the adversary's SQL applied to it."""
    path = tmp_path / name
    _fill(path)
    conn = sqlite3.connect(path)
    conn.executescript(";".join(statements))
    conn.commit()
    conn.close()
    return path


def _export(tmp_path: Path, name: str = "mine.hpx") -> Path:
    src, out = tmp_path / f"{name}.db", tmp_path / name
    with ProfileDB(src) as db:
        dev = db.add_device(DeviceInfo(name="gpu", kind="cpu", catalog_type="cpu", host="node-b"))
        db.add_benchmark("compute.matmul", dev, "node-b", {}, [{"params": {"m": 1}, "metrics": {"seconds": 0.5}}])
        export(db, out)
    return out


def _count(path: Path, table: str) -> int:
    conn = sqlite3.connect(path)  # a plain read fires no trigger
    try:
        return conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    finally:
        conn.close()


def _refused(args: list[str], *needles: str, notes: bool = False) -> str:
    """Run the CLI in process; it must refuse in one line, with exit 2, quickly, naming every needle.
    `notes`: lines the command printed before it opened the database are allowed."""
    t0 = time.process_time()
    result = CliRunner().invoke(cli, args)
    elapsed = time.process_time() - t0
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip() and (not notes or ln.startswith("error"))]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert elapsed < QUICK_S, f"{elapsed:.1f} s: {lines[0]}"
    return lines[0]


def _every_command(db: Path, tmp_path: Path) -> list[list[str]]:
    """Each command that takes --db, with arguments that reach the database at once."""
    export_in = _export(tmp_path, "in.hpx")
    other = tmp_path / "other.db"
    if not other.exists():
        _fill(other)
    return [["db", "info", "--db", str(db)], ["db", "list", "--db", str(db)], ["db", "show", "--db", str(db), "r1"],
            ["db", "export", "--db", str(db), str(tmp_path / "out.hpx")],
            ["db", "import", "--db", str(db), str(export_in)], ["db", "merge", "--db", str(db), str(other)],
            ["fit", "--db", str(db)], ["fit", "--no-store", "--db", str(db)],
            ["plan", "--db", str(db), "-c", str(REPO / "examples/clusters/cpu-local.yaml"),
             "-w", str(REPO / "examples/workloads/grpo-tiny.yaml")],
            ["validate", "--db", str(db), "r1"]]


# ---- a trigger never runs ----------------------------------------------------------------------

def test_a_trigger_in_a_database_opened_directly_never_runs(tmp_path):
    theirs = _theirs(tmp_path, ["CREATE TRIGGER wipe AFTER INSERT ON origins BEGIN DELETE FROM samples; END",
                                "CREATE TRIGGER wipe2 BEFORE INSERT ON samples BEGIN DELETE FROM samples; END"])
    before = _count(theirs, "samples")
    assert before == 20
    for args in _every_command(theirs, tmp_path):
        _refused(args, str(theirs), "trigger 'wipe")
    assert _count(theirs, "samples") == before  # the import above was refused before any write
    assert _count(theirs, "origins") == 0


def test_a_trigger_blocks_profiling_into_the_database_before_it_measures(tmp_path):
    theirs = _theirs(tmp_path, ["CREATE TRIGGER wipe AFTER INSERT ON devices BEGIN DELETE FROM samples; END"])
    _refused(["profile", "--db", str(theirs), "--quick", "--suite", "inventory", "--device", "cpu"],
             str(theirs), "trigger 'wipe'", notes=True)
    assert _count(theirs, "samples") == 20


def test_hetprof_run_refuses_a_database_with_a_trigger_before_any_worker_starts(tmp_path):
    theirs = _theirs(tmp_path, ["CREATE TRIGGER wipe AFTER INSERT ON run_records BEGIN DELETE FROM samples; END"])
    plan = tmp_path / "plan.json"
    plan.write_text("{}")  # never read: the database is checked first
    _refused(["run", str(plan), "--db", str(theirs), "--iterations", "1"], str(theirs), "trigger 'wipe'")
    assert _count(theirs, "samples") == 20


# ---- views, virtual tables and objects hetprof does not make ----------------------------------------

@pytest.mark.parametrize("table", ["links", "run_records", "cost_models"])
def test_an_endless_view_in_place_of_a_table_is_refused_without_running_it(tmp_path, table):
    cols = ", ".join("x" for _ in TABLES[table].column_names)
    theirs = _theirs(tmp_path, [f"DROP TABLE {table}",
                                f"CREATE VIEW {table} ({', '.join(TABLES[table].column_names)}) AS "
                                + ENDLESS.format(cols=cols)])
    for args in _every_command(theirs, tmp_path):
        _refused(args, str(theirs), f"view '{table}'")


def test_a_view_of_origins_is_refused_when_opened_and_never_merged(tmp_path):
    theirs = _theirs(tmp_path, ["DROP TABLE origins",
                                "CREATE VIEW origins (seq, kind, origin, at, added) AS SELECT 1, 'x', 'y', 1e308, 'z'"])
    _refused(["db", "info", "--db", str(theirs)], str(theirs), "view 'origins'")
    mine = tmp_path / "mine.db"
    _fill(mine)
    result = CliRunner().invoke(cli, ["db", "merge", "--db", str(mine), str(theirs)])
    assert result.exit_code == 0, result.output
    conn = sqlite3.connect(mine)
    kinds = conn.execute("SELECT type FROM sqlite_master WHERE name = 'origins'").fetchall()
    conn.close()
    assert kinds == [("table",)]
    info = CliRunner().invoke(cli, ["db", "info", "--db", str(mine)])
    assert info.exit_code == 0 and "Traceback" not in info.output, info.output


def test_a_virtual_table_is_refused(tmp_path):
    theirs = _theirs(tmp_path, ["CREATE VIRTUAL TABLE notes USING rtree(id, x0, x1)"])
    _refused(["db", "info", "--db", str(theirs)], str(theirs), "virtual table 'notes'")


@pytest.mark.parametrize(("statement", "named"), [
    ("CREATE UNIQUE INDEX one_per_seq ON samples (seq)", "index 'one_per_seq'"),  # drops other runs' samples silently
    ("CREATE INDEX slow ON runs (length(zeroblob(100000000)))", "index 'slow'"),  # runs on every insert
    ("CREATE TABLE extra (x)", "table 'extra'"),
])
def test_objects_hetprof_does_not_make_are_refused(tmp_path, statement, named):
    theirs = _theirs(tmp_path, [statement])
    _refused(["db", "import", "--db", str(theirs), str(_export(tmp_path))], str(theirs), named)


def test_a_table_redefined_with_a_constraint_is_refused(tmp_path):
    cols = ", ".join(TABLES["cost_models"].column_names)
    theirs = _theirs(tmp_path, ["ALTER TABLE cost_models RENAME TO old_models",
                                f"CREATE TABLE cost_models ({cols}, CHECK (length(zeroblob(100000000)) > 0))",
                                "INSERT INTO cost_models SELECT * FROM old_models", "DROP TABLE old_models"])
    _refused(["db", "import", "--db", str(theirs), str(_export(tmp_path))], str(theirs), "table 'cost_models'",
             "not defined as")


def test_a_legitimate_database_of_every_schema_version_still_opens(tmp_path):
    from hetprof.profiles.schema import migrate

    for version in range(1, SCHEMA_VERSION + 1):
        path = tmp_path / f"v{version}.db"
        conn = sqlite3.connect(path, isolation_level=None)
        migrate(conn, 0, version)
        conn.execute("ANALYZE")  # statistics tables a user may add with the sqlite3 shell
        conn.close()
        with ProfileDB(path) as db:
            assert db.counts()["samples"] == 0


# ---- paths that are not regular files ------------------------------------------------------------

def test_a_database_symlinked_to_dev_null_is_refused(tmp_path):
    theirs = tmp_path / "theirs.db"
    theirs.symlink_to("/dev/null")
    for args in _every_command(theirs, tmp_path):
        _refused(args, str(theirs))
    _refused(["db", "import", "--db", str(theirs), str(_export(tmp_path))], "not a regular file (a character device)")


def test_a_fifo_as_the_database_or_its_wal_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "fifo.db"
    os.mkfifo(fifo)
    _refused(["db", "import", "--db", str(fifo), str(_export(tmp_path))], str(fifo), "not a regular file (a FIFO)")
    theirs = tmp_path / "theirs.db"
    _fill(theirs)
    os.mkfifo(tmp_path / "theirs.db-wal")
    _refused(["db", "info", "--db", str(theirs)], "theirs.db-wal: not a regular file (a FIFO)")


def test_a_page_damaged_mid_file_is_refused_in_one_line_and_the_file_kept(tmp_path):
    """The open-time checks read the schema only; a page torn further in is met mid-read."""
    theirs = tmp_path / "theirs.db"
    _fill(theirs, n=3000)
    data = bytearray(theirs.read_bytes())
    middle = len(data) // 4096 // 2 * 4096
    data[middle + 100:middle + 3000] = b"\xff" * 2900
    theirs.write_bytes(bytes(data))
    before = hashlib.sha256(theirs.read_bytes()).hexdigest()
    out = tmp_path / "out.hpx"
    for args in (["db", "info", "--db", str(theirs)], ["fit", "--db", str(theirs)],
                 ["db", "export", "--db", str(theirs), str(out)]):
        _refused(args, str(theirs), "could not be read", "integrity_check", notes=True)
    assert hashlib.sha256(theirs.read_bytes()).hexdigest() == before
    assert not out.exists()


@pytest.mark.parametrize("statement, named", [
    ("DELETE FROM devices", "references devices"),  # foreign keys are off in the adversary's sqlite3
    ("UPDATE links SET beta_Bps = -1", "links row"),
])
def test_an_export_of_rows_an_import_would_refuse_is_refused_naming_the_row(tmp_path, statement, named):
    """Found by the campaign: `db export` copied such rows into a file that every import then refused."""
    theirs, out = _theirs(tmp_path, [statement]), tmp_path / "out.hpx"
    _refused(["db", "export", "--db", str(theirs), str(out)], str(theirs), named, "written outside hetprof")
    assert not out.exists() and not list(tmp_path.glob(".out.hpx.*"))


def test_a_schema_whose_text_is_not_utf8_is_refused_in_one_line(tmp_path):
    """Found by the campaign: SQLite quotes the damaged schema text in its error, and Python's sqlite3
    then fails to decode that message (UnicodeDecodeError), which escaped as a traceback."""
    theirs = _theirs(tmp_path, [])
    raw = bytearray(theirs.read_bytes())
    at = raw.index(b"PRIMARY KEY")
    raw[at + len("PRIMARY "):at + len("PRIMARY K")] = b"\x80"
    theirs.write_bytes(bytes(raw))
    _refused(["db", "info", "--db", str(theirs)], str(theirs), "not a readable profile database")
    _refused(["db", "export", "--db", str(theirs), str(tmp_path / "out.hpx")], str(theirs), "malformed")


# ---- expansion of an import ----------------------------------------------------------------------

def _model_bomb(path: Path, rows: int) -> None:
    """An export of `rows` valid cost models of 8 MiB each, repeated text: about 1000-fold expansion."""
    filler = "a" * (MAX_MODEL_JSON - 64)
    body = hashlib.sha256()
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write((json.dumps({"format": "hetprof-profile-export", "format_version": 1,
                             "schema_version": SCHEMA_VERSION}) + "\n").encode())
        for k in range(rows):
            values = ["bomb", "task.decode", "gbr", json.dumps({"k": k, "w": filler}, separators=(",", ":")),
                      "{}", "", "0.1", 1.0, "fitted"]
            line = (json.dumps(["cost_models", content_id("cost_models", values, TABLES["cost_models"].json_flags),
                                *values], separators=(",", ":")) + "\n").encode()
            body.update(line)
            f.write(line)
        counts = {name: rows if name == "cost_models" else 0 for name in TABLES}
        f.write((json.dumps({"end": True, "counts": counts, "body_sha256": body.hexdigest()}) + "\n").encode())


_MEASURED = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stdout.write(done.stdout + done.stderr)
sys.stderr.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(done.returncode)
"""


def test_an_export_that_expands_a_thousandfold_is_refused_quickly_in_little_memory(tmp_path, db_path):
    bomb = tmp_path / "bomb.hpx"
    _model_bomb(bomb, rows=12)  # 96 MiB of rows from about 0.1 MB; accepted whole before
    assert bomb.stat().st_size < 2 * 2**20
    hetprof = str(Path(sys.executable).with_name("hetprof"))
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _MEASURED, hetprof, "db", "import", "--db", str(db_path), str(bomb)],
                          capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - t0
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    assert done.returncode == 2, done.stdout
    assert len(lines) == 1 and str(bomb) in lines[0] and "(--max-expansion)" in lines[0], done.stdout
    assert elapsed < QUICK_S
    assert int(done.stderr.strip().splitlines()[-1]) < 512 * 1024  # KiB: well under 1 GB
    assert not db_path.exists() or _count(db_path, "cost_models") == 0
    # The limit is the user's to raise: then the next bound, here the file's total, is the one that refuses.
    _refused(["db", "import", "--db", str(db_path), str(bomb), "--max-expansion", "2000", "--max-bytes", "96M"],
             str(bomb), "(--max-bytes)")


# ---- stored values within the ranges their readers accept ---------------------------------------------

def _set(path: Path, sql: str) -> None:
    conn = sqlite3.connect(path)
    conn.execute(sql)
    conn.commit()
    conn.close()


def test_a_created_time_of_1e308_is_refused_by_list_show_and_import(tmp_path):
    theirs = tmp_path / "theirs.db"
    run = _fill(theirs)
    _set(theirs, "UPDATE runs SET created = 1e308")  # written with other tools: ids no longer match, as an adversary's
    _refused(["db", "list", "--db", str(theirs)], str(theirs), "runs.created", "between 1970 and 9999")
    _refused(["db", "show", "--db", str(theirs), run[:12]], str(theirs), "runs.created")
    _set(theirs, "UPDATE run_records SET created = 1e308")
    _refused(["db", "show", "--db", str(theirs), "r1"], str(theirs), "run_records.created")
    _set(theirs, "INSERT INTO origins (kind, origin, at, added) VALUES ('import', 'x', 1e308, '{}')")
    _refused(["db", "info", "--db", str(theirs)], str(theirs), "origins row")
    f = tmp_path / "far.hpx"
    values = ["compute.matmul", None, "node-a", "{}", 0, "0.1", 1e308, "measured"]
    rid = content_id("runs", values, TABLES["runs"].json_flags)
    line = (json.dumps(["runs", rid, *values], separators=(",", ":")) + "\n").encode()
    f.write_bytes(_export_of([line], {"runs": 1}))
    _refused(["db", "import", "--db", str(tmp_path / "mine.db"), str(f)], str(f), "runs.created")


@pytest.mark.parametrize("seconds", [0.0, -5.0])
def test_import_refuses_samples_of_zero_or_negative_seconds(tmp_path, seconds):
    run_values = ["compute.matmul", None, "node-a", "{}", 1, "0.1", 1.0, "measured"]
    run = content_id("runs", run_values, TABLES["runs"].json_flags)
    sample = [run, 0, '{"m":1}', json.dumps({"seconds": seconds}, separators=(",", ":"))]
    lines = [(json.dumps(["runs", run, *run_values], separators=(",", ":")) + "\n").encode(),
             (json.dumps(["samples", content_id("samples", sample, TABLES["samples"].json_flags), *sample],
                         separators=(",", ":")) + "\n").encode()]
    f = tmp_path / "zero.hpx"
    f.write_bytes(_export_of(lines, {"runs": 1, "samples": 1}))
    mine = tmp_path / "mine.db"
    _refused(["db", "import", "--db", str(mine), str(f)], str(f), "samples.metrics", "'seconds'", "positive")
    assert _count(mine, "samples") == 0


def _export_of(lines: list[bytes], counts: dict[str, int]) -> bytes:
    body = hashlib.sha256(b"".join(lines)).hexdigest()
    header = {"format": "hetprof-profile-export", "format_version": 1, "schema_version": SCHEMA_VERSION}
    trailer = {"end": True, "counts": {name: counts.get(name, 0) for name in TABLES}, "body_sha256": body}
    return gzip.compress(json.dumps(header).encode() + b"\n" + b"".join(lines) + json.dumps(trailer).encode() + b"\n")


def test_a_sample_that_is_not_json_is_refused_by_fit_in_one_line(tmp_path):
    theirs = tmp_path / "theirs.db"
    _fill(theirs)
    with ProfileDB(theirs) as db:
        db.add_benchmark("task.decode", None, "node-a", {}, [{"params": {"batch": 1}, "metrics": {"seconds": 0.1}}])
    _set(theirs, "UPDATE samples SET metrics = '[1, 2' WHERE seq = 0")
    _refused(["fit", "--no-store", "--db", str(theirs)], str(theirs), "samples.metrics")


def test_an_infinite_number_is_refused_by_list_and_export_before_they_print_or_write(tmp_path):
    theirs = tmp_path / "theirs.db"
    _fill(theirs)
    _set(theirs, "UPDATE links SET alpha_s = 9e999")  # SQLite stores infinity
    _refused(["db", "list", "--db", str(theirs)], str(theirs), "links.alpha_s", "finite")
    out = tmp_path / "out.hpx"
    _refused(["db", "export", "--db", str(theirs), str(out)], str(theirs), "links row", "links.alpha_s", "finite")
    assert not out.exists() and not list(tmp_path.glob(".out.hpx.*"))


def test_a_meta_table_without_its_key_is_refused_before_it_is_read(tmp_path):
    theirs = _theirs(tmp_path, ["DROP TABLE meta", "CREATE TABLE meta (key TEXT, value TEXT)",
                                f"INSERT INTO meta VALUES ('schema_version', '{SCHEMA_VERSION}')"])
    _refused(["db", "info", "--db", str(theirs)], str(theirs), "table 'meta'", "not defined as")
