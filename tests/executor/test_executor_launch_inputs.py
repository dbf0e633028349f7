"""What a run reads and writes is checked before any worker starts (exit 2, one line naming the file);
`run --set` overrides (a real run with them: test_executor_runtime_run.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from hetprof.cli import cli
from hetprof.errors import HetprofError, SpecError
from hetprof.executor.launch.checks import check_generation_backend, check_writable, load_plan
from hetprof.executor.launch.handwritten_plan import handwritten_plan
from hetprof.specs import ClusterSpec, WorkloadSpec

ROOT = Path(__file__).resolve().parents[2]
HETPROF = str(Path(sys.executable).with_name("hetprof"))


def _plan(path: Path, backend: str = "hf", **workload: object) -> Path:
    cluster = ClusterSpec.from_dict({"name": "cpu", "hosts": [{"name": "localhost", "gpus": {"type": "cpu", "count": 2}}]})
    base = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    base.update({"prompts_per_step": 4, "responses_per_prompt": 4, "ppo_epochs": 1, "mini_batches": 1, **workload})
    handwritten_plan(cluster, base, {"actor_gen": ["localhost:0"], "ref_infer": ["localhost:1"],
                                     "actor_train": ["localhost:1"]}, backend=backend).save(path)
    return path


@pytest.fixture
def no_workers(monkeypatch):
    """Fail the test if the launcher is ever reached (a worker would start)."""
    import torch.distributed.launcher.api as api

    def refuse(*_a, **_k):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(api, "elastic_launch", refuse)


def _run(tmp_path, *args):
    return CliRunner().invoke(cli, ["--db", str(tmp_path / "db.sqlite"), "run", str(_plan(tmp_path / "plan.json")),
                                    "--log", str(tmp_path / "run.jsonl"), *args])


@pytest.mark.parametrize(("content", "where"), [
    ('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", answer: 4}\n', ":2:20: field '<root>'"),
    ('{"prompt": "1+1=", "answer": "2"}\n\n{"answer": "4"}\n', ":3: field 'prompt'"),
])
def test_a_malformed_prompts_file_is_refused_before_any_worker(tmp_path, no_workers, content, where):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    result = _run(tmp_path, "--prompts", str(bad))
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {bad}{where}"), result.output
    assert not (tmp_path / "run.jsonl").exists()


@pytest.mark.parametrize(("args", "phrase"), [
    (["--reward", "nosuch"], "unknown reward 'nosuch'"),
    (["--reward", "no_such_module_xyz:score"], "an installed module"),
    (["--prompts", "{tmp}/unanswered.jsonl"], "unanswered.jsonl:1: field 'answer': expected the reference answer "
                                              "reward 'arithmetic' scores against (this row's fields: prompt, "
                                              "solution;"),
    (["--set", "data.prompts=missing.parquet"], "missing.parquet: field '<root>': expected an existing"),
    (["--set", "data.prompt_field=question", "--prompts", "{tmp}/t.csv"], "t.csv row 1: field 'question'"),
    (["--prompts", "{tmp}/bad.csv"], "bad.csv: field '<root>': expected a readable csv file, got 'Error tokenizing "
                                     "data. C error: Expected 2 fields in line 3, saw 3'"),
    (["--set", "training.kl_coef=0"], "--set training.kl_coef=0: field 'training.kl_coef': expected a field "
                                      "`hetprof run` may change"),
    (["--set", "optimizer.warmup_step=3"], "expected 'warmup_steps' (did you mean it?)"),
    (["--set", "traning.lr=1e-3"], "--set traning.lr=1e-3: field 'traning.lr': expected a field `hetprof run` may "
                                   "change (optimizer.*, data.*, training.lr, critic_lr, clip_eps, gamma, lam, "
                                   "temperature, top_p) — did you mean 'training.lr'?"),
    (["--checkpoint-dir", "{tmp}/plan.json/ckpt"], "--checkpoint-dir {tmp}/plan.json/ckpt: cannot write there "
                                                   "({tmp}/plan.json is a file, not a folder)"),
    (["--log", "{tmp}/plan.json/run.jsonl"], "is a file, not a folder"),
    (["--tensorboard-dir", "{tmp}/plan.json/tb"], "--tensorboard-dir {tmp}/plan.json/tb: cannot write there"),
    (["--trace", "{tmp}/plan.json/trace"], "--trace {tmp}/plan.json/trace: cannot write there"),
    (["--prompts", "{tmp}/long.jsonl"], "long.jsonl:3: the prompt's 511 tokens + response_len.max 3 exceed the "
                                        "model's 512 positions"),
])
def test_bad_inputs_exit_2_before_any_worker(tmp_path, no_workers, args, phrase):
    (tmp_path / "t.csv").write_text("prompt,answer\n1+1=,2\n")
    (tmp_path / "bad.csv").write_text("prompt,answer\n1+1=,2\n2+2=,4,extra\n")
    fits, too_long = "x" * 508, "x" * 510  # the tiny preset's 512 positions: BOS + prompt + 3 response tokens
    (tmp_path / "long.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": "2"}) + "\n"
                                                 for p in ("1+1=", fits, too_long)))
    (tmp_path / "unanswered.jsonl").write_text(json.dumps({"prompt": "1+1=", "solution": "2"}) + "\n")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = _run(tmp_path, *args)
    assert result.exit_code == 2, result.output
    assert phrase.replace("{tmp}", str(tmp_path)) in result.output and "Traceback" not in result.output


def test_output_paths_are_checked_for_kind_and_parent(tmp_path):
    check_writable("--log", str(tmp_path / "new" / "deeper" / "run.jsonl"), "file")  # created later: fine
    check_writable("--checkpoint-dir", str(tmp_path), "folder")
    with pytest.raises(HetprofError, match="it is a folder"):
        check_writable("--log", str(tmp_path), "file")


@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_a_vllm_plan_without_vllm_is_bad_input(tmp_path, no_workers):
    plan = _plan(tmp_path / "vllm-plan.json", backend="vllm")
    result = CliRunner().invoke(cli, ["--db", str(tmp_path / "db.sqlite"), "run", str(plan), "--backend", "vllm"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {plan} runs the vllm generation backend, but vllm is not installed")
    check_generation_backend("hf", "plan.json")


def test_run_overrides_change_the_plans_workload(tmp_path):
    path = _plan(tmp_path / "plan.json")
    plan = load_plan(path, ["optimizer.lr_schedule=linear", "training.lr=2e-3", "data.eval_every=0"])
    w = plan.workload_spec()
    assert w.optimizer.lr_schedule == "linear" and w.training.lr == 2e-3
    with pytest.raises(SpecError, match="replan with `hetprof plan --set`"):
        load_plan(path, ["prompts_per_step=8"])


def test_validate_of_a_missing_log_is_bad_input(tmp_path):
    result = CliRunner().invoke(cli, ["--db", str(tmp_path / "db.sqlite"), "validate", "missing.jsonl"])
    assert result.exit_code == 2 and "missing.jsonl" in result.output


def test_the_cli_refuses_a_malformed_prompts_file_in_a_fresh_process(tmp_path):
    """The issue's must-show, as a user runs it: exit 2, the file and line named, no log, no worker."""
    plan = _plan(tmp_path / "plan.json")
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"prompt": "1+1=", "answer": "2"}\nnot json\n')
    start = time.monotonic()
    done = subprocess.run([HETPROF, "--db", str(tmp_path / "db.sqlite"), "run", str(plan), "--prompts", str(bad),
                           "--log", str(tmp_path / "run.jsonl")], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - start
    assert done.returncode == 2 and done.stderr.startswith(f"error: {bad}:2:1:"), done.stderr
    assert not (tmp_path / "run.jsonl").exists() and "hetprof-worker" not in done.stderr
    print(f"refused in {took:.1f} s")  # reported, not asserted: the machine may be busy
