"""The workload spec's optimizer and data sections, `--set` overrides, and where spec errors point."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hetprof.cli import cli
from hetprof.errors import SpecError
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.specs.overrides import apply_overrides, parse_override, split_field_path

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "workloads" / "grpo-tiny.yaml"
CLUSTER = ROOT / "examples" / "clusters" / "cpu-local.yaml"


def test_defaults_are_adamw_constant_lr_and_grad_clip_one():
    w = WorkloadSpec.load(TINY)
    assert w.optimizer.betas == [0.9, 0.999] and w.optimizer.eps == 1e-8 and w.optimizer.weight_decay == 0.0
    assert w.optimizer.lr_schedule == "constant" and w.optimizer.max_grad_norm == 1.0
    assert w.data.prompt_field == "prompt" and w.data.eval_every == 0


def test_overrides_are_yaml_typed_and_checked_like_the_file():
    w = WorkloadSpec.load(TINY, ["training.lr=3e-4", "optimizer.betas=[0.9, 0.95]", "optimizer.lr_schedule=cosine",
                                 "optimizer.grad_clip=0", "data.prompt_field=question", "optimizer.betas[1]=0.98"])
    assert w.training.lr == 3e-4 and w.optimizer.betas == [0.9, 0.98] and w.optimizer.lr_schedule == "cosine"
    assert w.optimizer.max_grad_norm is None and w.data.prompt_field == "question"


@pytest.mark.parametrize(("item", "expected"), [
    ("training.lrr=1", "--set training.lrr=1: field 'training.lrr': expected 'lr' (did you mean it?)"),
    ("optimizer.lr_schedule=cosin", "(did you mean 'cosine'?)"),
    ("optimizer.betas=[0.9, 1.5]", "--set optimizer.betas=[0.9, 1.5]: field 'optimizer.betas': expected two numbers"),
    ("training.lr.x=1", "field 'training.lr.x': expected a field or list index under 'training.lr', got 0.01"),
    ("optimizer.betas[1]=0.9", "field 'optimizer.betas[1]': expected a list written at 'optimizer.betas' in the "
                               "file (or set it whole: optimizer.betas=[...])"),
    ("nokey", "field 'nokey': expected KEY.PATH=VALUE"),
    ("training.lr=[1", "field 'training.lr': expected a YAML value"),
    ("data.eval_every=2", "field 'data.eval_every': expected a validation set too"),
])
def test_bad_overrides_name_the_key(item, expected):
    with pytest.raises(SpecError) as err:
        WorkloadSpec.load(TINY, [item])
    assert expected in str(err.value)


def test_override_helpers():
    assert split_field_path("hosts[2].gpus.type") == ["hosts", 2, "gpus", "type"]
    assert parse_override("a.b=1e-6") == ("a.b", 1e-6) and parse_override("a=null") == ("a", None)
    data = {"a": {"b": 1}}
    assert apply_overrides(data, ["a.c.d=x"]) == {"a": {"b": 1, "c": {"d": "x"}}} and data == {"a": {"b": 1}}
    assert apply_overrides({"a": [1, 2]}, ["a[1]=3"]) == {"a": [1, 3]}
    with pytest.raises(SpecError, match=r"field 'a\[2\]': expected an index below 2 in 'a', got 2"):
        apply_overrides({"a": [1, 2]}, ["a[2]=3"])


def test_unknown_field_gets_did_you_mean_and_its_line_and_column(tmp_path):
    spec = tmp_path / "w.yaml"
    spec.write_text(TINY.read_text() + "optimiser:\n  weight_decay: 0.1\n")
    line = len(TINY.read_text().splitlines()) + 1
    with pytest.raises(SpecError) as err:
        WorkloadSpec.load(spec)
    assert str(err.value).startswith(f"{spec}:{line}:1: field 'optimiser': expected 'optimizer' (did you mean it?)")


def test_a_bad_nested_value_points_at_its_line(tmp_path):
    spec = tmp_path / "w.yaml"
    spec.write_text(TINY.read_text() + "optimizer:\n  eps: 1.0e-8\n  lr_schedule: cosine\n  warmup_steps: -3\n")
    line = len(TINY.read_text().splitlines()) + 4
    with pytest.raises(SpecError, match=rf"w.yaml:{line}:3: field 'optimizer.warmup_steps'"):
        WorkloadSpec.load(spec)


def test_yaml_syntax_errors_name_line_and_column(tmp_path):
    spec = tmp_path / "c.yaml"
    spec.write_text("name: x\nhosts:\n  - {name: a, gpus: {type: cpu, count: 2}\n  - b\n")
    with pytest.raises(SpecError, match=r"c.yaml:4:3: field '<root>': expected valid YAML/JSON"):
        ClusterSpec.load(spec)
    plan = tmp_path / "p.json"
    plan.write_text('{"cluster": {},\n "x": }')
    result = CliRunner().invoke(cli, ["run", str(plan)])
    assert result.exit_code == 2 and f"{plan}:2:7:" in result.output, result.output


def test_plan_set_overrides_the_workload_and_names_a_bad_key(tmp_path):
    out = tmp_path / "plan.json"
    args = ["--db", str(tmp_path / "db.sqlite"), "plan", "-c", str(CLUSTER), "-w", str(TINY), "--max-evals", "20",
            "--max-tp", "1", "--max-pp", "1"]
    bad = CliRunner().invoke(cli, [*args, "--set", "training.kl_coeff=0"])
    assert bad.exit_code == 2 and "--set training.kl_coeff=0" in bad.output and "'kl_coef'" in bad.output
    good = CliRunner().invoke(cli, [*args, "--set", "training.kl_coef=0", "--set", "optimizer.weight_decay=0.1",
                                    "--out", str(out)])
    assert good.exit_code == 0, good.output
    from hetprof.specs import Plan

    plan = Plan.load(out)
    assert plan.workload["training"]["kl_coef"] == 0 and plan.workload["optimizer"]["weight_decay"] == 0.1
    assert "ref_infer" not in {t.task for t in plan.tasks}  # the override changed the job, not only a label


def test_a_file_given_by_set_is_relative_to_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    w = WorkloadSpec.load(TINY, ["data.prompts=train.jsonl", "data.validation=~/val.jsonl"])
    assert w.data.prompts == str(tmp_path / "train.jsonl")  # not the workload file's folder
    assert w.data.validation == str(Path("~/val.jsonl").expanduser())
    assert WorkloadSpec.load(TINY).data.prompts is None
