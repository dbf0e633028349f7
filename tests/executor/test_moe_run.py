"""A tiny Qwen3-MoE (transformers' Qwen3MoeForCausalLM at the `tiny-moe` preset, random weights)
trains with GRPO end to end on CPU: hf generation, log-probs, data-parallel training, weight sync."""

from __future__ import annotations

import math

from test_executor_runtime_run import hetprof_run, write_plan

from hetprof.executor.records.run_log import read_log


def test_tiny_qwen3_moe_trains_with_grpo_on_cpu(tmp_path):
    plan = write_plan(tmp_path / "plan.json", 2,
                      {"actor_gen": ["localhost:0", "localhost:1"], "ref_infer": ["localhost:0"],
                       "actor_train": ["localhost:0", "localhost:1"]},
                      models={"actor": "tiny-moe"})
    done = hetprof_run(plan, tmp_path, "--iterations", "2", "--verify-sync")
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_log(tmp_path / "run.jsonl")
    assert [r["iteration"] for r in records] == [0, 1]
    assert all(r["sync_verified"] is True for r in records)
    assert all(math.isfinite(r["kl"]) and math.isfinite(r["grad_norm"]) for r in records)
    assert records[0]["layouts"]["actor_train"] == "DP2×TP1×PP1"
