"""The published-runs cases (bench/published/): every case loads, cites its source and prices.

These check the cases and the harness, not how close the predictions are: that is the bench's
job (bench/published_bench.py), and a model change that moves a ratio must not fail the suite.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import yaml
from helpers.bench_modules import load_bench

from hetprof.costmodels import get_cost_model
from hetprof.errors import SpecError

cases_mod = load_bench("published_cases")
calibration = load_bench("published_calibration")
CASES = cases_mod.load_cases()


def test_cases_cover_what_the_check_needs():
    assert len(CASES) >= 10
    assert len({c.source.id for c in CASES}) >= 3
    assert len({d.type for c in CASES for d in c.cluster.devices()}) >= 3
    assert {c.workload.mode for c in CASES} == {"sync", "async"}
    assert {c.workload.algorithm for c in CASES} == {"ppo", "grpo"}
    params = [c.workload.roles()["actor"].params for c in CASES]
    assert min(params) < 2e9 and max(params) > 30e9


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_cites_its_source_and_prices_to_a_finite_time(case):
    src = case.source
    assert src.title and src.where and src.date and src.url.startswith("https://")
    assert case.spec.published.figure and case.published_s > 0
    assert case.name == case.folder.name
    priced = cases_mod.price(case, get_cost_model("analytical"))
    if not priced.feasible:  # only a case still waiting on what it needs may be refused, and says why
        assert case.spec.needs and priced.problems, priced.problems
        return
    assert math.isfinite(priced.predicted_s) and priced.predicted_s > 0
    for phase in case.spec.published.phases:
        assert priced.phases[phase] > 0


def test_run_hours_become_seconds_per_step():
    pub = cases_mod.Published(figure="Time (h) ~230", run_hours=230, run_steps=250)
    assert pub.seconds() == pytest.approx(230 * 3600 / 250)


def test_run_totals_become_per_step_windows():
    pub = cases_mod.Published(figure="step 790.10 s", step_s=790.1,
                              run_totals={200: "1d 3h 43m", 100: "13h 44m", 400: "3d 17h 5m"})
    pub.validate()
    assert cases_mod.duration_s("3d 17h 5m") == (3 * 24 * 60 + 17 * 60 + 5) * 60
    # 13h 44m over steps 1-100; 13h 59m over 101-200; 2d 13h 22m over 201-400
    assert pub.windows() == [(1, 100, 494.4), (101, 200, 503.4), (201, 400, pytest.approx(1104.6))]
    assert cases_mod.Published(figure="x", step_s=1.0).windows() == []


@pytest.mark.parametrize("totals", [{100: "13 hours"}, {100: "2h", 200: "1h 30m"}, {0: "1h"}])
def test_bad_run_totals_are_refused_with_their_field(tmp_path, totals):
    folder = _copy_case(tmp_path)
    data = yaml.safe_load((folder / "case.yaml").read_text())
    data["published"]["run_totals"] = totals
    (folder / "case.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as err:
        cases_mod.load_case(folder)
    assert "published.run_totals." in str(err.value) and "case.yaml" in str(err.value)


def _copy_case(tmp_path: Path) -> Path:
    src = next(c.folder for c in CASES if c.name == "nemo-llama3.1-8b-grpo-sync-16xh100")  # preset model only
    dst = tmp_path / "cases" / src.name
    shutil.copytree(src, dst)
    return dst


def test_a_layout_naming_an_unknown_group_is_refused_with_its_field(tmp_path):
    folder = _copy_case(tmp_path)
    data = yaml.safe_load((folder / "case.yaml").read_text())
    data["layout"]["tasks"]["training"]["group"] = "nowhere"
    (folder / "case.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as err:
        cases_mod.load_case(folder)
    assert "layout.tasks.training.group" in str(err.value) and "case.yaml" in str(err.value)


def test_a_case_without_a_published_time_is_refused(tmp_path):
    folder = _copy_case(tmp_path)
    data = yaml.safe_load((folder / "case.yaml").read_text())
    data["published"].pop("step_s")
    (folder / "case.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="published"):
        cases_mod.load_case(folder)


@pytest.mark.parametrize(("key", "value", "field"), [("backend", "trtllm", "backend"),
                                                     ("offload", ["nowhere"], "layout.offload[0]")])
def test_an_unknown_engine_or_offload_group_is_refused_with_its_field(tmp_path, key, value, field):
    folder = _copy_case(tmp_path)
    data = yaml.safe_load((folder / "case.yaml").read_text())
    (data["layout"] if key == "offload" else data)[key] = value
    (folder / "case.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as err:
        cases_mod.load_case(folder)
    assert field in str(err.value) and "case.yaml" in str(err.value)


def test_engine_and_offload_are_what_the_sources_ran():
    by_source = {}
    for case in CASES:
        by_source.setdefault(case.source.id, set()).add((case.backend, tuple(case.layout.offload)))
    assert by_source["nemo-aligner"] == {("static", ())}  # TensorRT-LLM static micro-batches
    assert ("vllm", ("all",)) in by_source["verl-docs"]    # the colocated hybrid engine
    assert by_source["nemo-rl"] == by_source["areal"] == {("vllm", ())}


def test_groups_larger_than_the_cluster_are_refused(tmp_path):
    folder = _copy_case(tmp_path)
    data = yaml.safe_load((folder / "case.yaml").read_text())
    first = next(iter(data["layout"]["groups"]))
    data["layout"]["groups"][first] = 4096
    (folder / "case.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="layout.groups"):
        cases_mod.price(cases_mod.load_case(folder), get_cost_model("analytical"))


def test_knob_factors_keep_efficiencies_physical_and_curves_in_shape():
    data = calibration.builtin_data()
    scaled = calibration.scaled_data(data, {k.name: 1.4 for k in calibration.KNOBS})
    curves = [scaled["defaults"][c] for c in ("matmul", "attention", "decode_memory", "collective")]
    assert scaled["network"] == data["network"]  # the inter-host goodput is cited, never a knob
    for curve in curves:
        ys = [y for _, y in curve["points"]]
        assert all(0 < y <= 1 for y in ys)
    before = [y for _, y in data["defaults"]["matmul"]["points"]]
    after = [y for _, y in scaled["defaults"]["matmul"]["points"]]
    rises = [b2 >= b1 for b1, b2 in zip(before, before[1:], strict=False)]
    assert rises == [a2 >= a1 for a1, a2 in zip(after, after[1:], strict=False)]
    assert data["defaults"]["matmul"]["points"][0][1] == before[0]  # the committed data is untouched


def test_neutral_factors_price_like_the_committed_catalog():
    case = CASES[0]
    plain = cases_mod.price(case, get_cost_model("analytical"))
    neutral = calibration.price_all([case], calibration.catalog_with(dict(calibration.NEUTRAL)))[0]
    assert neutral.predicted_s == pytest.approx(plain.predicted_s)


def _needing(tmp_path: Path, needs: list[str] | None, gpu: str) -> Path:
    """A copied case declaring `needs` (None: none) whose cluster's hosts are `gpu`s."""
    folder = _copy_case(tmp_path)
    data = yaml.safe_load((folder / "case.yaml").read_text())
    if needs is not None:
        data["needs"] = needs
    (folder / "case.yaml").write_text(yaml.safe_dump(data))
    cluster = yaml.safe_load((folder / "cluster.yaml").read_text())
    for host in cluster["hosts"]:
        host["gpus"]["type"] = gpu
    (folder / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    return folder


UNKNOWN_GPU = "XPU-FROM-THE-FUTURE"  # a type no catalog names: the feature a case waits on


def test_a_case_needing_what_does_not_load_yet_is_skipped_with_its_reason(tmp_path):
    folder = _needing(tmp_path, ["XPU-FROM-THE-FUTURE in the GPU catalog"], UNKNOWN_GPU)
    cases, skipped = cases_mod.scan_cases(folder.parent)
    assert cases == [] and [s.name for s in skipped] == [folder.name]
    assert skipped[0].needs == ("XPU-FROM-THE-FUTURE in the GPU catalog",)
    assert skipped[0].reason.startswith("cluster.yaml") and "hosts[0].gpus.type" in skipped[0].reason


def test_a_case_without_needs_that_does_not_load_is_an_error(tmp_path):
    folder = _needing(tmp_path, None, UNKNOWN_GPU)
    with pytest.raises(SpecError, match="gpus.type"):
        cases_mod.scan_cases(folder.parent)


def test_a_case_whose_needs_have_landed_is_priced(tmp_path):
    folder = _needing(tmp_path, ["H100-SXM in the GPU catalog"], "H100-SXM")
    cases, skipped = cases_mod.scan_cases(folder.parent)
    assert skipped == [] and [c.name for c in cases] == [folder.name]
    assert cases[0].spec.needs == ["H100-SXM in the GPU catalog"]
    assert cases_mod.price(cases[0], get_cost_model("analytical")).feasible


def test_every_committed_case_loads_or_says_what_it_needs():
    cases, skipped = cases_mod.scan_cases()
    assert {c.name for c in cases} == {c.name for c in CASES}
    assert all(s.needs and s.reason for s in skipped)
