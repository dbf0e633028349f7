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

UNSET_PROMPTS = "PROMPT-FILE"  # the workload names none: the user's own dataset goes here


def _term(backend: str, name: str, lay: TaskLayout) -> str:
    """`backend[name]:dims`; a Megatron trainer's expert-parallel size (Megatron's, ep × tp with whole
    experts) as AReaL's `e` dimension, whose experts are whole (the `whole-experts` rule refuses the rest)."""
    dims = f"d{lay.dp}" if backend == "fsdp" else f"d{lay.dp}p{lay.pp}t{lay.tp}"
    if backend != "fsdp" and lay.expert_ranks > 1:
        dims += f"e{lay.expert_ranks}"
    return f"{backend}[{name}]:{dims}"


def engine_backends(plan: Plan) -> dict[str, str]:
    """AReaL 1.0's per-engine `backend` fields (`rollout.backend: vllm:d4p1t2`, `actor.backend: fsdp:d8`)."""
    out = {}
    for section, task, backend in (("rollout", Task.ACTOR_GEN, plan.backend), ("actor", Task.ACTOR_TRAIN, None),
                                   ("critic", Task.CRITIC_TRAIN, None)):
        if task in [t.task for t in plan.tasks]:
            lay = plan.task(task).layout
            engine = backend or trainer_engine(lay)
            out[section] = _term(engine, "", lay).replace("[]", "")
    return out


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
        Setting("trial_name", f"{plan.search or 'plan'}-seed{plan.seed}", "search, seed"),
        Setting("allocation_mode", allocation_mode(plan), f"tasks[{ga}].layout, tasks[{ta}].layout, backend"),
        Setting("cluster.n_nodes", sum(s.nnodes for s in shapes.values()), "groups[*].devices (hosts)"),
        Setting("cluster.n_gpus_per_node", max(per_node), "groups[*].devices (GPUs per host)"),
        *[Setting(f"{section}.backend", value, f"tasks[{task_index(plan, task)}].layout")
          for (section, value), task in zip(engine_backends(plan).items(),
                                            (Task.ACTOR_GEN, Task.ACTOR_TRAIN, Task.CRITIC_TRAIN), strict=False)],
        Setting("rollout.max_head_offpolicyness", w.staleness if w.mode == "async" else 0,
                "workload.staleness (0: workload.mode sync)"),
        Setting("gconfig.n_samples", w.responses_per_prompt, "workload.responses_per_prompt"),
        Setting("gconfig.max_new_tokens", w.response_len.max, "workload.response_len.max"),
        Setting("gconfig.temperature", w.training.temperature, "workload.training.temperature"),
        Setting("train_dataset.batch_size", w.prompts_per_step, "workload.prompts_per_step"),
        Setting("train_dataset.type", "rl", "the plan is RL post-training"),
        Setting("train_dataset.path", w.data.prompts or UNSET_PROMPTS, "workload.data.prompts"),
        Setting("actor.path", w.models.actor, "workload.models.actor"),
        Setting("actor.optimizer.lr", w.training.lr, "workload.training.lr"),
        Setting("actor.ppo_n_minibatches", w.mini_batches, "workload.mini_batches"),
        Setting("actor.eps_clip", w.training.clip_eps, "workload.training.clip_eps"),
        Setting("actor.kl_ctl", w.training.kl_coef, "workload.training.kl_coef"),
        Setting("actor.gradient_checkpointing", w.training.recompute_mode == "full",
                "workload.training.recompute (full; selective has no FSDP form)"),
        *[Setting(f"{section}.{key}", "${" + key + "}", f"AReaL's {key}, set above")
          for section in ("saver", "evaluator", "recover", "stats_logger", *engine_backends(plan))
          for key in ("experiment_name", "trial_name")],
        *[Setting(f"{section}.fileroot", "${cluster.fileroot}", "AReaL's cluster.fileroot")
          for section in ("saver", "evaluator", "recover", "stats_logger")],
        Setting("actor.mb_spec.max_tokens_per_mb", w.prompt_len.max + w.response_len.max,
                "workload.prompt_len.max + workload.response_len.max"),
    ]


def _yaml(sets: list[Setting]) -> str:
    """Nested YAML, one comment per value naming its plan field (sections in first-seen order)."""
    tree: dict = {}
    for s in sets:
        *parents, leaf = s.key.split(".")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = s

    def emit(node: dict, depth: int) -> list[str]:
        lines = []
        for key, item in node.items():
            if isinstance(item, dict):
                lines += [("  " * depth) + f"{key}:", *emit(item, depth + 1)]
                continue
            v = item.value
            text = f'"{v}"' if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else v
            lines.append("  " * depth + f"{key}: {text}  # {item.source}")
        return lines

    return "\n".join(emit(tree, 0)) + "\n"


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
