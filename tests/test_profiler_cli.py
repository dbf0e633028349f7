"""`hetprof profile` from the command line: the quick tasks path, the summary, and clear errors."""

from __future__ import annotations

from click.testing import CliRunner

from hetprof.cli import cli
from hetprof.profiles import ProfileDB


def _run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_quick_tasks_profile_writes_rows_and_a_summary(tmp_path):
    db = tmp_path / "p.db"
    res = _run("--db", str(db), "profile", "--quick", "--suite", "tasks", "--models", "tiny",
               "--tasks", "prefill,decode", "--host", "node-a")
    assert res.exit_code == 0, res.output
    assert "task.prefill" in res.output and "benchmark runs" in res.output
    assert "measuring the CPU" in res.output  # said plainly when there is no GPU
    with ProfileDB(db) as pdb:
        df = pdb.samples("task.")
        devs = pdb.devices()
    assert set(df["benchmark"]) == {"task.prefill", "task.decode"}
    assert set(df["host"]) == {"node-a"} and set(df["catalog_type"]) == {"cpu"}
    assert devs.loc[0, "catalog_type"] == "cpu"


def test_bad_input_names_the_option(tmp_path):
    db = str(tmp_path / "p.db")
    for args, needle in ((["--models", "gpt-17"], "--models"), (["--suite", "flops"], "--suite"),
                         (["--device", "gpu0"], "--device"), (["--tasks", "sample"], "--tasks"), (["--max-message", "lots"], "--max-message"),
                         (["--suite", "link", "--nnodes", "2", "--node-rank", "2", "--rdzv", "h:1"], "--node-rank"),
                         (["--suite", "link", "--nnodes", "2", "--rdzv", "nohost"], "--rdzv")):
        res = _run("--db", db, "profile", "--quick", *args)
        assert res.exit_code != 0, args
        assert needle in res.output, (args, res.output)
        assert "Traceback" not in res.output


def test_list_suites():
    res = _run("profile", "--list-suites")
    assert res.exit_code == 0
    for name in ("inventory", "compute", "memory", "collectives", "tasks", "link"):
        assert name in res.output
