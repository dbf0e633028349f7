"""verl (0.9): Hydra overrides of its packaged trainer config, Ray node resources and a launch script.

How a plan maps: the group holding the actor is verl's global pool (`trainer.nnodes` ×
`trainer.n_gpus_per_node`); the rollout is colocated there (the hybrid engine) or, in an async
workload, a pool of its own run by verl's fully-async recipe (`rollout.nnodes` × `n_gpus_per_node`,
staleness as `async_training.staleness_threshold`); a reward model on its own group is
`reward.reward_model.enable_resource_pool`. A training layout TP1×PP1 sharded zero2/fsdp is the FSDP
engine (zero2 = `reshard_after_forward: false`); any other is Megatron (TP, PP, its distributed
optimizer for zero1). Rollout replicas are the pool's GPUs over rollout TP × PP (verl derives them).
"""

from __future__ import annotations

from hetprof.exporter.base import (
    Setting,
    Target,
    group_index,
    pool_shapes,
    ray_node_lines,
    task_index,
    trace_table,
)
from hetprof.exporter.engines import trainer_engine
from hetprof.specs.plan import Plan
from hetprof.specs.vocabulary import Task

SYNC_CONFIG = {"fsdp": "ppo_trainer", "megatron": "ppo_megatron_trainer"}
ASYNC_CONFIG = {"fsdp": "fully_async_ppo_trainer", "megatron": "fully_async_ppo_megatron_trainer"}
SYNC_MAIN = "verl.trainer.main_ppo"
ASYNC_MAIN = "verl.experimental.fully_async_policy.fully_async_main"
ASYNC_CONFIG_PATH = "verl/experimental/fully_async_policy/config"


def _engine_settings(prefix: str, plan: Plan, task: str) -> list[Setting]:
    lay = plan.task(task).layout
    src = f"tasks[{task_index(plan, task)}].layout"
    engine = trainer_engine(lay)
    out = [Setting(f"{prefix}.strategy", engine, f"{src} ({lay.describe()})")] if task != Task.REF_INFER else []
    if engine == "fsdp":
        fsdp = "fsdp" if prefix == "critic" else "fsdp_config"  # verl names the critic's section differently
        out += [Setting(f"{prefix}.{fsdp}.reshard_after_forward", lay.sharding == "fsdp", f"{src}.sharding"),
                Setting(f"{prefix}.ulysses_sequence_parallel_size", lay.sp, f"{src}.sp")]
    else:
        out += [Setting(f"{prefix}.megatron.tensor_model_parallel_size", lay.tp, f"{src}.tp"),
                Setting(f"{prefix}.megatron.pipeline_model_parallel_size", lay.pp, f"{src}.pp"),
                Setting(f"{prefix}.megatron.context_parallel_size", lay.cp, f"{src}.cp"),
                # whole experts (etp 1) fold Megatron's EP group over the TP ranks: EP = ep × tp
                Setting(f"{prefix}.megatron.expert_model_parallel_size", lay.expert_ranks,
                        f"{src}.ep" + (" × tp (etp 1)" if lay.folded else "")),
                Setting(f"{prefix}.megatron.expert_tensor_parallel_size", 1 if lay.folded else lay.tp,
                        f"{src}.etp" if lay.folded else f"{src}.tp (experts sliced over the TP ranks)"),
                Setting(f"{prefix}.megatron.use_distributed_optimizer", lay.sharding == "zero1", f"{src}.sharding")]
    return out


def settings(plan: Plan) -> tuple[list[Setting], str, bool]:
    """The overrides, the config name and whether the rollout runs fully async on its own pool."""
    w = plan.workload_spec()
    shapes = pool_shapes(plan)
    actor, gen = plan.task(Task.ACTOR_TRAIN), plan.task(Task.ACTOR_GEN)
    split = gen.group != actor.group
    engine = trainer_engine(actor.layout)
    g, ga = group_index(plan, actor.group), task_index(plan, Task.ACTOR_GEN)
    pool = shapes[actor.group]
    out = [Setting("trainer.nnodes", pool.nnodes, f"groups[{g}].devices (hosts)"),
           Setting("trainer.n_gpus_per_node", pool.gpus_per_node, f"groups[{g}].devices (GPUs per host)"),
           Setting("actor_rollout_ref.model.path", w.models.actor, "workload.models.actor"),
           Setting("actor_rollout_ref.rollout.name", plan.backend, "backend"),
           Setting("actor_rollout_ref.rollout.tensor_model_parallel_size", gen.layout.tp, f"tasks[{ga}].layout.tp"),
           Setting("actor_rollout_ref.rollout.pipeline_model_parallel_size", gen.layout.pp, f"tasks[{ga}].layout.pp"),
           Setting("actor_rollout_ref.rollout.gpu_memory_utilization", w.generation.gpu_memory_utilization,
                   "workload.generation.gpu_memory_utilization"),
           Setting("actor_rollout_ref.rollout.max_num_seqs", w.generation.max_num_seqs, "workload.generation.max_num_seqs"),
           Setting("actor_rollout_ref.rollout.n", w.responses_per_prompt, "workload.responses_per_prompt"),
           Setting("actor_rollout_ref.rollout.temperature", w.training.temperature, "workload.training.temperature"),
           Setting("actor_rollout_ref.rollout.top_p", w.training.top_p, "workload.training.top_p"),
           Setting("data.train_batch_size", w.prompts_per_step, "workload.prompts_per_step"),
           Setting("data.max_prompt_length", w.prompt_len.max, "workload.prompt_len.max"),
           Setting("data.max_response_length", w.response_len.max, "workload.response_len.max"),
           Setting("actor_rollout_ref.actor.ppo_mini_batch_size", w.prompts_per_step // w.mini_batches,
                   "workload.prompts_per_step / workload.mini_batches"),
           Setting("actor_rollout_ref.actor.ppo_epochs", w.ppo_epochs, "workload.ppo_epochs"),
           Setting("actor_rollout_ref.actor.use_dynamic_bsz", True, "token budgets below"),
           Setting("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", w.prompt_len.max + w.response_len.max,
                   "workload.prompt_len.max + workload.response_len.max (one whole sequence per micro-batch at least)"),
           Setting("actor_rollout_ref.actor.optim.lr", w.training.lr, "workload.training.lr"),
           Setting("actor_rollout_ref.actor.clip_ratio", w.training.clip_eps, "workload.training.clip_eps"),
           Setting("actor_rollout_ref.model.enable_gradient_checkpointing", w.training.recompute_mode == "full",
                   "workload.training.recompute (full; selective has no FSDP form)"),
           Setting("algorithm.adv_estimator", "gae" if w.algorithm == "ppo" else "grpo", "workload.algorithm"),
           Setting("algorithm.gamma", w.training.gamma, "workload.training.gamma"),
           Setting("algorithm.lam", w.training.lam, "workload.training.lam"),
           Setting("actor_rollout_ref.actor.use_kl_loss", w.training.kl_coef > 0, "workload.training.kl_coef"),
           Setting("actor_rollout_ref.actor.kl_loss_coef", w.training.kl_coef, "workload.training.kl_coef")]
    out += _engine_settings("actor_rollout_ref.actor", plan, Task.ACTOR_TRAIN)
    if Task.REF_INFER in [t.task for t in plan.tasks] and engine == "megatron":
        out += _engine_settings("actor_rollout_ref.ref", plan, Task.REF_INFER)
    if w.algorithm == "ppo":
        out += _engine_settings("critic", plan, Task.CRITIC_TRAIN)
        out += [Setting("critic.optim.lr", w.training.critic_lr, "workload.training.critic_lr"),
                Setting("critic.model.path", w.models.critic or w.models.actor, "workload.models.critic")]
    if split:
        rp, gi = shapes[gen.group], group_index(plan, gen.group)
        out += [Setting("rollout.nnodes", rp.nnodes, f"groups[{gi}].devices (hosts)"),
                Setting("rollout.n_gpus_per_node", rp.gpus_per_node, f"groups[{gi}].devices (GPUs per host)"),
                Setting("actor_rollout_ref.hybrid_engine", False, f"tasks[{ga}].group != actor_train's"),
                Setting("async_training.staleness_threshold", w.staleness,
                        "workload.staleness (weight versions the rollout may run ahead)"),
                Setting("async_training.trigger_parameter_sync_step", w.mini_batches,
                        "workload.mini_batches (one weight sync per hetprof iteration)"),
                Setting("async_training.partial_rollout", w.generation.partial_rollout,
                        "workload.generation.partial_rollout")]
    names = [t.task for t in plan.tasks]
    if w.models.reward:
        ri = task_index(plan, Task.REWARD_INFER)
        out += [Setting("reward.reward_model.enable", True, "workload.models.reward"),
                Setting("reward.reward_model.model_path", w.models.reward, "workload.models.reward"),
                Setting("reward.reward_model.rollout.name", plan.backend, "backend"),
                Setting("reward.reward_model.rollout.tensor_model_parallel_size",
                        plan.task(Task.REWARD_INFER).layout.tp, f"tasks[{ri}].layout.tp")]
    if Task.REWARD_INFER in names and plan.task(Task.REWARD_INFER).group != actor.group:
        rw = plan.task(Task.REWARD_INFER).group
        rs, ri = shapes[rw], group_index(plan, rw)
        out += [Setting("reward.reward_model.enable_resource_pool", True, f"groups[{ri}] (reward_infer's own)"),
                Setting("reward.reward_model.nnodes", rs.nnodes, f"groups[{ri}].devices (hosts)"),
                Setting("reward.reward_model.n_gpus_per_node", rs.gpus_per_node, f"groups[{ri}].devices (GPUs per host)")]
    return out, (ASYNC_CONFIG if split else SYNC_CONFIG)[engine], split


class Verl(Target):
    """verl 0.9 and later."""

    name = "verl"

    def files(self, plan: Plan, plan_path: str) -> dict[str, str]:
        sets, config, split = settings(plan)
        shapes = pool_shapes(plan)
        pools = "\n".join(f"#   {s.name}: {s.nnodes} node(s) × {s.gpus_per_node} GPUs ({'/'.join(s.gpu_types)}) in {', '.join(s.regions)}"
                          for s in shapes.values())
        main = ASYNC_MAIN if split else SYNC_MAIN
        path = f" --config-path $(python3 -c 'import verl, os; print(os.path.dirname(verl.__file__))')/../" \
               f"{ASYNC_CONFIG_PATH}" if split else ""
        script = "\n".join([
            "#!/usr/bin/env bash", f"# verl launch for hetprof plan {plan_path} (hetprof export --to verl).",
            "# Pools (each host labelled by the Ray resources below: pool_<group>, its GPU type, region_<region>;",
            "# verl 0.9 asks Ray for GPU counts only, so start Ray on exactly these hosts):", pools,
            "# Start Ray on every host with its resources: RAY_ARGS='--address HEAD:6379' ./launch.sh node",
            "# then, on the head, run the trainer: ./launch.sh train",
            "set -euo pipefail", 'here="$(cd "$(dirname "$0")" && pwd)"',
            'if [ "${1:-train}" = node ]; then', '  case "$(hostname)" in', *ray_node_lines(plan, shapes),
            '  *) echo "host $(hostname) is not in the plan" >&2; exit 1 ;;', "  esac", "  exit 0", "fi",
            "mapfile -t overrides < \"$here/overrides.txt\"",
            f"exec python3 -m {main}{path} --config-name {config} \"${{overrides[@]}}\" \"$@\"", ""])
        return {"overrides.txt": "\n".join(s.override() for s in sets) + "\n", "trace.tsv": trace_table(sets),
                "launch.sh": script}
