"""The GPU catalog as data: curves, the file format's errors, extension by file and by cluster spec."""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from hetprof.costmodels import get_cost_model, phases
from hetprof.costmodels.data import Phase, Placement, Work
from hetprof.errors import SpecError
from hetprof.planner import session
from hetprof.planner.memcheck import check_plan
from hetprof.specs import ClusterSpec, Plan, WorkloadSpec, catalog
from hetprof.specs.catalog import EfficiencyCurve, builtin, load_catalog
from hetprof.specs.gpus import CURVES
from hetprof.specs.models import PRESETS

NEW_GPU = {"vendor": "acme", "memory_GB": 64, "hbm_GBps": 2000, "bf16_tflops": 400, "fp16_tflops": 400,
           "fp32_tflops": 50, "intra_node_GBps": 400, "interconnect": "AcmeLink", "price_per_hour": 1.5,
           "source": "Acme X1 product brief, 2026",
           "efficiency": {"matmul": {"points": [[128, 0.3], [4096, 0.6]], "source": "our own mamf-finder run"}}}
TINY_WORKLOAD = {"name": "tiny", "algorithm": "grpo", "models": {"actor": "tiny"}, "prompts_per_step": 4,
                 "responses_per_prompt": 2, "prompt_len": {"mean": 16, "max": 16},
                 "response_len": {"mean": 8, "max": 8}}


def write(tmp_path, name: str, data) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


# ---- curves -----------------------------------------------------------------------------------

def test_curve_is_linear_in_log_x_and_flat_beyond_its_ends():
    curve = EfficiencyCurve(((256.0, 0.4), (1024.0, 0.8)), "test")
    assert curve(512) == pytest.approx(0.6)  # halfway in log x
    assert curve(256 * 2 ** 0.5) == pytest.approx(0.5)
    assert curve(1) == 0.4 and curve(1e9) == 0.8
    assert curve.scaled(0.4, "s")(512) == pytest.approx(0.3) and curve.scaled(0.4, "s").source == "s"


@given(st.lists(st.tuples(st.floats(1, 1e10), st.floats(0.01, 1.5)), min_size=1, max_size=6, unique_by=lambda p: p[0]),
       st.floats(1e-3, 1e12))
def test_curve_stays_between_its_neighbouring_points(points, x):
    points = sorted(points)
    curve = EfficiencyCurve(tuple(points), "prop")
    ys = [y for _, y in points]
    value = curve(x)
    assert min(ys) - 1e-9 <= value <= max(ys) + 1e-9
    below = [p for p in points if p[0] <= x]
    above = [p for p in points if p[0] >= x]
    if below and above:
        lo, hi = below[-1][1], above[0][1]
        assert min(lo, hi) - 1e-9 <= value <= max(lo, hi) + 1e-9


# ---- the built-in file ------------------------------------------------------------------------

def test_builtin_catalog_keeps_datasheet_values_and_cites_every_curve():
    cat = builtin()
    assert cat.lookup("H100").peak_flops("bf16") == 989e12 and cat.lookup("A100-80GB").hbm_GBps == 2039
    for gpu in cat.types.values():
        for name in CURVES:
            curve = getattr(gpu.efficiency, name)
            assert curve.source in cat.sources, f"{gpu.name}.{name}: {curve.source}"
    # published figures' shape, not the old flat 70%: a skinny decode matmul reaches far less than a big one
    h100 = cat.lookup("H100-SXM").efficiency.matmul
    assert h100(256) < 0.6 * h100(4096)
    # A100's curve is the default shape rescaled to its own large-matmul ceiling
    a100, default = cat.lookup("A100-40GB").efficiency.matmul, cat.defaults.matmul
    assert a100(1e6) == pytest.approx(a100.best) and a100.best != pytest.approx(default.best)
    assert a100(512) / a100.best == pytest.approx(default(512) / default.best)


MALFORMED = [
    ({"gpus": {"X1": {**NEW_GPU, "memory_GB": -1}}}, "gpus.X1.memory_GB"),
    ({"gpus": {"X1": {**NEW_GPU, "memroy_GB": 1}}}, "gpus.X1.memroy_GB"),
    ({"gpus": {"X1": {k: v for k, v in NEW_GPU.items() if k != "hbm_GBps"}}}, "gpus.X1.hbm_GBps"),
    ({"gpus": {"H100-SXM": {"efficiency": {"matmul": {"points": [[512, 0.5], [256, 0.6]], "source": "s"}}}}},
     "gpus.H100-SXM.efficiency.matmul.points"),
    ({"gpus": {"H100-SXM": {"efficiency": {"attention": {"points": [[512, 2.5]], "source": "s"}}}}},
     "gpus.H100-SXM.efficiency.attention.points"),
    ({"gpus": {"H100-SXM": {"efficiency": {"matmul": {"points": [[1, 0.5]], "ceiling": 0.5, "source": "s"}}}}},
     "gpus.H100-SXM.efficiency.matmul.points"),
    ({"defaults": {"memory": {"points": [[1, 0.9]], "source": " "}}}, "defaults.memory.source"),
    ({"network": {"inter_host": {"ceiling": 0.5, "source": "s"}}}, "network.inter_host.ceiling"),
    ({"sources": {"x": {"url": "https://example.com"}}}, "sources.x.title"),
    ({"gpus": [NEW_GPU]}, "gpus"),
]


@pytest.mark.parametrize("data, path", MALFORMED, ids=[p for _, p in MALFORMED])
def test_malformed_catalog_file_names_the_field_and_the_file(tmp_path, data, path):
    file = write(tmp_path, "team-gpus.yaml", data)
    with pytest.raises(SpecError) as err:
        load_catalog(file)
    assert err.value.field == path and err.value.file == file
    assert "team-gpus.yaml" in str(err.value) and path in str(err.value)


def test_catalog_file_extends_without_touching_the_builtin(tmp_path):
    file = write(tmp_path, "team.yaml", {
        "sources": {"ours": {"title": "our mamf-finder run", "kind": "measured profile"}},
        "gpus": {"X1": NEW_GPU, "H100": {"price_per_hour": 9.0,
                                         "efficiency": {"memory": {"points": [[1, 0.5]], "source": "ours"}}}}})
    cat = load_catalog(file)
    assert cat.lookup("x1").efficiency.matmul(128) == 0.3
    assert cat.lookup("X1").efficiency.attention == builtin().defaults.attention  # unnamed curves: defaults
    h100 = cat.lookup("H100-SXM")
    assert h100.price_per_hour == 9.0 and h100.memory_GB == 80 and h100.efficiency.memory.best == 0.5
    assert h100.efficiency.matmul == builtin().lookup("H100-SXM").efficiency.matmul  # kept
    assert cat.cite("ours") == "our mamf-finder run"
    assert builtin().lookup("H100-SXM").price_per_hour == 3.0 and builtin().canonical_name("X1") is None
    assert catalog.lookup("H100").efficiency.memory.best == pytest.approx(0.867)  # the built-in figure, untouched


def test_cost_model_reads_efficiencies_from_the_catalog_it_is_given(tmp_path):
    half = write(tmp_path, "half.yaml", {"gpus": {"H100-SXM": {"efficiency": {
        "matmul": {"points": [[1, 0.2]], "source": "s"}, "attention": {"points": [[1, 0.2]], "source": "s"}}}}})
    ph = Phase("prefill", PRESETS["qwen3-8b"], 36, 8, 2048)
    slow = get_cost_model("analytical", catalog=load_catalog(half)).phase_time(ph, "H100-SXM").seconds
    launches = phases.kernel_launches(ph) * 4e-6
    assert slow - launches == pytest.approx(phases.flops(ph) / (989e12 * 0.2))
    fast = get_cost_model("analytical").phase_time(ph, "H100-SXM").seconds
    assert fast < slow


def test_several_collective_points_fit_the_catalog_link_like_measured_rows(tmp_path):
    from hetprof.costmodels.comm import collective_time

    mib, gib = 2.0 ** 20, 2.0 ** 30
    file = write(tmp_path, "link.yaml", {"gpus": {"H100-SXM": {"efficiency": {"collective": {
        "points": [[mib, 0.1], [64 * mib, 0.6], [gib, 0.9]], "world": 4, "source": "our nccl-tests run"}}}}})
    link, source = get_cost_model("analytical", catalog=load_catalog(file)).device_link("H100-SXM")
    assert source == "datasheet" and link.alpha_s > 0 and 0.6 * 450e9 < link.beta_Bps < 1.0 * 450e9
    for size, eff in ((mib, 0.1), (gib, 0.9)):  # the fitted ring reproduces the busbw it was given
        implied = 2 * 3 / 4 * size / (450e9 * eff)
        assert collective_time("all_reduce", size, 4, link.alpha_s, link.beta_Bps) == pytest.approx(implied, rel=0.2)
    single = get_cost_model("analytical").device_link("H100-SXM")[0]  # one point: nominal × it, NVLink α
    best = builtin().lookup("H100-SXM").efficiency.collective.best
    assert single.beta_Bps == pytest.approx(450e9 * best) and single.alpha_s == pytest.approx(5e-6)


# ---- gpu_types in a cluster spec --------------------------------------------------------------

def cluster_with_new_gpu() -> dict:
    return {"name": "acme", "gpu_types": {"X1": NEW_GPU},
            "hosts": [{"name": "a", "gpus": {"type": "X1", "count": 2}}]}


def test_gpu_types_entry_is_planned_on_and_travels_with_the_plan(tmp_path):
    cluster = ClusterSpec.load(write(tmp_path, "cluster.yaml", cluster_with_new_gpu()))
    workload = WorkloadSpec.from_dict(TINY_WORKLOAD)
    assert {d.type for d in cluster.devices()} == {"X1"} and cluster.price_per_hour("a") == 1.5
    options = session.PlanOptions(max_evals=20, budget_s=30)
    outcomes, sim = session.run_searches(cluster, workload, "hetrl", options)
    best = session.best(outcomes, sim, options)
    assert best is not None and set(best.candidate.devices()) == {"a:0", "a:1"}
    assert sim.capacity["a:0"] == 64e9 and sim.cost_model.catalog.lookup("X1").efficiency.matmul(128) == 0.3
    path = tmp_path / "plan.json"
    session.write_plan(sim, best, options, "", path)
    again = Plan.load(path).cluster_spec()  # the plan file stands alone: its cluster carries X1
    assert again.catalog.lookup("X1").memory_GB == 64
    assert check_plan(Plan.load(path)) == []
    # the cost model prices X1 with X1's numbers: its peak, its matmul curve, the default attention curve
    ph = Phase("prefill", PRESETS["qwen3-8b"], 36, 8, 2048)
    assert sim.cost_model.phase_time(ph, "X1").seconds == pytest.approx(
        phases.forward_matmul_flops(ph) / (400e12 * 0.6) + phases.forward_attention_flops(ph) / (400e12 * builtin().defaults.attention(2048))
        + phases.kernel_launches(ph) * 4e-6)
    with pytest.raises(KeyError):
        get_cost_model("analytical").task_time(Work("inference", PRESETS["tiny"], 1, 8, 8), Placement("X1"))


def test_unknown_gpu_type_in_a_cluster_names_field_and_file(tmp_path):
    data = cluster_with_new_gpu()
    data["hosts"][0]["gpus"]["type"] = "X2"
    file = write(tmp_path, "cluster.yaml", data)
    with pytest.raises(SpecError) as err:
        ClusterSpec.load(file)
    assert err.value.field == "hosts[0].gpus.type" and "X1" in err.value.expected and err.value.file == file
    data = cluster_with_new_gpu()
    data["gpu_types"]["X1"] = {**NEW_GPU, "memory_GB": 0}
    with pytest.raises(SpecError) as err:
        ClusterSpec.load(write(tmp_path, "c2.yaml", data))
    assert err.value.field == "gpu_types.X1.memory_GB"


def test_catalog_option_types_are_copied_into_the_cluster(tmp_path):
    team = load_catalog(write(tmp_path, "team.yaml", {"gpus": {"X1": NEW_GPU}}))
    data = {"name": "acme", "hosts": [{"name": "a", "gpus": {"type": "X1", "count": 1}},
                                      {"name": "b", "gpus": {"type": "L4", "count": 1}}]}
    file = write(tmp_path, "cluster.yaml", data)
    with pytest.raises(SpecError):
        ClusterSpec.load(file)  # without the team catalog X1 is unknown
    cluster = ClusterSpec.load(file, catalog=team)
    assert set(cluster.gpu_types) == {"X1"}  # L4 is the built-in one, unchanged: not copied
    standalone = ClusterSpec.from_dict(cluster.to_dict())
    assert standalone.catalog.lookup("X1").efficiency.matmul(4096) == 0.6
    assert math.isclose(standalone.catalog.lookup("X1").peak_flops("bf16"), 400e12)


def test_fit_compares_with_the_analytical_model_of_the_catalog_it_is_given(tmp_path):
    from click.testing import CliRunner
    from helpers.costmodels_synth import add_rows

    from hetprof.cli import cli
    from hetprof.costmodels.fitting import fit_database
    from hetprof.profiles import ProfileDB

    half = {name: {"points": [[1, 0.35 if name in ("matmul", "attention") else 0.425]], "source": "halved"}
            for name in ("matmul", "attention", "memory", "decode_memory")}
    file = write(tmp_path, "slow-cpu.yaml", {"gpus": {"cpu": {"efficiency": half}}})
    with ProfileDB(tmp_path / "p.db") as db:
        add_rows(db, models=("tiny",), batches=(1, 2, 4), lengths=(16, 32, 64), tasks=("decode",))
        plain = fit_database(db, task="task.decode")[0].analytical
        slow = fit_database(db, task="task.decode", catalog=load_catalog(file))[0].analytical
    assert len(plain) == len(slow) and all(s > p for s, p in zip(slow, plain, strict=True))
    bad = write(tmp_path, "bad.yaml", {"gpus": {"cpu": {"memory_GB": "lots"}}})
    res = CliRunner().invoke(cli, ["--db", str(tmp_path / "p.db"), "fit", "--catalog", bad])
    assert res.exit_code == 2 and "bad.yaml" in res.output and "gpus.cpu.memory_GB" in res.output


def test_what_if_adds_a_gpu_type_from_the_catalog_file(tmp_path):
    from hetprof.planner.whatif import apply_what_if

    team = load_catalog(write(tmp_path, "team.yaml", {"gpus": {"X1": NEW_GPU}}))
    file = write(tmp_path, "cluster.yaml", {"name": "c", "hosts": [{"name": "b", "gpus": {"type": "L4", "count": 1}}]})
    cluster = ClusterSpec.load(file, catalog=team)
    assert cluster.gpu_types == {}
    changed = apply_what_if(cluster, "add 2xX1@default")
    assert changed.gpu_counts() == {"L4": 1, "X1": 2} and "X1" in changed.gpu_types
    assert ClusterSpec.from_dict(changed.to_dict()).catalog.lookup("X1").hbm_GBps == 2000
