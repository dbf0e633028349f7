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


def test_workload_shapes_are_profiled_where_the_plan_will_ask(tmp_path):
    """--workload adds the job's own (batch, length) points, for the models of its roles only."""
    workload = tmp_path / "w.yaml"
    workload.write_text("name: w\nalgorithm: grpo\nmodels: {actor: tiny}\nprompts_per_step: 3\n"
                        "responses_per_prompt: 2\nprompt_len: {mean: 21, max: 23}\nresponse_len: {mean: 3, max: 4}\n"
                        "mini_batches: 2\nprecision: fp32\n")
    cluster = tmp_path / "c.yaml"
    cluster.write_text("name: c\nhosts:\n  - {name: h, gpus: {type: cpu, count: 2}, region: r}\n")
    db = tmp_path / "p.db"
    res = _run("--db", str(db), "profile", "--quick", "--suite", "tasks", "--tasks", "prefill,train",
               "--workload", str(workload), "--cluster", str(cluster))
    assert res.exit_code == 0, res.output
    with ProfileDB(db) as pdb:
        df = pdb.samples("task.")
    assert set(df["model"]) == {"tiny"}  # the workload's model, not the CPU default pair
    pre = df[df["benchmark"] == "task.prefill"]
    prefill = set(zip(pre["batch"], pre["seq_len"], strict=True))
    # 6 sequences on 1 or 2 replicas; prompts 21 and 23 wide, whole sequences 24 and 27
    assert {(6, 21), (3, 23), (6, 24), (3, 27)} <= prefill
    train = df[df["benchmark"] == "task.train"]
    assert {(3, 24), (2, 27)} <= set(zip(train["batch"], train["seq_len"], strict=True))  # a mini-batch of each replica


def test_workload_option_errors_name_the_file_or_option(tmp_path):
    bad = tmp_path / "w.yaml"
    bad.write_text("name: w\nmodels: {actor: gpt-17}\nprompt_len: {mean: 8}\nresponse_len: {mean: 4}\n")
    res = _run("--db", str(tmp_path / "p.db"), "profile", "--quick", "--suite", "tasks", "--workload", str(bad))
    assert res.exit_code != 0 and "w.yaml" in res.output and "models.actor" in res.output
    res = _run("--db", str(tmp_path / "p.db"), "profile", "--quick", "--cluster", str(bad))
    assert res.exit_code != 0 and "--cluster" in res.output and "--workload" in res.output
