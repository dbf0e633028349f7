"""AReaL (1.0): its allocation-mode string and an experiment config, each value commented with its plan field.

How a plan maps: AReaL decouples generation from training, so the rollout's group is the inference
allocation (`vllm[rollout]:dXpYtZ`, replicas × stages × TP) and the actor's group the training
allocation (`fsdp[actor]:dN` for whole-model replicas sharded zero2/fsdp, else
`megatron[actor]:dXpYtZ`); a PPO critic is a third term, joined with `|` when it shares the actor's
GPUs. The reference and reward passes run on the actor's allocation. A sync workload is AReaL with
`max_head_offpolicyness: 0`; async, the staleness.
"""

from __future__ import annotations

from hetprof.exporter.base import Setting, Target, group_index, pool_shapes, ray_node_lines, task_index
from hetprof.exporter.engines import trainer_engine
from hetprof.specs.layout import TaskLayout
from hetprof.specs.plan import Plan
from hetprof.specs.vocabulary import Task


def _term(backend: str, name: str, lay: TaskLayout) -> str:
    dims = f"d{lay.dp}" if backend == "fsdp" else f"d{lay.dp}p{lay.pp}t{lay.tp}"
    return f"{backend}[{name}]:{dims}"


def allocation_mode(plan: Plan) -> str:
    """AReaL's allocation mode for the plan, e.g. `vllm[rollout]:d4p1t2+fsdp[actor]:d8`."""
    gen, actor = plan.task(Task.ACTOR_GEN), plan.task(Task.ACTOR_TRAIN)
    mode = _term(plan.backend, "rollout", gen.layout) + "+" + _term(trainer_engine(actor.layout), "actor", actor.layout)
    names = [t.task for t in plan.tasks]
    if Task.CRITIC_TRAIN in names:
        critic = plan.task(Task.CRITIC_TRAIN)
        mode += ("|" if critic.group == actor.group else "+") + _term(trainer_engine(critic.layout), "critic",
                                                                       critic.layout)
    return mode


def settings(plan: Plan) -> list[Setting]:
    w = plan.workload_spec()
    shapes = pool_shapes(plan)
    per_node = {s.gpus_per_node for s in shapes.values()}
    ga, ta = task_index(plan, Task.ACTOR_GEN), task_index(plan, Task.ACTOR_TRAIN)
    return [
        Setting("experiment_name", w.name, "workload.name"),
        Setting("allocation_mode", allocation_mode(plan), f"tasks[{ga}].layout, tasks[{ta}].layout, backend"),
        Setting("cluster.n_nodes", sum(s.nnodes for s in shapes.values()), "groups[*].devices (hosts)"),
        Setting("cluster.n_gpus_per_node", max(per_node), "groups[*].devices (GPUs per host)"),
        Setting("rollout.max_head_offpolicyness", w.staleness if w.mode == "async" else 0,
                "workload.staleness (0: workload.mode sync)"),
        Setting("gconfig.n_samples", w.responses_per_prompt, "workload.responses_per_prompt"),
        Setting("gconfig.max_new_tokens", w.response_len.max, "workload.response_len.max"),
        Setting("gconfig.temperature", w.training.temperature, "workload.training.temperature"),
        Setting("train_dataset.batch_size", w.prompts_per_step, "workload.prompts_per_step"),
        Setting("actor.path", w.models.actor, "workload.models.actor"),
        Setting("actor.optimizer.lr", w.training.lr, "workload.training.lr"),
        Setting("actor.ppo_n_minibatches", w.mini_batches, "workload.mini_batches"),
        Setting("actor.eps_clip", w.training.clip_eps, "workload.training.clip_eps"),
        Setting("actor.kl_ctl", w.training.kl_coef, "workload.training.kl_coef"),
        Setting("actor.gradient_checkpointing", w.training.recompute, "workload.training.recompute"),
        Setting("actor.mb_spec.max_tokens_per_mb", w.prompt_len.max + w.response_len.max,
                "workload.prompt_len.max + workload.response_len.max"),
    ]


def _yaml(sets: list[Setting]) -> str:
    """Nested YAML, one comment per value naming its plan field."""
    lines, opened = [], set()
    for s in sets:
        *parents, leaf = s.key.split(".")
        for depth in range(len(parents)):
            path = tuple(parents[:depth + 1])
            if path not in opened:
                opened.add(path)
                lines.append("  " * depth + f"{parents[depth]}:")
        value = f'"{s.value}"' if isinstance(s.value, str) else str(s.value).lower() if isinstance(s.value, bool) \
            else s.value
        lines.append("  " * len(parents) + f"{leaf}: {value}  # {s.source}")
    return "\n".join(lines) + "\n"


class Areal(Target):
    """AReaL 1.0 and later."""

    name = "areal"

    def files(self, plan: Plan, plan_path: str) -> dict[str, str]:
        sets = settings(plan)
        shapes = pool_shapes(plan)
        order = [plan.task(Task.ACTOR_GEN).group] + [g.name for g in plan.groups
                                                     if g.name != plan.task(Task.ACTOR_GEN).group]
        hosts = " ".join(h for g in order for h in shapes[g].hosts)
        script = "\n".join([
            "#!/usr/bin/env bash", f"# AReaL launch for hetprof plan {plan_path} (hetprof export --to areal).",
            "# AReaL's launcher fills the rollout allocation first, then training, in host order:",
            f"# the hosts in that order are: {hosts}",
            "# Start Ray on every host: RAY_ARGS='--address HEAD:6379' ./launch.sh node; then ./launch.sh train ENTRY.py",
            "set -euo pipefail", 'here="$(cd "$(dirname "$0")" && pwd)"',
            'if [ "${1:-train}" = node ]; then', '  case "$(hostname)" in', *ray_node_lines(plan, shapes),
            '  *) echo "host $(hostname) is not in the plan" >&2; exit 1 ;;', "  esac", "  exit 0", "fi",
            'shift || true', 'exec python3 -m areal.infra.launcher.ray "$@" --config "$here/config.yaml"', ""])
        return {"config.yaml": _yaml(sets), "launch.sh": script,
                "trace.tsv": "key\tvalue\tfrom the plan\n" + "".join(f"{s.key}\t{s.value}\t{s.source}\n" for s in sets)}


__all__ = ["Areal", "allocation_mode", "group_index"]
