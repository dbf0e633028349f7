"""Issue 16, the shared-database points: each test is named after the numbered point it guards."""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.hostile_files import (
    database_with,
    device_values,
    dump,
    export_lines,
    file_bytes,
    fill,
    line_id,
    row_line,
    run_values,
    sample_line,
)

from hetprof.cli import cli
from hetprof.errors import ImportRefused
from hetprof.profiles import ProfileDB, export, import_file, merge
from hetprof.profiles.bounds import Limits, Watch
from hetprof.profiles.content import content_id
from hetprof.profiles.schema import TABLES
from hetprof.safety.processes import Terminated


def _refused_cli(args: list[str]) -> str:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


# ---- 2. a merge source that hangs or floods memory --------------------------------------------

@pytest.mark.parametrize("table", ["samples", "runs"])
def test_point02_recursive_view_named_like_a_table_is_refused_without_reading_it(tmp_path, table):
    src, target = tmp_path / "src.db", tmp_path / "t.db"
    cols = ", ".join(TABLES[table].column_names)
    database_with(src, [f"DROP TABLE {table}",
                        f"CREATE VIEW {table} ({cols}) AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 "
                        f"FROM r) SELECT {', '.join('x' for _ in TABLES[table].column_names)} FROM r"])
    fill(target, "node-t")
    before = dump(target)
    with ProfileDB(target) as db, pytest.raises(ImportRefused, match=f"{table} is a view, not a table"):
        merge(db, src)
    assert dump(target) == before


def test_point02_generated_columns_are_refused(tmp_path):
    src, target = tmp_path / "src.db", tmp_path / "t.db"
    cols = ", ".join(f"{c} GENERATED ALWAYS AS (zeroblob(1000000000))" if c == "extra" else c
                     for c in TABLES["devices"].column_names)
    database_with(src, ["DROP TABLE devices", f"CREATE TABLE devices ({cols})"])
    with ProfileDB(target) as db, pytest.raises(ImportRefused, match="computed"):
        merge(db, src)


def test_point02_a_slow_query_stops_at_the_deadline(tmp_path):
    watch = Watch(Limits(deadline_s=0.3), "src.db")
    conn = watch.attach(sqlite3.connect(":memory:"))
    t0 = time.monotonic()
    with pytest.raises(ImportRefused, match="deadline"), watch.guard():
        conn.execute("WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT max(x) FROM r").fetchone()
    assert time.monotonic() - t0 < 30  # generous: the point is that it ends, not how fast


@pytest.mark.parametrize(("signum", "raised"), [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_point02_ctrl_c_or_sigterm_interrupts_a_running_query(signum, raised):
    watch = Watch(Limits(deadline_s=3600), "src.db")
    conn = watch.attach(sqlite3.connect(":memory:"))
    timer = threading.Timer(0.2, lambda: os.kill(os.getpid(), signum))
    timer.start()
    try:
        with pytest.raises(raised), watch.guard():
            conn.execute("WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT max(x) FROM r"
                         ).fetchone()
    finally:
        timer.cancel()


def test_point02_a_source_past_the_row_cap_is_refused(tmp_path):
    src, target = tmp_path / "src.db", tmp_path / "t.db"
    fill(src, n=50)
    line = _refused_cli(["db", "merge", "--db", str(target), str(src), "--max-rows", "20"])
    assert "more than 20 rows (--max-rows)" in line


# ---- 3. import bounds ------------------------------------------------------------------------

def _one_device_export(repeats: int) -> bytes:
    line = row_line("devices", device_values())
    return export_lines([line] * repeats, counts={n: repeats if n == "devices" else 0 for n in TABLES})


def test_point03_one_row_repeated_is_refused_at_its_second_copy(tmp_path, db_path):
    f = tmp_path / "bomb.hpx"
    f.write_bytes(_one_device_export(200_000))
    line = _refused_cli(["db", "import", "--db", str(db_path), str(f)])
    assert "line 3" in line and "appears twice" in line
    assert not db_path.exists() or dump(db_path)["devices"] == []


def test_point03_decompressed_bytes_rows_and_row_size_are_capped(tmp_path, db_path):
    f = tmp_path / "big.hpx"
    lines = [row_line("devices", device_values(name=f"cpu{i}")) for i in range(200)]
    f.write_bytes(export_lines(lines))
    assert "(--max-bytes)" in _refused_cli(["db", "import", "--db", str(db_path), str(f), "--max-bytes", "8K"])
    assert "(--max-rows)" in _refused_cli(["db", "import", "--db", str(db_path), str(f), "--max-rows", "100"])
    assert "(--max-row-bytes)" in _refused_cli(["db", "import", "--db", str(db_path), str(f), "--max-row-bytes", "64"])
    with ProfileDB(db_path) as db:
        assert db.counts()["devices"] == 0
        assert import_file(db, f, Limits(max_rows=200))["devices"] == 200


# ---- 4. content addressing ---------------------------------------------------------------------

def _run_with_samples(n: int, samples: list[tuple[int, str, str]]) -> list[bytes]:
    dev = row_line("devices", device_values())
    run = row_line("runs", run_values(line_id(dev), n))
    return [dev, run, *(sample_line(line_id(run), seq, p, m) for seq, p, m in samples)]


@pytest.mark.parametrize("params", ['{"m": 1}', '{"n":2,"m":1}', '{"m":1,"m":1}'])
def test_point04_non_canonical_json_is_refused(tmp_path, db_path, params):
    f = tmp_path / "respelled.hpx"
    f.write_bytes(export_lines(_run_with_samples(1, [(0, params, '{"seconds":0.001}')])))
    assert "canonical" in _refused_cli(["db", "import", "--db", str(db_path), str(f)])


@pytest.mark.parametrize("metrics", ['{"seconds":1e999}', '{"seconds":-1e999}'])
def test_point04_non_finite_numbers_are_refused(tmp_path, db_path, metrics):
    f = tmp_path / "inf.hpx"
    f.write_bytes(export_lines(_run_with_samples(1, [(0, '{"m":1}', metrics)])))
    line = _refused_cli(["db", "import", "--db", str(db_path), str(f)])
    assert "finite" in line or "canonical" in line


def test_point04_run_and_seq_are_unique_and_within_n_samples(tmp_path, db_path):
    twice, beyond = tmp_path / "twice.hpx", tmp_path / "beyond.hpx"
    twice.write_bytes(export_lines(_run_with_samples(2, [(0, '{"m":1}', '{"seconds":0.1}'),
                                                         (0, '{"m":2}', '{"seconds":0.1}')])))
    beyond.write_bytes(export_lines(_run_with_samples(1, [(1, '{"m":1}', '{"seconds":0.1}')])))
    assert "already holds another sample at seq 0" in _refused_cli(["db", "import", "--db", str(db_path), str(twice)])
    assert "outside its run's 1 samples" in _refused_cli(["db", "import", "--db", str(db_path), str(beyond)])


def test_point04_merge_checks_run_and_seq_too(tmp_path):
    src, target = tmp_path / "src.db", tmp_path / "t.db"
    run = fill(src, n=3)
    conn = sqlite3.connect(src)
    conn.execute("UPDATE runs SET n_samples = 2 WHERE id = ?", (run,))  # the id no longer matches: refused anyway
    conn.commit()
    conn.close()
    with ProfileDB(target) as db, pytest.raises(ImportRefused):
        merge(db, src)
    assert dump(target)["samples"] == []


@pytest.mark.parametrize("seconds", [0.0, -1.5])
def test_point04_run_record_seconds_must_be_positive(tmp_path, db_path, seconds):
    f = tmp_path / "zero.hpx"
    values = ["r1", "p", 0, "iteration", seconds, None, "[]", "node-a", "{}", "0.1", 1.0, "run"]
    f.write_bytes(export_lines([row_line("run_records", values)]))
    assert "positive duration" in _refused_cli(["db", "import", "--db", str(db_path), str(f)])


# ---- 5. console markup ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["[link=https://evil.example]x[/link]", "[bold", "a]b[/]"])
def test_point05_markup_in_stored_text_is_printed_as_text(tmp_path, db_path, name):
    run = fill(db_path, name=name, host=f"h{name}")
    runner = CliRunner()
    for args in (["db", "info"], ["db", "list"], ["db", "show", run[:12]]):
        result = runner.invoke(cli, [*args[:2], "--db", str(db_path), *args[2:]])
        assert result.exit_code == 0, result.output
        assert "MarkupError" not in result.output
    info = runner.invoke(cli, ["db", "info", "--db", str(db_path)])
    assert name in info.output


def test_point05_escape_sequences_in_a_file_name_are_made_visible(tmp_path, db_path):
    f = tmp_path / "evil\x1b[2J.hpx"
    fill(tmp_path / "a.db")
    with ProfileDB(tmp_path / "a.db") as db:
        export(db, f)
    result = CliRunner().invoke(cli, ["db", "import", "--db", str(db_path), str(f)])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\\x1b[2J" in result.output


# ---- 6. a database still being written -------------------------------------------------------------

def test_point06_a_database_still_being_written_merges(tmp_path, monkeypatch):
    from hetprof.profiles import staging

    monkeypatch.setattr(staging, "MIN_ROWS", 1)  # the two-process path, where snapshots used to differ
    src, target = tmp_path / "src.db", tmp_path / "t.db"
    fill(src, n=50)
    stop = threading.Event()

    def writer() -> None:
        with ProfileDB(src) as db:
            k = 0
            while not stop.is_set():
                db.add_benchmark("compute.matmul", None, "node-w", {"k": k},
                                 [{"params": {"k": k}, "metrics": {"seconds": 1e-3}}] * 1 + [])
                k += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        with ProfileDB(target) as db:
            for _ in range(3):
                merge(db, src)
    finally:
        stop.set()
        thread.join()
    with ProfileDB(target) as db:
        assert db.counts()["runs"] >= 1


# ---- 11. export never writes through a planted path ------------------------------------------------

def test_point11_export_does_not_follow_a_planted_partial_symlink(tmp_path):
    fill(tmp_path / "a.db")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out.hpx"
    (tmp_path / "out.hpx.partial").symlink_to(victim)
    link = tmp_path / "link.hpx"
    link.symlink_to(victim)
    with ProfileDB(tmp_path / "a.db") as db:
        export(db, out)
        export(db, link)  # the link itself is replaced by the export, its target untouched
    assert victim.read_text() == "precious"
    assert gzip.decompress(out.read_bytes()).startswith(b"{")
    assert not link.is_symlink()
    assert not list(tmp_path.glob(".out.hpx.*.partial"))


# ---- 12. export --host keeps run records ------------------------------------------------------------

def test_point12_export_by_host_keeps_run_records_new_and_old(tmp_path):
    a, mine, old = tmp_path / "a.db", tmp_path / "mine.hpx", tmp_path / "old.hpx"
    here = socket.gethostname()
    fill(a, host="node-a")
    with ProfileDB(a) as db:  # as a run's leader writes them: no host given
        db.add_run_records([{"run": "r2", "iteration": 0, "task": "iteration", "seconds": 2.0,
                             "device_ids": [f"{here}:0"]}])
    conn = sqlite3.connect(a)  # a record from before hosts were stored: found through its devices
    table = TABLES["run_records"]  # as hetprof wrote it then: its id is the hash of a NULL host
    row = conn.execute("SELECT * FROM run_records WHERE run = 'r1'").fetchone()
    values = [None if name == "host" else v for name, v in zip(table.column_names[1:], row[1:], strict=True)]
    conn.execute("UPDATE run_records SET host = NULL, id = ? WHERE run = 'r1'",
                 (content_id("run_records", values, table.json_flags),))
    conn.commit()
    conn.close()
    with ProfileDB(a) as db:
        assert export(db, mine, host=here)["run_records"] == 1
        assert export(db, old, host="node-a")["run_records"] == 1
        assert export(db, tmp_path / "none.hpx", host="node-b")["run_records"] == 0


# ---- 13. not a regular file -----------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["import", "merge"])
def test_point13_dev_zero_and_fifo_are_not_regular_files(tmp_path, db_path, command):
    zero, fifo = tmp_path / "zero.hpx", tmp_path / "fifo.hpx"
    zero.symlink_to("/dev/zero")
    os.mkfifo(fifo)
    for path, kind in ((zero, "a character device"), (fifo, "a FIFO")):
        line = _refused_cli(["db", command, "--db", str(db_path), str(path)])
        assert f"not a regular file ({kind})" in line


# ---- 10. lone surrogates -------------------------------------------------------------------------------------

def test_point10_a_lone_surrogate_on_import_is_one_line(tmp_path, db_path):
    f = tmp_path / "surrogate.hpx"
    line = (json.dumps(["devices", "0" * 64, *device_values(name="cpu\ud800")]) + "\n").encode()
    assert b"\\ud800" in line
    f.write_bytes(export_lines([line]))
    before = file_bytes(db_path)
    assert "lone surrogate" in _refused_cli(["db", "import", "--db", str(db_path), str(f)])
    with ProfileDB(db_path) as db:
        assert db.counts()["devices"] == 0
    assert before == b"" or file_bytes(db_path) == before


# ---- 7. a killed merge leaks nothing --------------------------------------------------------------------

_SLOW_MERGE = """
import sys, time, pathlib
from hetprof.profiles import staging
staging.MIN_ROWS = 1
real, ready = staging.stage, pathlib.Path(READY)  # not argv: the staging helper re-runs this with its own
def slow(*args, **kwargs):
    ready.write_text("staging")
    time.sleep(120)
    return real(*args, **kwargs)
staging.stage = slow
sys.argv = ["hetprof", "db", "merge", "--db", sys.argv[1], sys.argv[2]]
from hetprof.cli import main
main()
"""


def _merge_held_in_staging(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    src, target, ready = tmp_path / "theirs.db", tmp_path / "mine.db", tmp_path / "ready"
    for k in range(4):  # several runs: the samples are split between this process and a helper
        fill(src, host=f"node-{k}", n=40)
    fill(target, host="node-t")
    proc = subprocess.Popen([sys.executable, "-P", "-c", _SLOW_MERGE.replace("READY", repr(str(ready))), str(target), str(src)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(1200):
        if ready.exists() or proc.poll() is not None:
            break
        time.sleep(0.1)
    assert ready.exists(), proc.communicate()[1]
    assert list(tmp_path.glob(".hetprof-merge-*")), "the scratch folder lives beside the target"
    return proc, target


def _helpers_of(path: Path) -> list[int]:
    """Processes whose command line names `path` (a merge's staging helper gets it in its job)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(path).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_point07_a_terminated_merge_removes_its_scratch_folder_and_helpers(tmp_path):
    proc, target = _merge_held_in_staging(tmp_path)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert not list(tmp_path.glob(".hetprof-merge-*"))
    assert not [p for p in _helpers_of(target) if p != proc.pid]


def test_point07_a_killed_merges_folder_is_removed_by_the_next_merge(tmp_path):
    proc, target = _merge_held_in_staging(tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    assert list(tmp_path.glob(".hetprof-merge-*"))  # SIGKILL cannot be caught
    with ProfileDB(target) as db:
        merge(db, tmp_path / "theirs.db")
    assert not list(tmp_path.glob(".hetprof-merge-*"))


def test_point07_an_orphaned_staging_helper_stops_by_itself(tmp_path):
    from hetprof.profiles import source, staging

    src, target = tmp_path / "theirs.db", tmp_path / "mine.db"
    fill(src, n=5000)
    fill(target, host="node-t")
    snapshot = source.take_snapshot(src, tmp_path, Watch(Limits(), str(src)))
    job = {"other": str(snapshot), "mine": str(target), "lo": None, "hi": None, "out": str(tmp_path / "part.db"),
           "origin": str(src), "limits": None, "parent_pid": os.getpid() + 10**6}  # a parent already gone
    worker = staging._start(job)
    with pytest.raises(ImportRefused, match="the merge that started this helper is gone"):
        staging._result(worker)


def test_point13_a_fifo_beside_the_source_database_is_refused_not_waited_on(tmp_path, db_path):
    src = tmp_path / "theirs.db"
    fill(src)
    os.mkfifo(tmp_path / "theirs.db-wal")
    assert "theirs.db-wal: not a regular file (a FIFO)" in _refused_cli(["db", "merge", "--db", str(db_path), str(src)])
