"""A run's outputs beside its log, end to end: TensorBoard, Hugging Face exports, trace, measured Gantt.

One PPO run on two CPU workers covers them all (the plan: `ppo_plan`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers.inprocess import hetprof_here
from test_executor_runtime_run import ROOT, hetprof_run
from test_executor_tensorboard import event_scalars

from hetprof.executor.launch.handwritten_plan import handwritten_plan
from hetprof.executor.records.run_log import read_log
from hetprof.specs import ClusterSpec, WorkloadSpec

PLACEMENT = {"actor_gen": ["localhost:0"], "ref_infer": ["localhost:1"], "critic_infer": ["localhost:0"],
             "actor_train": [["localhost:0", "localhost:1"]], "critic_train": ["localhost:1", "localhost:0"]}


def ppo_plan(path: Path) -> Path:
    """PPO on two CPU slots: the actor tensor-parallel over both, the critic FSDP-sharded over both and
    led by rank 1 — each export is gathered first, and the critic's is written by a non-leader rank."""
    cluster = ClusterSpec.from_dict({"name": "cpu", "hosts": [{"name": "localhost", "gpus": {"type": "cpu",
                                                                                              "count": 2}}]})
    base = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    base.update({"prompts_per_step": 4, "responses_per_prompt": 2, "ppo_epochs": 1, "mini_batches": 1,
                 "algorithm": "ppo", "models": {"actor": "tiny", "critic": "tiny"}})
    handwritten_plan(cluster, base, PLACEMENT, sharding={"critic_train": "fsdp"}).save(path)
    return path


@pytest.mark.slow
def test_a_ppo_run_leaves_curves_loadable_models_a_trace_and_a_timeline(tmp_path):
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

    plan = ppo_plan(tmp_path / "plan.json")
    ckpt = tmp_path / "ckpt"
    done = hetprof_run(plan, tmp_path, "--iterations", "3", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2",
                       "--trace", str(tmp_path / "trace"), "--trace-iterations", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_log(tmp_path / "run.jsonl")

    values, texts, _ = event_scalars(tmp_path / "tensorboard" / records[0]["run"])
    for tag in ("reward/mean", "reward/std", "train/kl", "train/entropy", "train/grad_norm", "train/clip_frac",
                "train/lr", "batch/response_len", "throughput/tokens_per_s", "seconds/actor_train/measured",
                "critic/value_loss"):
        assert [step for step, _ in values[tag]] == [0, 1, 2], tag
    assert [v for _, v in values["train/grad_norm"]] == pytest.approx([r["grad_norm"] for r in records])
    # verl's names for the same quantities; PPO's KL is in the reward, so not verl's critic/rewards/mean
    for tag in ("critic/vf_loss", "critic/score/mean", "timing_s/update_critic", "timing_s/values", "perf/throughput"):
        assert [step for step, _ in values[tag]] == [0, 1, 2], tag
    assert "critic/rewards/mean" not in values and all(r["kl_in_reward"] and r["mfu"] == {} for r in records)
    assert len(texts) == 3 and "| prompt | response |" in texts[0]

    exports = ckpt / "hf"
    # the iterations kept, beside the run's own record of what it exported (pruning removes only those)
    assert sorted(p.name for p in exports.iterdir() if p.is_dir()) == ["iter-000002", "iter-000003"]
    assert sorted(p.name for p in exports.iterdir() if p.is_file()) == ["WRITTEN-actor.json", "WRITTEN-critic.json"]
    actor = AutoModelForCausalLM.from_pretrained(exports / "iter-000003" / "actor", local_files_only=True)
    earlier = AutoModelForCausalLM.from_pretrained(exports / "iter-000002" / "actor", local_files_only=True)
    tok = AutoTokenizer.from_pretrained(exports / "iter-000003" / "actor", local_files_only=True)
    ids = torch.tensor([tok.encode("what is 2+3?")])
    assert not torch.equal(actor(ids).logits, earlier(ids).logits)  # the third update is in it
    assert actor.generate(ids, max_new_tokens=2, do_sample=False).shape == (1, ids.shape[1] + 2)
    critic = AutoModelForTokenClassification.from_pretrained(exports / "iter-000003" / "critic", local_files_only=True)
    assert critic(ids).logits.shape == (1, ids.shape[1], 1)

    for rank in (0, 1):  # the first loop step is left out: iteration 1 is the one traced
        events = json.loads((tmp_path / "trace" / f"rank{rank}.pt.trace.json").read_text())["traceEvents"]
        names = {e.get("name") for e in events}
        assert "iteration 1" in names and "iteration 0" not in names
        assert any(str(n).startswith("aten::") for n in names)  # the ops the traced iteration ran

    assert {s["task"] for s in records[1]["timeline"]} >= {"actor_gen", "actor_train", "critic_train", "reward"}
    gantt = hetprof_here(["--db", str(tmp_path / "db.sqlite"), "validate", str(tmp_path / "run.jsonl"),
                          "--gantt", str(tmp_path / "run.png")], tmp_path)
    assert gantt.returncode == 0, gantt.stderr
    assert (tmp_path / "run.png").read_bytes()[:4] == b"\x89PNG"


def test_tensorboard_goes_beside_the_log_unless_moved_or_turned_off(tmp_path, monkeypatch):
    import hetprof.executor.launch.elastic as launch
    from hetprof.executor.cli import run

    seen = []
    monkeypatch.setattr(launch, "launch", lambda options, **_: seen.append(options))
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    monkeypatch.chdir(tmp_path)
    for args in (["--log", "logs/run.jsonl"], [], ["--tensorboard-dir", "tb"], ["--no-tensorboard"]):
        result = CliRunner().invoke(run, [str(plan), *args])
        assert result.exit_code == 0, result.output
    assert [o.tensorboard_dir for o in seen] == [str(tmp_path / "logs" / "tensorboard"), str(tmp_path / "tensorboard"),
                                                 str(tmp_path / "tb"), None]
    assert all(o.trace_dir is None and o.trace_iterations == 2 for o in seen)


def test_trace_iterations_below_one_is_bad_input(tmp_path):
    from hetprof.executor.cli import run

    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    result = CliRunner().invoke(run, [str(plan), "--trace", str(tmp_path / "t"), "--trace-iterations", "0"])
    assert result.exit_code == 2 and "--trace-iterations" in result.output
