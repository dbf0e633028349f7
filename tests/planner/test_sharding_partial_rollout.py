"""Partial rollout (verl's fully async trainer): generation never waits for the step's longest response."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from hetprof.costmodels import get_cost_model
from hetprof.errors import InfeasibleError, SpecError
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec

WORKLOAD = {"name": "w", "algorithm": "grpo", "mode": "async", "models": {"actor": "qwen3-0.6b"},
            "prompts_per_step": 64, "responses_per_prompt": 4, "prompt_len": {"mean": 64, "max": 64},
            "response_len": {"mean": 256, "max": 4096, "dist": "lognormal", "std": 512},
            "training": {"kl_coef": 0.0}}


def _costs(tmp_path, partial: bool):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"name": "one", "hosts": [{"name": "h", "gpus": {"type": "H100-SXM", "count": 8}}]}))
    workload = WorkloadSpec.from_dict({**WORKLOAD, "generation": {"partial_rollout": partial}})
    return Simulator(ClusterSpec.load(path), workload, get_cost_model("analytical"), streaming=False,
                     executable=False).costs


def test_every_replica_decodes_the_steps_mean_length_under_partial_rollout(tmp_path):
    whole, partial = _costs(tmp_path, False), _costs(tmp_path, True)
    assert whole.basis.replica_lengths(8)[-1] == whole.basis.lengths.max() > 4 * whole.basis.lengths.mean()  # it waits for the tail
    lengths = partial.basis.replica_lengths(8)
    # the same tokens in all (the sample's mean each), none of them the tail: it carries over to the next step
    assert np.allclose(lengths, partial.basis.lengths.mean())
    assert lengths.sum() == pytest.approx(partial.basis.lengths.mean() * 8)


def test_partial_rollout_is_refused_for_a_sync_workload_naming_the_field():
    with pytest.raises(SpecError, match=r"generation\.partial_rollout"):
        WorkloadSpec.from_dict({**WORKLOAD, "mode": "sync", "generation": {"partial_rollout": True}})


def test_a_plan_for_hetprof_run_refuses_partial_rollout_it_does_not_carry_out(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"name": "one", "hosts": [{"name": "h", "gpus": {"type": "H100-SXM", "count": 8}}]}))
    workload = WorkloadSpec.from_dict({**WORKLOAD, "generation": {"partial_rollout": True}})
    with pytest.raises(InfeasibleError, match=r"generation\.partial_rollout.*--any-layout"):
        Simulator(ClusterSpec.load(path), workload, get_cost_model("analytical"), executable=True)
