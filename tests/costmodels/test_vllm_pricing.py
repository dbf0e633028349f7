"""What a vLLM generation call costs is learned from its own `task.generate` rows (`backend: vllm`,
the profiler's vllmgen suite) and priced for plans that generate with vLLM; hf rows stay hf's."""

from __future__ import annotations

import json

import pytest
from helpers.costmodels_synth import MODELS, add_rows, true_seconds

from hetprof.costmodels import Placement, Work, calloverhead, enginereload, fitting
from hetprof.costmodels.base import generation_phases
from hetprof.costmodels.data import Phase
from hetprof.costmodels.fitted import FittedCostModel
from hetprof.profiler.suites.vllmgen import call_prompts, reload_sample, row_params
from hetprof.profiler.taskmodels import plan_model
from hetprof.profiles import DeviceInfo, ProfileDB

TINY = MODELS["tiny"]
HF_EXTRA, VLLM_EXTRA = 0.001, 0.030  # seconds each engine's synthetic calls take beyond their phases
SHAPES = ((4, 48), (2, 16), (1, 128))


def _true_call(batch: int, prompt: int, steps: int) -> float:
    def phase(kind, b, tokens, head):
        return true_seconds(Phase(kind, TINY, TINY.layers, b, tokens, with_head=head, dtype="fp32"))

    return sum(generation_phases(phase, batch, prompt, steps))


def _add_calls(db: ProfileDB, extra: float, backend: str | None) -> None:
    dev = db.add_device(DeviceInfo(name="synthetic cpu", kind="cpu", catalog_type="cpu", host="synth"))
    shape = {k: getattr(TINY, k) for k in ("hidden", "ffn", "heads", "kv_heads", "head_dim", "vocab")}
    tag = {"backend": backend} if backend else {}
    samples = [{"params": {"model": "tiny", "layers_run": TINY.layers, **shape, "dtype": "fp32", "with_head": True,
                           "threads": 1, "batch": b, "seq_len": p, "new_tokens": 4, **tag},
                "metrics": {"seconds": _true_call(b, p, 4) + extra}} for b, p in SHAPES for _ in range(3)]
    db.add_benchmark(calloverhead.BENCHMARK, dev, "synth", {"model": "tiny", **tag}, samples)


def test_each_engine_learns_its_own_call_cost_and_plans_price_the_one_they_run(tmp_path):
    with ProfileDB(tmp_path / "db.sqlite") as db:
        add_rows(db, models=("tiny",), tasks=("prefill", "decode"), repeats=3)
        _add_calls(db, HF_EXTRA, None)  # the tasks suite's rows carry no backend: hf's loop
        _add_calls(db, VLLM_EXTRA, "vllm")
        fits = fitting.fit_database(db, stat="median", envelope=False)
        (dec,) = [f for f in fits if f.task_type == "task.decode"]
        fitting.store(db, fits)
        cm = FittedCostModel(db)
    key = calloverhead.model_key(TINY)
    assert set(dec.call.points) == {(key, *s) for s in SHAPES} and set(dec.engine_calls) == {"vllm"}
    gap = {s: dec.engine_calls["vllm"].points[(key, *s)] - dec.call.points[(key, *s)] for s in SHAPES}
    assert all(v == pytest.approx(VLLM_EXTRA - HF_EXTRA, abs=1e-9) for v in gap.values())  # same phases, own term

    def call_part(engine: str) -> float:
        work = Work(kind="generation", model=TINY, batch=4, prompt_len=48.0, response_len=4.0, dtype="fp32",
                    engine=engine)
        return cm.task_time(work, Placement("cpu", 1)).breakdown["call"]

    assert call_part("vllm") == pytest.approx(dec.engine_calls["vllm"].points[key, 4, 48])
    assert call_part("hf") == pytest.approx(dec.call.points[key, 4, 48])
    assert call_part("static") == call_part("hf")  # an engine with no rows of its own: hf's term


def test_stored_engine_overheads_round_trip_and_bad_ones_name_the_engine():
    learned = calloverhead.learn([(calloverhead.model_key(TINY), 4, 48, 0.03, 0.01)])
    raw = json.loads(json.dumps({"vllm": learned.to_json()}))
    assert calloverhead.load_by_engine(raw) == {"vllm": learned} and calloverhead.load_by_engine(None) == {}
    with pytest.raises(ValueError, match=r"engine_call_overhead\.vllm: call_overhead\.default_s"):
        calloverhead.load_by_engine({"vllm": {"default_s": "x"}})
    with pytest.raises(ValueError, match="engine names"):
        calloverhead.load_by_engine(["vllm"])


def test_vllmgen_rows_are_the_hf_generate_rows_tagged_with_the_engine():
    import torch

    tm = plan_model(TINY, "fp32", None)
    params = row_params(tm, 8, 64, 1)
    assert params["backend"] == "vllm" and params["new_tokens"] == 4 and params["seq_len"] == 64
    prompts = call_prompts(TINY.vocab, 4, 64, torch.Generator().manual_seed(0))
    assert [len(p) for p in prompts] == [64, 56, 64, 56] and min(min(p) for p in prompts) >= 3


def test_engine_reload_is_the_median_per_size_interpolated_and_proportional_past_the_largest():
    learned = enginereload.learn([(1e6, 0.02), (1e6, 0.04), (1e6, 0.03), (3e6, 0.07), (5e6, float("nan"))])
    assert learned.points == ((1e6, 0.03), (3e6, 0.07))
    assert learned.seconds(5e5) == pytest.approx(0.03)     # below the smallest size: its time
    assert learned.seconds(2e6) == pytest.approx(0.05)     # between sizes: linear
    assert learned.seconds(6e6) == pytest.approx(0.14)     # past the largest: time ∝ bytes
    raw = json.loads(json.dumps({"vllm": learned.to_json()}))
    assert enginereload.load_by_engine(raw) == {"vllm": learned} and enginereload.load_by_engine(None) == {}
    with pytest.raises(ValueError, match=r"engine_reload\.vllm\.points"):
        enginereload.load_by_engine({"vllm": {"points": [[1e6, -1.0]]}})


def test_a_vllm_plan_prices_the_profiled_reload_into_its_weight_sync_and_an_hf_plan_does_not(tmp_path):
    from hetprof.planner.simulator import Simulator
    from hetprof.specs import ClusterSpec, TaskLayout, WorkloadSpec

    with ProfileDB(tmp_path / "db.sqlite") as db:
        add_rows(db, models=("tiny",), tasks=("prefill", "decode"), repeats=3)
        dev = db.add_device(DeviceInfo(name="synthetic cpu", kind="cpu", catalog_type="cpu", host="synth"))
        db.add_benchmark(enginereload.BENCHMARK, dev, "synth", {"model": "tiny", "backend": "vllm"},
                         [reload_sample(plan_model(TINY, "fp32", None), TINY.weight_bytes("fp32"), 1, 0.05)] * 3)
        fitting.store(db, fitting.fit_database(db, stat="median", envelope=False))
        cm = FittedCostModel(db)
    assert cm.engine_reload_time("vllm", "cpu", "fp32", TINY.weight_bytes("fp32")) == pytest.approx(0.05)
    assert cm.engine_reload_time("hf", "cpu", "fp32", TINY.weight_bytes("fp32")) == 0.0
    cluster = ClusterSpec.from_dict({"name": "c", "hosts": [{"name": "h", "gpus": {"type": "cpu", "count": 2}}]})
    wl = WorkloadSpec.from_dict({"models": {"actor": "tiny"}, "prompts_per_step": 4, "responses_per_prompt": 2,
                                 "prompt_len": {"mean": 16}, "response_len": {"mean": 4}, "precision": "fp32"})
    train = TaskLayout("actor_train", 1, 1, (("h:0",),), (1.0,), ((TINY.layers,),))
    gen = TaskLayout("actor_gen", 1, 1, (("h:1",),), (1.0,), ((TINY.layers,),))
    sync = {}
    for backend in ("hf", "vllm"):
        sim = Simulator(cluster, wl, cm, backend=backend)
        (edge,) = [e for e in sim.graph.backward_edges() if e.dst == "actor_gen"]
        sync[backend] = sim.transfers.weight_sync_seconds(edge, train, gen)
    assert sync["vllm"] - sync["hf"] == pytest.approx(0.05)
