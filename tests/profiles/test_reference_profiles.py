"""Reference profiles: shipped published figures, imported as `reference`, outranked by measured rows;
and the plan report's provenance lines."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from hetprof.cli import cli
from hetprof.costmodels import get_cost_model
from hetprof.costmodels.base import combine_sources
from hetprof.profiles import DeviceInfo, ProfileDB, read_export
from hetprof.profiles.references import (
    CITATION_KEYS,
    import_reference,
    load_figures,
    names,
    reference_file,
    samples,
)


def test_every_shipped_profile_matches_its_cited_figures():
    figures = load_figures()
    assert {"h100", "a100", "h800"} <= set(names()) and set(names()) == set(figures)
    for name, entry in figures.items():
        rows = read_export(reference_file(name))
        assert {r[-1] for r in rows["runs"]} == {"reference"}  # every run's source
        assert [d[-1] for d in rows["devices"]] == ["reference"]
        # each shipped run carries its citation, and its samples are exactly the cited figures
        cited = sorted(json.dumps(run["citation"], sort_keys=True) for run in entry["runs"])
        assert sorted(json.dumps(json.loads(r[4])["citation"], sort_keys=True) for r in rows["runs"]) == cited
        assert all(all(run["citation"][k] for k in CITATION_KEYS) for run in entry["runs"])
        figures_samples = sorted(json.dumps([s["params"], s["metrics"]], sort_keys=True)
                                 for run in entry["runs"] for s in samples(run))
        shipped = sorted(json.dumps([json.loads(r[3]), json.loads(r[4])], sort_keys=True) for r in rows["samples"])
        assert shipped == figures_samples


def test_reference_import_is_marked_and_measured_rows_outrank_it(db_path):
    with ProfileDB(db_path) as db:
        added = import_reference(db, "h100")
        assert added["runs"] == 5 and import_reference(db, "h100")["runs"] == 0  # idempotent
        assert set(db.runs()["source"]) == {"reference"}
        ref = get_cost_model("analytical", db=db).calibration
        rate = ref.flops("H100-SXM", "bf16")
        assert rate.source == "reference" and 700e12 < rate.value < 800e12  # published H100 figures
        assert ref.memory_bw("H100-SXM").source == "reference"
        assert ref.memory_bw("H100-SXM").value == pytest.approx(2.903e12)
        assert ref.flops("A100-80GB", "bf16").source == "datasheet"  # not imported
        dev = db.add_device(DeviceInfo(name="NVIDIA H100 80GB HBM3", kind="cuda", catalog_type="H100-SXM", host="n1"))
        db.add_benchmark("compute.matmul", dev, "n1", {"dtype": "bf16"}, [
            {"params": {"m": 4096, "n": 4096, "k": 4096, "dtype": "bf16"}, "metrics": {"seconds": 1.0, "tflops": 500.0}}
            for _ in range(3)])
        measured = get_cost_model("analytical", db=db).calibration
        assert measured.flops("H100-SXM", "bf16").source == "measured"
        assert measured.flops("H100-SXM", "bf16").value == pytest.approx(500e12)
        assert measured.memory_bw("H100-SXM").source == "reference"  # no measured copy rows: reference still
        # an estimate resting on both is as trustworthy as its reference part
        assert combine_sources({"measured", "reference"}) == "reference"
        assert combine_sources({"reference", "datasheet"}) == "datasheet"


def test_cli_imports_references_and_lists_them_as_reference(db_path):
    runner = CliRunner()
    res = runner.invoke(cli, ["db", "import-reference", "all", "--db", str(db_path)], catch_exceptions=False)
    assert res.exit_code == 0 and "imported reference h800" in res.output
    listed = runner.invoke(cli, ["db", "list", "--db", str(db_path)], catch_exceptions=False)
    assert listed.output.count("reference") >= 8  # every run's source column
    with ProfileDB(db_path, readonly=True) as db:
        run_id = db.runs("compute.matmul")["id"].iloc[0]
    shown = runner.invoke(cli, ["db", "show", run_id[:12], "--db", str(db_path)], catch_exceptions=False)
    assert "source: reference" in shown.output and "citation" in shown.output
    bad = runner.invoke(cli, ["db", "import-reference", "z80", "--db", str(db_path)])
    assert bad.exit_code != 0 and "no reference profile 'z80'" in bad.output


CLUSTER = {"name": "mixed", "hosts": [{"name": "h", "gpus": {"type": "H100-SXM", "count": 2}},
                                       {"name": "l", "gpus": {"type": "L4", "count": 2}}]}
WORKLOAD = {"name": "tiny", "algorithm": "grpo", "models": {"actor": "qwen3-0.6b"}, "prompts_per_step": 8,
            "responses_per_prompt": 2, "prompt_len": {"mean": 64, "max": 64}, "response_len": {"mean": 64, "max": 64}}


@pytest.fixture
def specs(tmp_path):
    paths = []
    for name, data in (("cluster.yaml", CLUSTER), ("workload.yaml", WORKLOAD)):
        (tmp_path / name).write_text(yaml.safe_dump(data))
        paths.append(str(tmp_path / name))
    return paths


def plan(db_path, specs, *extra):
    args = ["plan", "-c", specs[0], "-w", specs[1], "--search", "verl", "--budget-s", "20", "--db", str(db_path)]
    return CliRunner().invoke(cli, [*args, *extra], catch_exceptions=False)


def test_plan_report_says_what_each_gpu_types_numbers_rest_on(db_path, specs):
    with ProfileDB(db_path) as db:
        import_reference(db, "h100")
    res = plan(db_path, specs)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "H100-SXM (2 GPUs): compute reference, memory reference, link datasheet" in text
    assert "L4 (2 GPUs): compute datasheet, memory datasheet, link datasheet — catalog peaks × efficiency curves" in text
    assert "collective: published-runs-fit" in text and "memory: hetprof-0.1-constants" in text
    assert "warning" not in text


def test_fitted_cost_model_on_an_empty_database_warns_once_naming_every_type(db_path, specs):
    ProfileDB(db_path).close()  # an empty database: no fitted model for any type
    res = plan(db_path, specs, "--cost-model", "fitted")
    assert res.exit_code == 0, res.output
    warnings = [line for line in res.output.split("warning: ")[1:]]
    assert len(warnings) == 1, res.output
    text = " ".join(warnings[0].split())
    assert "--cost-model fitted has no fitted models for H100-SXM, L4" in text
    assert "fall back to the analytical model on datasheet numbers for H100-SXM, L4" in text


def test_fitted_cost_model_without_a_database_is_refused_and_creates_none(db_path, specs):
    res = plan(db_path, specs, "--cost-model", "fitted")
    assert res.exit_code == 2 and f"{db_path}: no such profile database" in res.output
    assert not db_path.exists()
