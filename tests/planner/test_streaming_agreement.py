"""Plan and run agree on streaming: a plan for `hetprof run` is priced as the executor carries it out,
records how it was priced, and a run of a plan priced with streaming says in one line that it will not
have the overlap it was priced for."""

from __future__ import annotations

import pytest

from hetprof.costmodels import get_cost_model
from hetprof.executor.launch.checks import warn_streaming
from hetprof.planner.candidate import Candidate, even_layout
from hetprof.planner.graph import build_graph
from hetprof.planner.session import build_plan
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, Plan, WorkloadSpec, executable

CLUSTER = {"name": "two-hosts", "hosts": [{"name": "a", "gpus": {"type": "A100-40GB", "count": 2}},
                                          {"name": "b", "gpus": {"type": "L4", "count": 2}}]}
WORKLOAD = {"name": "grpo", "algorithm": "grpo", "mode": "sync", "models": {"actor": "qwen3-0.6b"},
            "prompts_per_step": 8, "responses_per_prompt": 4, "prompt_len": {"mean": 128, "max": 256},
            "response_len": {"mean": 256, "max": 1024, "dist": "lognormal", "std": 200},
            "training": {"kl_coef": 0.0}}


def _sim(**kw) -> Simulator:
    return Simulator(ClusterSpec.from_dict(CLUSTER), WorkloadSpec.from_dict(WORKLOAD), get_cost_model("analytical"),
                     **kw)


def _split(sim: Simulator) -> Candidate:
    """Generation on one host, everything else on the other: where streaming changes the prediction."""
    layers = build_graph(sim.workload).model_of("actor_gen").layers
    gen, rest = ("b:0", "b:1"), ("a:0", "a:1")
    others = tuple(t for t in sim.tasks if t != "actor_gen")
    where = {t: rest for t in others} | {"actor_gen": gen}
    return Candidate([("actor_gen",), others], [gen, rest],
                     {t: even_layout(t, where[t], 1, 1, layers) for t in sim.tasks})


def test_a_runnable_plan_is_priced_as_the_executor_runs_it():
    runnable, what_if = _sim(executable=True), _sim(executable=False)
    assert runnable.streaming is executable.STREAMS_ROLLOUTS is False
    assert what_if.streaming is True
    # the default runnable price is the no-streaming price, and streaming would have promised less
    cand = _split(runnable)
    default = runnable.evaluate(cand).iteration_s
    assert default == pytest.approx(_sim(executable=True, streaming=False).evaluate(cand).iteration_s)
    assert _sim(executable=True, streaming=True).evaluate(cand).iteration_s < default


@pytest.mark.parametrize("streaming", [False, True])
def test_the_plan_records_how_it_was_priced_and_the_run_warns_only_on_streaming(streaming, tmp_path, capsys):
    sim = _sim(executable=True, streaming=streaming)
    plan = build_plan(sim, _split(sim))
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = Plan.load(path)
    assert loaded.streaming is streaming
    line = warn_streaming(loaded, path)
    err = capsys.readouterr().err
    if streaming:
        assert line is not None and err.strip() == line and err.count("\n") == 1
        assert "streaming" in line and str(path) in line
    else:
        assert line is None and err == ""


def test_a_plan_that_does_not_record_streaming_runs_without_a_warning(tmp_path, capsys):
    sim = _sim(executable=True)
    data = build_plan(sim, _split(sim)).to_dict()
    data.pop("streaming")
    assert Plan.from_dict(data).streaming is None
    assert warn_streaming(Plan.from_dict(data)) is None
    assert capsys.readouterr().err == ""
