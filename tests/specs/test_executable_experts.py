"""Where `hetprof run` carries out expert parallelism (hetprof/specs/executable.py), and the one line
it refuses the rest with."""

from __future__ import annotations

import pytest

from hetprof.errors import ExecutionError
from hetprof.executor.launch.checks import check_supported
from hetprof.executor.launch.handwritten_plan import handwritten_plan
from hetprof.specs.executable import layout_problems
from hetprof.specs.models import PRESETS
from hetprof.specs.vocabulary import Task

MOE, DENSE = PRESETS["tiny-moe"], PRESETS["tiny"]  # tiny-moe: 8 experts per MoE layer


def _problems(task: Task, model=MOE, ep: int = 2, tp: int = 1, pp: int = 1, sp: int = 1,
              sharding: str = "none") -> list[str]:
    return layout_problems(task, Task(task).kind, model, tp, pp, layout="DPn", sharding=sharding, sp=sp, ep=ep)


@pytest.mark.parametrize("task", [Task.ACTOR_TRAIN, Task.CRITIC_TRAIN, Task.REF_INFER, Task.REWARD_INFER,
                                  Task.ACTOR_LOGPROB])
@pytest.mark.parametrize("ep", [1, 2, 4, 8])
def test_ep_runs_on_whole_model_replicas_of_an_moe_model(task, ep):
    assert _problems(task, ep=ep) == []


@pytest.mark.parametrize(("case", "why"), [
    (dict(task=Task.ACTOR_GEN), "each generation replica decodes on its own"),
    (dict(task=Task.CRITIC_INFER), "only whole-expert copies take a weight sync"),
    (dict(task=Task.ACTOR_TRAIN, model=DENSE), "the tiny model has no experts"),
    (dict(task=Task.REF_INFER, ep=3), "EP3 must divide the tiny-moe model's 8 experts per MoE layer"),
    (dict(task=Task.ACTOR_TRAIN, tp=2), "its groups are whole-model replicas (no TP or PP)"),
    (dict(task=Task.ACTOR_TRAIN, pp=2), "its groups are whole-model replicas (no TP or PP)"),
    (dict(task=Task.REF_INFER, sp=2), "not with Ulysses sequence parallelism"),
    (dict(task=Task.ACTOR_TRAIN, sharding="fsdp"), "shard no state (fsdp sharding)"),
])
def test_ep_the_executor_cannot_run_is_refused_in_one_line_naming_why(case, why):
    problems = [p for p in _problems(**case) if "expert parallelism" in p]
    assert len(problems) == 1 and "\n" not in problems[0]
    assert problems[0].startswith(f"task {case['task']} has layout DPn: this executor runs expert parallelism "
                                  "only where it can (")
    assert why in problems[0]


def _plan(placement: dict, ep: dict) -> object:
    cluster = {"name": "cpu", "hosts": [{"name": "localhost", "gpus": {"type": "cpu", "count": 2}}]}
    workload = {"name": "moe", "algorithm": "grpo", "mode": "sync", "models": {"actor": "tiny-moe"},
                "prompts_per_step": 2, "responses_per_prompt": 2, "prompt_len": {"mean": 8, "max": 8},
                "response_len": {"mean": 4, "max": 4}}
    return handwritten_plan(cluster, workload, placement, expert_parallel=ep)


def test_hetprof_run_accepts_an_ep_plan_and_refuses_ep_generation():
    both = ["localhost:0", "localhost:1"]
    placement = {"actor_gen": both, "ref_infer": both, "actor_train": both}
    assert check_supported(_plan(placement, {"actor_train": 2, "ref_infer": 2})) == "gloo"
    with pytest.raises(ExecutionError) as err:
        check_supported(_plan(placement, {"actor_gen": 2}))
    assert str(err.value).startswith("task actor_gen has layout DP2×TP1×PP1 EP2: this executor runs expert "
                                      "parallelism only where it can (each generation replica decodes")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("task", [Task.ACTOR_TRAIN, Task.REF_INFER, Task.ACTOR_LOGPROB])
def test_tp_replicas_of_an_moe_model_are_refused_in_one_line(task):
    # torch's tensor-parallel plan splits dense MLPs (gate/up/down projections): an MoE block has none
    said = _problems(task, ep=1, tp=2)
    assert len(said) == 1 and "\n" not in said[0]
    assert said[0].startswith(f"task {task} has layout DPn: this executor's tensor parallelism splits dense MLPs")
    assert _problems(task, model=DENSE, ep=1, tp=2) == []


def test_tp_generation_of_an_moe_model_runs_on_vllm_only():
    # vLLM slices the experts itself; the hf backend would shard with this executor's dense-MLP plan
    def gen(backend: str) -> list[str]:
        return layout_problems(Task.ACTOR_GEN, Task(Task.ACTOR_GEN).kind, MOE, 2, 1, layout="DPn", backend=backend)
    assert gen("vllm") == []
    assert len(gen("hf")) == 1 and "splits dense MLPs only" in gen("hf")[0]
