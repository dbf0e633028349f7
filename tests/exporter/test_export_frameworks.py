"""Exported plans read by verl's and AReaL's own code (`make install-export`; marker `export`).

verl: Hydra composes its packaged trainer config (the fully-async recipe's for a split rollout) with
the exported overrides, and `verl.utils.config.validate_config` accepts the result. AReaL: its
allocation-mode parser and experiment-config loader read the export. Each round trip reads the pools,
GPU counts and layouts back out of the framework's parsed config and compares them with the plan.
Without the frameworks installed every test here skips, saying so.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from hetprof.exporter import get_target
from hetprof.exporter.engines import trainer_engine
from hetprof.exporter.verl import ASYNC_CONFIG_PATH
from hetprof.specs import Plan

pytestmark = pytest.mark.export

CLUSTERS = ["examples/clusters/hetrl-multi-region.yaml", "examples/clusters/hetrl-multi-continent.yaml"]
WORKLOADS = {"sync": "examples/workloads/qwen3-8b-grpo-sync.yaml", "async": "examples/workloads/qwen3-8b-grpo-async.yaml",
             "ppo": "examples/workloads/qwen3-8b-ppo-sync.yaml"}


def _framework(module: str, extra: str):
    try:
        return pytest.importorskip(module, reason=f"{extra} is not installed (make install-export)")
    except ImportError as exc:  # installed but a dependency is missing
        pytest.skip(f"{module} does not import ({exc}); make install-export")


def _plan(cluster: str, workload: str, target: str) -> Plan:
    from test_export import make_plan_on

    return make_plan_on(cluster, workload, "hetrl", target)


def _group(plan: Plan, task: str):
    name = plan.task(task).group
    return next(g for g in plan.groups if g.name == name)


def compose_verl(out: Path, workload_async: bool):
    """verl's trainer config composed by Hydra from verl's own files with the exported overrides."""
    from hydra import compose, initialize_config_dir

    root = importlib.util.find_spec("verl").submodule_search_locations[0]
    launch = (out / "launch.sh").read_text()
    config = launch.split("--config-name ")[1].split()[0]
    overrides = (out / "overrides.txt").read_text().split()
    where = os.path.join(root, "trainer", "config")
    if "fully_async" in config:  # the recipe's config extends the packaged trainer config
        overrides.append(f"hydra.searchpath=[file://{where}]")
        where = os.path.join(root, *ASYNC_CONFIG_PATH.split("/")[1:])
    with initialize_config_dir(config_dir=where, version_base=None):
        return compose(config_name=config, overrides=overrides)


@pytest.mark.parametrize("cluster", CLUSTERS)
@pytest.mark.parametrize("mode", list(WORKLOADS))
def test_verl_accepts_and_reads_back_the_plan(cluster, mode, tmp_path):
    _framework("hydra", "hydra-core")
    config = _framework("verl.utils.config", "verl")
    plan = _plan(cluster, WORKLOADS[mode], "verl")
    get_target("verl").export(plan, "plan.json", tmp_path)
    cfg = compose_verl(tmp_path, mode == "async")
    w = plan.workload_spec()
    # verl's critic check builds the critic's HF model config from critic.model.path (a download from the
    # Hub, or a local checkpoint): offline, the critic's section is checked by the round trip below only
    config.validate_config(cfg, use_reference_policy=w.training.kl_coef > 0, use_critic=False)
    # the round trip: pools, GPU counts and layouts as verl reads them
    actor, gen = plan.task("actor_train").layout, plan.task("actor_gen").layout
    assert cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node == len(_group(plan, "actor_train").devices)
    split = plan.task("actor_gen").group != plan.task("actor_train").group
    if split:
        assert cfg.rollout.nnodes * cfg.rollout.n_gpus_per_node == len(_group(plan, "actor_gen").devices)
        rollout_gpus = cfg.rollout.nnodes * cfg.rollout.n_gpus_per_node
    else:
        rollout_gpus = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    r = cfg.actor_rollout_ref.rollout
    assert (r.tensor_model_parallel_size, r.pipeline_model_parallel_size) == (gen.tp, gen.pp)
    assert rollout_gpus // (r.tensor_model_parallel_size * r.pipeline_model_parallel_size) == gen.dp
    a = cfg.actor_rollout_ref.actor
    assert a.strategy == trainer_engine(actor)
    if a.strategy == "megatron":
        assert (a.megatron.tensor_model_parallel_size, a.megatron.pipeline_model_parallel_size) == (actor.tp, actor.pp)
    else:
        assert a.ulysses_sequence_parallel_size == actor.sp
        assert a.fsdp_config.reshard_after_forward == (actor.sharding == "fsdp")
    assert cfg.data.train_batch_size == w.prompts_per_step and r.n == w.responses_per_prompt
    if w.algorithm == "ppo":
        critic = plan.task("critic_train").layout
        assert cfg.critic.strategy == trainer_engine(critic)


@pytest.mark.parametrize("cluster", CLUSTERS)
@pytest.mark.parametrize("mode", list(WORKLOADS))
def test_areal_accepts_and_reads_back_the_plan(cluster, mode, tmp_path):
    alloc = _framework("areal.api.alloc_mode", "AReaL")
    cli_args = _framework("areal.api.cli_args", "AReaL")
    from omegaconf import OmegaConf

    plan = _plan(cluster, WORKLOADS[mode], "areal")
    get_target("areal").export(plan, "plan.json", tmp_path)
    raw, _ = cli_args.parse_cli_args(["--config", str(tmp_path / "config.yaml")])
    cls = cli_args.PPOConfig if plan.workload_spec().algorithm == "ppo" else cli_args.GRPOConfig
    cfg = OmegaConf.to_object(cli_args.to_structured_cfg(raw, config_cls=cls))
    mode_ = alloc._AllocationMode.from_str(cfg.allocation_mode)
    gen, actor = plan.task("actor_gen").layout, plan.task("actor_train").layout
    g = mode_["rollout"].parallel
    assert (g.data_parallel_size, g.pipeline_parallel_size, g.tensor_parallel_size) == (gen.dp, gen.pp, gen.tp)
    t = mode_["actor"].parallel
    assert t.data_parallel_size * t.pipeline_parallel_size * t.tensor_parallel_size == actor.world
    assert (t.pipeline_parallel_size, t.tensor_parallel_size) == (actor.pp, actor.tp)
    assert cfg.cluster.n_nodes == sum(len({d.split(":")[0] for d in g.devices}) for g in plan.groups)
    if plan.workload_spec().algorithm == "ppo":
        c, critic = mode_["critic"].parallel, plan.task("critic_train").layout
        assert c.data_parallel_size * c.pipeline_parallel_size * c.tensor_parallel_size == critic.world
    # AReaL 1.0's per-engine fields say the same as the legacy allocation mode
    assert cfg.rollout.backend == f"{plan.backend}:d{gen.dp}p{gen.pp}t{gen.tp}"
