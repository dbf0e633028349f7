"""Property-based fuzzing of the executor's readers of shared files: prompt files and checkpoint markers.

Property: each input either loads (every prompt a non-empty string, every marker a committed
iteration with a plain run name) or is refused with a HetprofError of one line, exit 2, naming the
file — never another exception — in bounded traced memory.

The suite tries a few dozen inputs per reader; the campaign tries thousands:

    HYPOTHESIS_PROFILE=campaign .venv/bin/pytest -q -p no:cacheprovider tests/executor/test_hostile_executor_fuzz.py -s
"""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetprof.errors import HetprofError
from hetprof.executor.checkpoints import checkpoint
from hetprof.executor.prompts.prompt_files import load_prompts

CAMPAIGN = os.environ.get("HYPOTHESIS_PROFILE") == "campaign"
FUZZ = settings(max_examples=2000 if CAMPAIGN else 30, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
MEMORY_CAP = 128 * 2**20
TRIED: dict[str, int] = {}

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
    if TRIED:
        print(f"\nfuzzed inputs per reader: {TRIED}; memory cap {MEMORY_CAP >> 20} MiB")


def _refusable(path: Path, read, accept) -> None:
    outcome = "loaded"
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
    key = f"{read.__name__} {outcome}"
    TRIED[key] = TRIED.get(key, 0) + 1


def _prompts_ok(prompts) -> None:
    assert prompts and all(isinstance(p.text, str) and p.text.strip() for p in prompts)
    for p in prompts:
        p.text.encode("utf-8")  # no lone surrogate got through


@FUZZ
@given(rows=st.lists(st.one_of(ROW.map(lambda r: json.dumps(r, allow_nan=True)), NASTY_TEXT), max_size=6))
def test_fuzzed_jsonl_prompt_files_load_or_are_refused_in_one_line(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("fuzz") / "p.jsonl"
    path.write_text("\n".join(rows), encoding="utf-8", errors="surrogatepass")
    _refusable(path, load_prompts, _prompts_ok)


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
    _refusable(path, load_prompts, _prompts_ok)


def _marker_ok(meta) -> None:
    assert type(meta["iteration"]) is int and checkpoint.run_name_problem(meta["run"]) is None


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

    _refusable(root / checkpoint.COMMIT, committed, _marker_ok)
