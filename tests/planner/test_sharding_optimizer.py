"""The Adam step as a priced term: divided over the ranks that shard the optimizer, against hand arithmetic."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from hetprof.costmodels import Placement, Work, get_cost_model
from hetprof.planner.pinned import PinnedLayout, pinned_candidate
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.specs.catalog import builtin
from hetprof.specs.loader import from_data
from hetprof.specs.models import ModelShape

M = ModelShape("toy", "llama", 4, 64, 128, 4, 2, 16, 100, False)
PARAMS = 4 * ((64 * 64 + 2 * 64 * 32 + 64 * 64) + 3 * 64 * 128 + 2 * 64) + (100 * 64 + 100 * 64 + 64)
ADAM = 2 * 12 + 2 + 2  # bytes per parameter: fp32 master, m, v read + written; bf16 grad read, weight written


def _hbm(gpu: str) -> float:
    g = builtin().lookup(gpu)
    return g.hbm_Bps * g.efficiency.memory.best  # the flat memory curve's rate


@pytest.mark.parametrize("sharding, shards", [("none", 1), ("zero1", 4), ("zero2", 4), ("fsdp", 4)])
def test_each_rank_steps_only_its_optimizer_shard(sharding, shards):
    cm = get_cost_model("analytical")
    work = Work("training", M, batch=2, prompt_len=16, response_len=16)
    seconds = cm.optimizer_step_time(work, Placement("A100-80GB", dp=4, sharding=sharding))
    assert seconds == pytest.approx(PARAMS * ADAM / shards / _hbm("A100-80GB"))
    # tensor parallelism splits every matrix too; one replica shards nothing; inference has no step
    tp2 = cm.optimizer_step_time(work, Placement("A100-80GB", tp=2, dp=4, sharding=sharding))
    assert tp2 == pytest.approx(seconds / 2)
    assert cm.optimizer_step_time(work, Placement("A100-80GB", dp=1, sharding=sharding)) == pytest.approx(
        PARAMS * ADAM / _hbm("A100-80GB"))
    assert cm.optimizer_step_time(dataclasses.replace(work, kind="inference"), Placement("A100-80GB")) == 0.0


def test_a_fitted_model_without_a_training_fit_prices_the_step_as_the_analytical_one():
    fitted = get_cost_model("fitted")
    work = Work("training", M, 2, 16, 16)
    place = Placement("A100-80GB", dp=2, sharding="zero1")
    assert fitted.optimizer_step_time(work, place) == get_cost_model("analytical").optimizer_step_time(work, place)


WORKLOAD = {"name": "w", "algorithm": "grpo", "models": {"actor": "qwen3-0.6b"}, "prompts_per_step": 64,
            "responses_per_prompt": 4, "prompt_len": {"mean": 64, "max": 64}, "response_len": {"mean": 64, "max": 64},
            "mini_batches": 4, "training": {"kl_coef": 0.0}}
CLUSTER = {"name": "eight", "hosts": [{"name": "a", "gpus": {"type": "A100-80GB", "count": 8}}]}


def _train_seconds(tmp_path, sharding: str) -> tuple[float, Simulator]:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(CLUSTER))
    sim = Simulator(ClusterSpec.load(path), WorkloadSpec.from_dict(WORKLOAD), get_cost_model("analytical"),
                    streaming=False, executable=False)
    layout = {"groups": {"all": 8}, "tasks": {"generation": {"group": "all", "tp": 1, "pp": 1},
                                              "inference": {"group": "all", "tp": 1, "pp": 1},
                                              "training": {"group": "all", "tp": 1, "pp": 1, "sharding": sharding}}}
    score = sim.evaluate(pinned_candidate(sim, from_data(PinnedLayout, layout)))
    assert score.feasible
    return score.task_seconds["actor_train"], sim


def test_zero1_saves_seven_eighths_of_every_adam_step_over_ddp(tmp_path):
    ddp, sim = _train_seconds(tmp_path, "none")
    zero1, _ = _train_seconds(tmp_path, "zero1")
    # DDP's all-reduce and ZeRO-1's reduce-scatter + all-gather move the same bytes in as many steps,
    # so the difference is the Adam steps alone: 4 mini-batches of (1 - 1/8) of the model's step
    model = sim.graph.model_of("actor_train")
    work = Work("training", model, 1, 64, 64)
    full = get_cost_model("analytical").optimizer_step_time(work, Placement("A100-80GB"))
    assert ddp - zero1 == pytest.approx(4 * full * (1 - 1 / 8), rel=1e-6)


def test_activation_checkpointing_adds_no_fsdp_gather():
    from hetprof.costmodels import LinkSpec, comm

    cm = get_cost_model("analytical")
    link = LinkSpec(1e-5, 1e10)
    plain = Work("training", M, 4, 16.0, 16.0, "bf16", recompute=False)
    ckpt = dataclasses.replace(plain, recompute=True)
    place = Placement("A100-80GB")
    layer, root = 2.0 * (PARAMS - (100 * 64 + 100 * 64 + 64)) / 4, 2.0 * (100 * 64 + 100 * 64 + 64)

    def ring(op, size):
        return comm.collective_time(op, size, 4, 1e-5, 1e10)

    # no compute to hide behind: two gathers and one scatter a layer either way (no third gather
    # for the recompute: it runs inside the backward on the parameters gathered for it)
    bare = cm.dp_grad_sync_time(plain, place, 4, link, sharding="fsdp")
    assert bare == cm.dp_grad_sync_time(ckpt, place, 4, link, sharding="fsdp")
    assert bare == pytest.approx(ring("all_gather", root) + ring("reduce_scatter", root)
                                 + 4 * (2 * ring("all_gather", layer) + ring("reduce_scatter", layer)))
