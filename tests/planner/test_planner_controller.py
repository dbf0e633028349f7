"""The controller's padded hand-off (training.padded_dispatch): every pass waits while the driver puts its
batch, padded to the longest prompt and response allowed, in the object store; hand-computed here."""

from __future__ import annotations

import pytest
import yaml

from hetprof.costmodels import get_cost_model
from hetprof.errors import SpecError
from hetprof.planner.controller import controller_seconds, dispatch_slots
from hetprof.planner.pinned import PinnedLayout, pinned_candidate
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.specs.catalog import builtin, load_catalog
from hetprof.specs.executable import workload_problems
from hetprof.specs.loader import from_data
from hetprof.specs.vocabulary import Task, TaskKind

# 4 prompts x 2 responses = 8 sequences; padded widths 16 (prompts) and 16 + 8 = 24 (whole sequences)
WORKLOAD = {"name": "tiny", "algorithm": "grpo", "models": {"actor": "tiny"}, "prompts_per_step": 4,
            "responses_per_prompt": 2, "prompt_len": {"mean": 10, "max": 16}, "response_len": {"mean": 5, "max": 8},
            "training": {"kl_coef": 0.0, "padded_dispatch": True}}
LAYOUT = {"groups": {"all": 2}, "tasks": {"generation": {"group": "all", "tp": 1, "pp": 1},
                                          "inference": {"group": "all", "tp": 1, "pp": 1},
                                          "training": {"group": "all", "tp": 1, "pp": 1}}}


def _catalog(tmp_path, per_slot: float):
    path = tmp_path / f"step{per_slot}.yaml"
    path.write_text(yaml.safe_dump({"step": {"overhead_s": 0.0, "source": "s", "dispatch_s_per_slot": per_slot,
                                             "dispatch_source": "our driver's logs"}}))
    return load_catalog(str(path))


def _workload(padded: bool = True) -> WorkloadSpec:
    return WorkloadSpec.from_dict({**WORKLOAD, "training": {"kl_coef": 0.0, "padded_dispatch": padded}})


def test_a_pass_is_handed_its_batch_padded_to_the_caps():
    w = _workload()
    assert dispatch_slots(w, TaskKind.GENERATION) == 8 * 16
    assert dispatch_slots(w, TaskKind.INFERENCE) == dispatch_slots(w, TaskKind.TRAINING) == 8 * 24


def test_the_builtin_rate_is_verls_published_put():
    step = builtin().step
    assert step.dispatch_source in builtin().sources
    # verl PR #3495: 19.86 s for a batch of 6400 x 20480 token slots
    assert step.dispatch_seconds(6400 * 20480) == pytest.approx(19.86, rel=1e-3)


def test_controller_seconds_by_task_and_only_on_gpus(tmp_path):
    cat = _catalog(tmp_path, 0.5)
    w = _workload()
    assert controller_seconds(cat, w, Task.ACTOR_GEN, TaskKind.GENERATION, {"H100-SXM"}) == pytest.approx(64.0)
    assert controller_seconds(cat, w, Task.ACTOR_TRAIN, TaskKind.TRAINING, {"H100-SXM"}) == pytest.approx(96.0)
    assert controller_seconds(cat, w, Task.ACTOR_TRAIN, TaskKind.TRAINING, {"cpu"}) == 0.0
    assert controller_seconds(cat, _workload(False), Task.ACTOR_TRAIN, TaskKind.TRAINING, {"H100-SXM"}) == 0.0


def _task_seconds(tmp_path, per_slot: float) -> dict[str, float]:
    catalog = _catalog(tmp_path, per_slot)
    cluster = from_data(ClusterSpec, {"name": "one", "hosts": [{"name": "a", "gpus": {"type": "H100-SXM",
                                                                                      "count": 2}}]})
    sim = Simulator(cluster.using(catalog), _workload(), get_cost_model("analytical", catalog=catalog),
                    streaming=False, executable=False)
    score = sim.evaluate(pinned_candidate(sim, from_data(PinnedLayout, LAYOUT)))
    assert score.feasible
    return score.task_seconds


def test_every_pass_of_the_step_pays_its_own_hand_off(tmp_path):
    none, some = _task_seconds(tmp_path, 0.0), _task_seconds(tmp_path, 0.5)
    added = {t: some[t] - none[t] for t in none}
    assert added == {"actor_gen": pytest.approx(64.0), "actor_logprob": pytest.approx(96.0),
                     "actor_train": pytest.approx(96.0)}


@pytest.mark.parametrize("step, path", [({"dispatch_s_per_slot": -1, "dispatch_source": "s"}, "step.dispatch_s_per_slot"),
                                        ({"dispatch_s_per_slot": 1e-7}, "step.dispatch_source")])
def test_a_bad_dispatch_rate_names_its_field(tmp_path, step, path):
    file = tmp_path / "bad.yaml"
    file.write_text(yaml.safe_dump({"step": {"overhead_s": 0, "source": "s", **step}}))
    with pytest.raises(SpecError) as err:
        load_catalog(str(file))
    assert err.value.field == path and err.value.file == str(file)


def test_hetprof_run_names_padded_dispatch_as_what_if_only():
    assert any(p.startswith("training.padded_dispatch") for p in workload_problems(_workload()))
    assert not workload_problems(_workload(False))
