"""Hostile run logs given to `hetprof validate` (issue 37): typed, bounded, one-line refusals (exit 2)."""

from __future__ import annotations

import json
import os
import time
import tracemalloc

import pytest
from click.testing import CliRunner

from hetprof.cli import cli
from hetprof.errors import HetprofError
from hetprof.executor.records.run_log import MAX_BARS, read_log

GOOD = {"run": "r", "iteration": 0, "iteration_s": 1.0, "stages": {"actor_gen": 0.5}, "predicted": {"actor_gen": 0.4},
        "predicted_iteration_s": 0.9, "devices": {"actor_gen": ["h:0"]},
        "timeline": [{"device": "h:0", "task": "actor_gen", "start": 0.0, "end": 0.5}]}


def _validate(tmp_path, log, *args):
    result = CliRunner().invoke(cli, ["--db", str(tmp_path / "db.sqlite"), "validate", str(log), *args])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    return result, lines


@pytest.mark.parametrize("change, field", [
    ({"stages": ["actor_gen"]}, "stages"),
    ({"stages": {"actor_gen": "fast"}}, "stages"),
    ({"predicted": "0.4"}, "predicted"),
    ({"iteration_s": True}, "iteration_s"),
    ({"iteration_s": -1}, "iteration_s"),
    ({"iteration": 1.5}, "iteration"),
    ({"timeline": [{"device": "h:0"}]}, "timeline"),
    ({"timeline": [GOOD["timeline"][0]] * (MAX_BARS + 1)}, "timeline"),
])
def test_wrong_types_are_refused_naming_line_and_field(tmp_path, change, field):
    log = tmp_path / "run.jsonl"
    log.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "iteration": 1, **change}) + "\n")
    result, lines = _validate(tmp_path, log)
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert f"{log}: line 2" in lines[0] and f"'{field}'" in lines[0]


@pytest.mark.parametrize("line", ['{"run": "r", "iteration": 0, "iteration_s": Infinity}',
                                  '{"run": "r", "iteration": 0, "iteration_s": 1e999}',
                                  '{"run": "r", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"])
def test_inf_and_deep_lines_are_refused(tmp_path, line):
    log = tmp_path / "run.jsonl"
    log.write_text(line + "\n")
    with pytest.raises(HetprofError, match="line 1") as err:
        read_log(log)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)


def test_a_sparse_or_non_regular_log_is_refused_fast_in_bounded_memory(tmp_path):
    log = tmp_path / "run.jsonl"
    with open(log, "wb") as f:
        f.truncate(3 << 30)  # sparse 3 GB
    tracemalloc.start()
    started = time.process_time()
    with pytest.raises(HetprofError, match="larger than"):
        read_log(log)
    assert tracemalloc.get_traced_memory()[1] < 64 << 20 and time.process_time() - started < 10
    tracemalloc.stop()
    log.unlink()
    os.mkfifo(log)
    result, lines = _validate(tmp_path, log)
    assert result.exit_code == 2 and len(lines) == 1 and "FIFO" in lines[0], result.output


def test_gantt_into_a_missing_folder_is_refused_before_drawing(tmp_path):
    log = tmp_path / "run.jsonl"
    log.write_text(json.dumps(GOOD) + "\n")
    target = tmp_path / "nowhere" / "g.png"
    result, lines = _validate(tmp_path, log, "--gantt", str(target))
    assert result.exit_code == 2 and len(lines) == 1 and "does not exist" in lines[0], result.output
    assert not target.parent.exists()
    ok, _ = _validate(tmp_path, log, "--gantt", str(tmp_path / "g.png"))
    assert ok.exit_code == 0 and (tmp_path / "g.png").is_file(), ok.output


def test_a_torn_last_record_is_left_out_and_cut_before_a_resumed_run_appends(tmp_path):
    """A run killed mid-write leaves half a line: readers skip it, and the next writer cuts it off
    first, so a resumed run's records do not glue onto it (the log stays readable)."""
    from hetprof.executor.records.run_log import RunLog

    log = tmp_path / "run.jsonl"
    whole = json.dumps(GOOD) + "\n"
    torn = json.dumps({**GOOD, "iteration": 1})[:40]
    log.write_text(whole + torn)
    assert [r["iteration"] for r in read_log(log)] == [0]
    writer = RunLog(log)
    assert writer.torn_bytes == len(torn) and log.read_text() == whole
    writer.write({**GOOD, "iteration": 1})
    assert [r["iteration"] for r in read_log(log)] == [0, 1]
    assert RunLog(log).torn_bytes == 0 and len(log.read_text().splitlines()) == 2  # a whole log is left as it is


def test_a_torn_line_inside_the_log_is_still_refused(tmp_path):
    log = tmp_path / "run.jsonl"
    log.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "iteration": 1})[:40] + "\n"
                   + json.dumps({**GOOD, "iteration": 2}) + "\n")
    with pytest.raises(HetprofError, match="line 2 is not an iteration record"):
        read_log(log)


def test_a_log_that_is_one_torn_line_is_cut_to_empty(tmp_path):
    from hetprof.executor.records.run_log import TAIL_CHUNK, RunLog

    log = tmp_path / "run.jsonl"
    log.write_bytes(b"x" * (TAIL_CHUNK * 2 + 5))  # longer than one backward chunk
    assert read_log(log) == []
    assert RunLog(log).torn_bytes == TAIL_CHUNK * 2 + 5 and log.read_bytes() == b""
