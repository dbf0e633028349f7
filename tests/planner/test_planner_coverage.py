"""The planner says, one line per task, when the database has no rows of the job's model shape or
generation engine, and the `hetprof profile` command that measures them."""

from __future__ import annotations

import shlex
from pathlib import Path

from click.testing import CliRunner
from helpers.costmodels_synth import MODELS, add_rows

from hetprof.cli import cli
from hetprof.costmodels import calloverhead, fitting
from hetprof.planner.coverage import coverage_warnings, missing_rows
from hetprof.profiles import DeviceInfo, ProfileDB
from hetprof.specs import ClusterSpec, WorkloadSpec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WORKLOAD = EXAMPLES / "workloads" / "grpo-tiny.yaml"  # tiny, fp32, GRPO with a KL term
CLUSTER = EXAMPLES / "clusters" / "cpu-local.yaml"
TINY = MODELS["tiny"]


def _add_hf_calls(db: ProfileDB) -> None:
    dev = db.add_device(DeviceInfo(name="synthetic cpu", kind="cpu", catalog_type="cpu", host="synth"))
    shape = {k: getattr(TINY, k) for k in ("hidden", "ffn", "heads", "kv_heads", "head_dim", "vocab")}
    samples = [{"params": {"model": "tiny", "layers_run": TINY.layers, **shape, "dtype": "fp32", "with_head": True,
                           "threads": 1, "batch": b, "seq_len": 48, "new_tokens": 4},
                "metrics": {"seconds": 0.001 * b}} for b in (1, 2, 4) for _ in range(3)]
    db.add_benchmark(calloverhead.BENCHMARK, dev, "synth", {"model": "tiny"}, samples)


def _db(tmp_path: Path) -> Path:
    path = tmp_path / "profiles.db"
    with ProfileDB(path) as db:
        add_rows(db, models=("tiny",), tasks=("prefill", "decode", "train"), repeats=2)
        _add_hf_calls(db)
        fitting.store(db, fitting.fit_database(db, stat="median"))
    return path


def test_a_job_the_database_covers_gets_no_warning_and_another_engine_gets_one(tmp_path):
    workload, cluster = WorkloadSpec.load(WORKLOAD), ClusterSpec.load(CLUSTER)
    with ProfileDB(_db(tmp_path), readonly=True) as db:
        assert coverage_warnings(db, workload, cluster, "hf", "W.yaml", "C.yaml", "db") == []
        (line,) = coverage_warnings(db, workload, cluster, "vllm", "W.yaml", "C.yaml", "db")
        assert missing_rows(db, workload, cluster, "static") == {}  # no profiler times static batching
    assert line.startswith("actor_gen: ") and "vllm generation calls of tiny on cpu" in line
    assert line.endswith("hetprof profile --db db --suite vllmgen --workload W.yaml --cluster C.yaml")


def test_another_model_gets_one_line_per_task_with_the_command(tmp_path):
    workload = WorkloadSpec.load(WORKLOAD, ("models.actor=tiny-2x",))
    cluster = ClusterSpec.load(CLUSTER)
    with ProfileDB(_db(tmp_path), readonly=True) as db:
        lines = coverage_warnings(db, workload, cluster, "hf", "my job.yaml", "C.yaml", "db")
    tasks = [line.split(":", 1)[0] for line in lines]
    assert tasks == ["actor_gen", "actor_logprob", "ref_infer", "actor_train"]
    assert all("tiny-2x on cpu" in line and "\n" not in line for line in lines)
    assert "task.train of tiny-2x" in lines[-1] and "task.decode of tiny-2x" in lines[0]
    command = lines[0].split("profile them: ", 1)[1]
    assert shlex.split(command) == ["hetprof", "profile", "--db", "db", "--suite", "tasks", "--workload", "my job.yaml",
                                    "--cluster", "C.yaml"]


def test_hetprof_plan_prints_the_lines_for_the_fitted_model(tmp_path):
    db = _db(tmp_path)
    args = ["--db", str(db), "plan", "--cluster", str(CLUSTER), "--workload", str(WORKLOAD), "--cost-model", "fitted",
            "--search", "hetrl", "--max-evals", "20", "--max-tp", "1", "--max-pp", "1"]
    runner = CliRunner()
    covered = runner.invoke(cli, args)
    assert covered.exit_code == 0, covered.output
    assert "warning:" not in covered.stderr
    other = runner.invoke(cli, [*args, "--set", "models.actor=tiny-2x"])
    assert other.exit_code == 0, other.output
    warned = [line for line in other.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warned) == 4 and all(f"--db {db}" in line for line in warned)
