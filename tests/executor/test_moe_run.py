"""A tiny Qwen3-MoE (transformers' Qwen3MoeForCausalLM at the `tiny-moe` preset, random weights)
trains with GRPO end to end on CPU: hf generation, log-probs, data-parallel training, weight sync,
a Hugging Face export — and with expert parallelism (actor_train and ref_infer DP2 EP2: each rank
holds half of every MoE layer's experts) the same losses and gradient norms as without, to rounding.

Two runs share one module-scoped fixture (each `hetprof run` starts worker processes): the same plan
with EP1 and with EP2.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from test_executor_runtime_run import ROOT, hetprof_run

from hetprof.executor.checkpoints.hf_export import export_folder
from hetprof.executor.launch.handwritten_plan import handwritten_plan
from hetprof.executor.models.modeling import build_causal_lm
from hetprof.executor.records.run_log import read_log
from hetprof.specs import ClusterSpec, WorkloadSpec

pytestmark = pytest.mark.slow  # multi-process: `make test-fast` leaves it out

BOTH = ["localhost:0", "localhost:1"]
PLACEMENT = {"actor_gen": BOTH, "ref_infer": BOTH, "actor_train": BOTH}


def moe_plan(path: Path, ep: int) -> Path:
    """The tiny MoE's GRPO plan on two CPU slots, actor_train and ref_infer at expert-parallel degree `ep`."""
    cluster = ClusterSpec.from_dict({"name": "cpu", "hosts": [{"name": "localhost", "gpus": {"type": "cpu",
                                                                                              "count": 2}}]})
    workload = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    # two mini-batches, so each update clips and steps twice on rows the two replicas hold unevenly
    workload.update({"prompts_per_step": 4, "responses_per_prompt": 4, "ppo_epochs": 1, "mini_batches": 2,
                     "models": {"actor": "tiny-moe"}})
    handwritten_plan(cluster, workload, PLACEMENT, shares={"actor_train": [0.75, 0.25]},
                     expert_parallel={"actor_train": ep, "ref_infer": ep}).save(path)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, Path]:
    """Each EP degree's run folder (run.jsonl; checkpoint and HF export after iteration 2)."""
    out = {}
    for ep in (1, 2):
        tmp = tmp_path_factory.mktemp(f"ep{ep}")
        # a reward that differs between a group's responses (a random model rarely answers right), so
        # the advantages and with them every gradient are not zero
        (tmp / "spread.py").write_text("def score(prompt, response, answer):\n    return float(sum(map(ord, response)) % 7)\n")
        done = hetprof_run(moe_plan(tmp / "plan.json", ep), tmp, "--iterations", "2", "--verify-sync",
                           "--reward", "spread.py:score", "--checkpoint-dir", str(tmp / "ckpt"),
                           "--checkpoint-every", "2")
        assert done.returncode == 0, done.stderr[-3000:]
        out[ep] = tmp
    return out


def test_tiny_qwen3_moe_trains_with_grpo_on_cpu(runs):
    records = read_log(runs[1] / "run.jsonl")
    assert [r["iteration"] for r in records] == [0, 1]
    assert all(r["sync_verified"] is True for r in records)
    assert all(math.isfinite(r["kl"]) and math.isfinite(r["grad_norm"]) for r in records)
    assert records[0]["layouts"]["actor_train"] == "DP2×TP1×PP1"


def test_expert_parallel_training_equals_one_expert_group(runs):
    one, two = (read_log(runs[ep] / "run.jsonl") for ep in (1, 2))
    assert two[0]["layouts"]["actor_train"] == "DP2×TP1×PP1 EP2"
    assert two[0]["layouts"]["ref_infer"] == "DP2×TP1×PP1 EP2"
    assert all(r["sync_verified"] is True for r in two)  # the generators got the gathered experts
    assert all(r["grad_norm"] > 0 for r in one) and one[1]["kl"] != 0  # updates that moved the model
    for a, b in zip(one, two, strict=True):
        for key in ("policy_loss", "grad_norm", "kl", "entropy", "reward_mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (b["iteration"], key)


def _state(run: Path) -> dict[str, torch.Tensor]:
    from hetprof.executor.checkpoints import checkpoint

    folder = checkpoint.task_dir(run / "ckpt", "actor_train") / checkpoint.iteration_folder(2)
    return checkpoint.load(folder, map_location="cpu")[0]["model"]


def test_checkpoint_and_export_hold_the_whole_trained_model(runs):
    from transformers import AutoModelForCausalLM

    one, two = _state(runs[1]), _state(runs[2])
    assert set(two) == set(one)  # an EP checkpoint holds every expert, as one replica's would
    # Adam divides by the gradients' RMS, so an element whose gradient is near zero turns rounding
    # into up to a few thousandths of a step (lr 0.01): equal well within a hundredth of one
    for name, tensor in one.items():
        torch.testing.assert_close(two[name], tensor, rtol=0, atol=1e-4, msg=name)
    exported = AutoModelForCausalLM.from_pretrained(export_folder(runs[2] / "ckpt", 2, "actor")).eval()
    trained = build_causal_lm("tiny-moe")
    trained.load_state_dict(two)
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=ids).logits, trained.eval()(input_ids=ids).logits,
                                   rtol=1e-5, atol=1e-5)
