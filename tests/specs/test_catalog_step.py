"""The catalog's per-step controller cost: read with its source, refused with its field path, and
charged once per step on the actor's update (so a step that does nothing else still pays it)."""

from __future__ import annotations

import pytest
import yaml

from hetprof.costmodels import get_cost_model
from hetprof.errors import SpecError
from hetprof.planner.pinned import PinnedLayout, pinned_candidate
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.specs.catalog import StepConstants, builtin, load_catalog
from hetprof.specs.loader import from_data

WORKLOAD = {"name": "tiny", "algorithm": "grpo", "models": {"actor": "tiny"}, "prompts_per_step": 4,
            "responses_per_prompt": 2, "prompt_len": {"mean": 16, "max": 16}, "response_len": {"mean": 8, "max": 8},
            "training": {"kl_coef": 0.0}}
CLUSTER = {"name": "one", "hosts": [{"name": "a", "gpus": {"type": "H100-SXM", "count": 2}}]}
LAYOUT = {"groups": {"all": 2}, "tasks": {"generation": {"group": "all", "tp": 1, "pp": 1},
                                          "inference": {"group": "all", "tp": 1, "pp": 1},
                                          "training": {"group": "all", "tp": 1, "pp": 1}}}


def write(tmp_path, name: str, data) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_builtin_catalog_prices_a_step_overhead_with_its_source():
    step = builtin().step
    assert step.seconds(8192) > 0 and step.source in builtin().sources
    # cited as verl's 7.5 s a step of 8192 responses, charged per sequence
    assert step.seconds(8192) == pytest.approx(7.5, rel=0.01) and step.seconds(64) < 0.1


def test_a_step_section_charges_per_sequence_on_top_of_its_fixed_part(tmp_path):
    cat = load_catalog(write(tmp_path, "team.yaml", {"step": {"overhead_s": 1.0, "per_sequence_s": 0.002,
                                                              "source": "our controller logs"}}))
    assert cat.step.seconds(0) == 1.0 and cat.step.seconds(500) == pytest.approx(2.0)
    with pytest.raises(SpecError) as err:
        load_catalog(write(tmp_path, "bad.yaml", {"step": {"overhead_s": 0, "per_sequence_s": -1, "source": "s"}}))
    assert err.value.field == "step.per_sequence_s"


def test_a_catalog_file_sets_the_step_overhead_and_a_later_file_keeps_it(tmp_path):
    cat = load_catalog(write(tmp_path, "team.yaml", {"step": {"overhead_s": 2.5, "source": "our controller logs"}}))
    assert cat.step == StepConstants(2.5, "our controller logs")
    again = load_catalog(write(tmp_path, "more.yaml", {"gpus": {"H100": {"price_per_hour": 1.0}}}), base=cat)
    assert again.step == cat.step


@pytest.mark.parametrize("step, path", [({"overhead_s": -1, "source": "s"}, "step.overhead_s"),
                                        ({"overhead_s": 1, "source": " "}, "step.source"),
                                        ({"source": "s"}, "step.overhead_s")])
def test_a_bad_step_section_names_its_field_and_file(tmp_path, step, path):
    file = write(tmp_path, "team.yaml", {"step": step})
    with pytest.raises(SpecError) as err:
        load_catalog(file)
    assert err.value.field == path and err.value.file == file


def _score(tmp_path, overhead_s: float):
    catalog = load_catalog(write(tmp_path, f"step{overhead_s}.yaml", {"step": {"overhead_s": overhead_s, "source": "s"}}))
    cluster = ClusterSpec.load(write(tmp_path, "cluster.yaml", CLUSTER)).using(catalog)
    sim = Simulator(cluster, WorkloadSpec.from_dict(WORKLOAD), get_cost_model("analytical", catalog=catalog),
                    streaming=False, executable=False)
    return sim.evaluate(pinned_candidate(sim, from_data(PinnedLayout, LAYOUT)))


def test_the_step_overhead_is_paid_once_per_step_on_the_actor_update(tmp_path):
    none, some = _score(tmp_path, 0.0), _score(tmp_path, 7.0)
    assert none.feasible and some.feasible
    assert some.task_seconds["actor_train"] - none.task_seconds["actor_train"] == pytest.approx(7.0)
    others = set(none.task_seconds) - {"actor_train"}
    assert others and all(some.task_seconds[t] == pytest.approx(none.task_seconds[t]) for t in others)
    assert some.iteration_s - none.iteration_s == pytest.approx(7.0)  # colocated sync: every task in turn


def _cpu_train_seconds(tmp_path, overhead_s: float) -> float:
    catalog = load_catalog(write(tmp_path, "step.yaml", {"step": {"overhead_s": overhead_s, "source": "s"}}))
    cpu = {"name": "cpu", "hosts": [{"name": "a", "gpus": {"type": "cpu", "count": 2}}]}
    cluster = ClusterSpec.load(write(tmp_path, "cpu.yaml", cpu)).using(catalog)
    sim = Simulator(cluster, WorkloadSpec.from_dict(WORKLOAD), get_cost_model("analytical", catalog=catalog),
                    streaming=False, executable=False)
    return sim.evaluate(pinned_candidate(sim, from_data(PinnedLayout, LAYOUT))).task_seconds["actor_train"]


def test_a_cpu_cluster_pays_no_gpu_framework_step_overhead(tmp_path):
    # `hetprof run`'s in-process controller on the CPU pseudo-device is not a GPU framework's
    assert _cpu_train_seconds(tmp_path, 7.0) == pytest.approx(_cpu_train_seconds(tmp_path, 0.0))
