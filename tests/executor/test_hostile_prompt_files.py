"""Hostile prompt files (issue 37): bounded before anything is materialised, refused in one line.

Each case ends in a SpecError (exit 2) naming the file (and line or row) and the limit, fast and in
bounded memory; a plan's own prompt file outside its folder is refused unless the user allows it.
"""

from __future__ import annotations

import json
import os
import time
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from hetprof.cli import cli
from hetprof.errors import SpecError
from hetprof.executor.launch.handwritten_plan import handwritten_plan
from hetprof.executor.prompts import prompt_files
from hetprof.executor.prompts.prompt_files import load_prompts
from hetprof.safety.tables import TableLimits
from hetprof.specs import ClusterSpec, WorkloadSpec

ROOT = Path(__file__).resolve().parents[2]


def _refused(path, match, **kw):
    tracemalloc.start()
    started = time.process_time()
    try:
        with pytest.raises(SpecError, match=match) as err:
            load_prompts(path, **kw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    text = str(err.value)
    assert err.value.exit_code == 2 and "\n" not in text and str(path) in text
    assert peak < 64 << 20 and time.process_time() - started < 20  # generous: refusals are sub-second
    return text


def test_non_regular_files_are_refused_at_once(tmp_path):
    fifo = tmp_path / "p.jsonl"
    os.mkfifo(fifo)
    _refused(fifo, "FIFO")
    _refused(Path("/dev/zero"), "character device", fmt="jsonl")


def test_a_jsonl_without_newlines_is_refused_at_its_first_line(tmp_path):
    path = tmp_path / "zeros.jsonl"
    with open(path, "wb") as f:
        f.truncate(64 << 20)  # sparse: 64 MB of zero bytes, no newline
    assert ":1" in _refused(path, "a line of at most")


@pytest.mark.parametrize("line, match", [
    ('{"prompt": ' + "[" * 50_000 + "]" * 50_000 + "}", "nested too deep"),
    ('{"prompt": ' + "[" * 100 + "]" * 100 + ', "answer": "1"}', "nested at most"),
    ('{"prompt": "\\ud800", "answer": "1"}', "lone surrogates"),
    ('{"prompt": "x", "answer": NaN}', "NaN is not a JSON number"),
    ('{"prompt": "x", "answer": 1e999}', "finite"),
])
def test_hostile_jsonl_rows_are_named_by_line(tmp_path, line, match):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n' + line + "\n")
    assert f"{path}:2" in _refused(path, match)


def test_a_deep_json_file_is_refused(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    _refused(path, "nested")


def test_a_parquet_claiming_too_many_rows_is_refused_from_its_footer(tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"prompt": pa.nulls(prompt_files.MAX_ROWS + 1, pa.string())}), path)
    assert os.path.getsize(path) < 1 << 20
    _refused(path, "rows")


def test_a_dictionary_bomb_parquet_is_refused_before_decoding(tmp_path):
    value = pa.array(["x" * (2 << 20)])  # one 2 MB prompt that every row repeats
    column = pa.DictionaryArray.from_arrays(pa.array([0] * 2000, pa.int32()), value)
    path = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"prompt": column}), path, compression="zstd", dictionary_pagesize_limit=8 << 20)
    assert os.path.getsize(path) < 1 << 20  # 4 GB once decoded
    assert "row 1 holds" in _refused(path, "more than the")


@pytest.mark.parametrize("nest", ["struct", "list of structs"])
def test_a_dictionary_bomb_nested_in_a_column_is_refused_before_decoding(tmp_path, nest):
    """verl's layout nests text (`reward_model.ground_truth`, chat turns' `content`): a dictionary
    there is sized from its indices like a top-level one. No Arrow schema is stored, so nothing in
    the file asks for the dictionary to be kept."""
    rows = 2000
    value = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["x" * (2 << 20)]))
    if nest == "struct":
        column = pa.StructArray.from_arrays([value], names=["ground_truth"])
    else:
        turns = pa.StructArray.from_arrays([pa.array(["user"] * rows), value], names=["role", "content"])
        column = pa.ListArray.from_arrays(pa.array(range(rows + 1), pa.int32()), turns)
    path = tmp_path / "nested-bomb.parquet"
    pq.write_table(pa.table({"prompt": ["2+2?"] * rows, "reward_model": column}), path, compression="zstd",
                   dictionary_pagesize_limit=8 << 20, store_schema=False)
    assert os.path.getsize(path) < 1 << 20  # 4 GB once decoded
    pool = pa.default_memory_pool()
    before = pool.max_memory() or 0
    assert "row 1 holds" in _refused(path, "more than the")
    assert (pool.max_memory() or 0) < before + (512 << 20)  # decoding one batch would take 2 GB


def test_a_compressed_arrow_bomb_is_refused_from_its_metadata(tmp_path, monkeypatch):
    monkeypatch.setattr(prompt_files, "LIMITS", TableLimits(rows=1000, bytes=4 << 20, row_bytes=1 << 20))
    table = pa.table({"prompt": ["y" * 4096] * 2048})  # 8 MB decoded, a few KB compressed
    path = tmp_path / "bomb.arrow"
    with ipc.new_stream(path, table.schema, options=ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table)
    assert os.path.getsize(path) < 1 << 20
    _refused(path, "once decompressed|rows")


def test_a_huge_csv_header_is_refused_fast(tmp_path):
    path = tmp_path / "wide.csv"
    path.write_text(",".join(f"c{i}" for i in range(400_000)) + "\n" + "x\n")
    _refused(path, "header line|columns")


def test_within_limits_every_reader_still_reads(tmp_path):
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    table = pa.Table.from_pylist(rows)
    with ipc.new_stream(tmp_path / "p.arrow", table.schema, options=ipc.IpcWriteOptions(compression="lz4")) as w:
        w.write_table(table)
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in ("p.parquet", "p.arrow", "p.jsonl"):
        assert [(p.text, p.answer) for p in load_prompts(tmp_path / name)] == [("1+1=", "2"), ("2+2=", "4")]


# ---- a plan's own prompt file must lie in the plan's folder ---------------------------------------------

def _plan_with_prompts(folder: Path, prompts: str) -> Path:
    cluster = ClusterSpec.from_dict({"name": "cpu", "hosts": [{"name": "localhost", "gpus": {"type": "cpu", "count": 2}}]})
    base = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    base.update({"prompts_per_step": 4, "responses_per_prompt": 4, "ppo_epochs": 1, "mini_batches": 1,
                 "base_dir": str(folder)})
    base["data"] = {**base.get("data", {}), "prompts": prompts}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "plan.json"
    handwritten_plan(cluster, base, {"actor_gen": ["localhost:0"], "ref_infer": ["localhost:1"],
                                     "actor_train": ["localhost:1"]}).save(path)
    return path


@pytest.mark.parametrize("reference", ["ABSOLUTE", "../secret.jsonl", "link.jsonl"])
def test_a_plans_prompts_outside_its_folder_are_refused_unless_allowed(tmp_path, monkeypatch, reference):
    import torch.distributed.launcher.api as api

    def refuse(*_a, **_k):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(api, "elastic_launch", refuse)
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"prompt": "my token is hunter2", "answer": "1"}\n')
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "link.jsonl").symlink_to(secret)
    plan = _plan_with_prompts(tmp_path / "shared", str(secret) if reference == "ABSOLUTE" else reference)
    args = ["--db", str(tmp_path / "db.sqlite"), "run", str(plan), "--log", str(tmp_path / "run.jsonl")]
    result = CliRunner().invoke(cli, args)
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "data.prompts" in lines[0] and "--allow-prompts-outside" in lines[0] and str(plan) in lines[0]
    allowed = CliRunner().invoke(cli, [*args, "--allow-prompts-outside"])
    assert "--allow-prompts-outside" not in allowed.output  # past the check (the next ones decide the rest)
    named = CliRunner().invoke(cli, [*args, "--prompts", str(secret)])  # the user's own choice
    assert "--allow-prompts-outside" not in named.output


def test_a_plans_prompts_inside_its_folder_are_read(tmp_path):
    plan = _plan_with_prompts(tmp_path / "shared", "data/p.jsonl")
    prompt_files.check_confined(WorkloadSpec.from_dict(json.loads(plan.read_text())["workload"]).data,
                                str(tmp_path / "shared"), plan)
