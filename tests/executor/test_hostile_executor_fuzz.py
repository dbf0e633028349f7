"""Property-based fuzzing of the executor's readers of shared files: prompt files, checkpoint markers
and the run logs `hetprof validate` reads.

Property: each input either loads (every prompt a non-empty string, every marker a committed
iteration with a plain run name, every log line typed as its readers expect) or is refused with a
HetprofError of one line, exit 2, naming the file — never another exception — in bounded traced memory.

The suite tries a few dozen inputs per reader; `make campaign` tries thousands (helpers/campaign.py).
"""

from __future__ import annotations

import json
import math
import tracemalloc
from pathlib import Path

import pytest
from helpers.campaign import fuzz, summary, tally
from hypothesis import given
from hypothesis import strategies as st

from hetprof.errors import HetprofError
from hetprof.executor.checkpoints import checkpoint
from hetprof.executor.prompts.prompt_files import load_prompts
from hetprof.executor.records.run_log import read_log
from hetprof.executor.records.run_name import run_name_problem

FUZZ = fuzz(30)
MEMORY_CAP = 128 * 2**20

JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40))
JSON_VALUE = st.recursive(JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                             st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                          max_leaves=20)
ROW = st.one_of(JSON_VALUE, st.fixed_dictionaries({"prompt": JSON_VALUE}, optional={"answer": JSON_VALUE}),
                st.fixed_dictionaries({"prompt": st.text(min_size=1, max_size=40)},
                                      optional={"answer": st.one_of(st.text(max_size=10), st.integers())}))
NASTY_TEXT = st.sampled_from(['{"prompt": "\\ud800"}', "[" * 5000, '{"prompt": NaN}', '{"prompt": 1e999}',
                              "\x00\xff", '{"prompt": "x", "answer": ' + "9" * 5000 + "}", ""])


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    print(f"\n{summary()}\nmemory cap {MEMORY_CAP >> 20} MiB")


def _refusable(surface: str, path: Path, read, accept) -> None:
    outcome = "accepted"
    tracemalloc.start()
    try:
        try:
            accept(read(path))
        except HetprofError as exc:
            text = str(exc)
            assert exc.exit_code == 2 and "\n" not in text and str(path.name) in text, text
            outcome = "refused"
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_CAP, f"{peak >> 20} MiB traced"
    tally(surface, outcome)


def _prompts_ok(prompts) -> None:
    assert prompts and all(isinstance(p.text, str) and p.text.strip() for p in prompts)
    for p in prompts:
        p.text.encode("utf-8")  # no lone surrogate got through


@FUZZ
@given(rows=st.lists(st.one_of(ROW.map(lambda r: json.dumps(r, allow_nan=True)), NASTY_TEXT), max_size=6))
def test_fuzzed_jsonl_prompt_files_load_or_are_refused_in_one_line(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("fuzz") / "p.jsonl"
    path.write_text("\n".join(rows), encoding="utf-8", errors="surrogatepass")
    _refusable(f"prompt file ({path.suffix[1:]})", path, load_prompts, _prompts_ok)


@FUZZ
@given(rows=st.lists(st.fixed_dictionaries({"prompt": st.one_of(st.text(max_size=30), st.integers(), st.none())},
                                           optional={"answer": st.one_of(st.text(max_size=10), st.floats())}),
                     min_size=1, max_size=6),
       fmt=st.sampled_from(["parquet", "json", "csv"]))
def test_fuzzed_table_prompt_files_load_or_are_refused_in_one_line(tmp_path_factory, rows, fmt):
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    path = tmp_path_factory.mktemp("fuzz") / f"p.{fmt}"
    clean = [{k: (v.encode("utf-8", "replace").decode("utf-8") if isinstance(v, str) else v) for k, v in r.items()}
             for r in rows]
    if fmt == "json":
        path.write_text(json.dumps(clean, allow_nan=True))
    else:
        try:
            table = pa.Table.from_pylist(clean)
        except (pa.ArrowException, OverflowError):
            return  # not a table pyarrow can write: nothing to read back
        (pq.write_table if fmt == "parquet" else pacsv.write_csv)(table, path)
    _refusable(f"prompt file ({path.suffix[1:]})", path, load_prompts, _prompts_ok)


def _marker_ok(meta) -> None:
    assert type(meta["iteration"]) is int and run_name_problem(meta["run"]) is None


@FUZZ
@given(data=st.one_of(JSON_VALUE.map(lambda v: json.dumps(v, allow_nan=True)),
                      st.fixed_dictionaries({"iteration": JSON_VALUE, "run": JSON_VALUE}).map(
                          lambda v: json.dumps(v, allow_nan=True)),
                      st.fixed_dictionaries({"iteration": st.integers(min_value=-5, max_value=10**12),
                                             "run": st.one_of(st.text(max_size=20), st.from_regex(
                                                 r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True))}).map(json.dumps),
                      NASTY_TEXT))
def test_fuzzed_committed_markers_load_or_are_refused_in_one_line(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("fuzz")
    (root / checkpoint.COMMIT).write_text(data, encoding="utf-8", errors="surrogatepass")
    def committed(_path: Path) -> dict:
        return checkpoint.committed(root)

    _refusable("checkpoint marker", root / checkpoint.COMMIT, committed, _marker_ok)


# ---- run logs given to `hetprof validate` ----------------------------------------------------------

GOOD_LINE = {"run": "r", "iteration": 0, "iteration_s": 1.0, "stages": {"actor_gen": 0.5},
             "predicted": {"actor_gen": 0.4}, "predicted_iteration_s": 0.9, "devices": {"actor_gen": ["h:0"]},
             "timeline": [{"device": "h:0", "task": "actor_gen", "start": 0.0, "end": 0.5}]}


def _seconds(value) -> bool:
    return value is None or (type(value) in (int, float) and math.isfinite(value) and value >= 0)


def _log_ok(records) -> None:
    """What `validate` goes on to do with a record: seconds it can add, spans it can draw."""
    for rec in records:
        assert type(rec["iteration"]) is int and isinstance(rec["run"], str)
        assert _seconds(rec.get("iteration_s")) and _seconds(rec.get("predicted_iteration_s"))
        for table in (rec.get("stages", {}), rec.get("predicted", {})):
            assert all(_seconds(v) for v in table.values())
        for span in rec.get("timeline", []):
            assert math.isfinite(span["end"] - span["start"]) and isinstance(span["device"], str)


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(sorted(GOOD_LINE)), JSON_VALUE), max_size=3),
       extra=st.lists(st.one_of(JSON_VALUE.map(lambda v: json.dumps(v, allow_nan=True)), NASTY_TEXT), max_size=2))
def test_fuzzed_run_logs_load_or_are_refused_in_one_line(tmp_path_factory, edits, extra):
    line = dict(GOOD_LINE)
    for key, value in edits:
        line[key] = value
    path = tmp_path_factory.mktemp("fuzz") / "run.jsonl"
    text = "\n".join([json.dumps(GOOD_LINE), json.dumps({**line, "iteration": 1}, allow_nan=True), *extra])
    path.write_text(text + "\n", encoding="utf-8", errors="surrogatepass")
    _refusable("run log", path, read_log, _log_ok)
