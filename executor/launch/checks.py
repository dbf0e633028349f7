"""Before any worker starts: which devices and hosts a plan uses, and whether this executor can carry it out.

The plan names devices (`host:index`); the launcher on each host starts one worker per planned device
of that host, local rank i running the host's i-th device. Anything the runtime cannot carry out
(see `check_supported`: pipelined generation, a GPU plan on a machine without CUDA, ...) is refused
here, naming the task and its layout, so a run fails in the launcher rather than in a collective.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from hetprof.errors import ExecutionError, HetprofError, SpecError
from hetprof.executor.prompts.data import Prompt
from hetprof.specs import RUNNABLE_BACKENDS, ClusterSpec, Plan, WorkloadSpec
from hetprof.specs.executable import layout_problems, streaming_problem, workload_problems
from hetprof.specs.overrides import apply_overrides, from_override
from hetprof.specs.vocabulary import TaskKind

# What `hetprof run --set` may change: how the run trains and what it reads, never what the plan
# placed or priced (the tasks, the models, the batch shapes) — those need `hetprof plan --set`.
RUN_OVERRIDABLE = ("optimizer", "data", "training.lr", "training.critic_lr", "training.clip_eps", "training.gamma",
                   "training.lam", "training.temperature", "training.top_p")


def load_plan(path: str | Path, overrides: Sequence[str] = ()) -> Plan:
    """Read and validate a plan file (what every worker and the launcher start from), with the
    `--set` overrides of its workload applied."""
    plan = Plan.load(path)
    if overrides:
        for item in overrides:
            key = item.partition("=")[0].strip()
            if not any(key == k or key.startswith((k + ".", k + "[")) for k in RUN_OVERRIDABLE):
                raise SpecError(f"--set {item}", key, "a field `hetprof run` may change (optimizer.*, data.*, "
                                "training.lr, critic_lr, clip_eps, gamma, lam, temperature, top_p)"
                                + _run_field_hint(key))
        workload = apply_overrides(plan.workload, overrides)
        try:
            WorkloadSpec.from_dict(workload, file=str(path))
        except SpecError as exc:
            raise from_override(exc, overrides) from None
        plan = dataclasses.replace(plan, workload=workload)
    plan.validate()
    return plan


def _run_field_hint(key: str) -> str:
    """What follows the refusal of a field `run --set` may not change: the field meant, for a typo of
    one it may (the loader's did-you-mean rule), else the way to change it."""
    from hetprof.specs.training_setup import DataParams, OptimizerParams

    fields = [k for k in RUN_OVERRIDABLE if "." in k]
    fields += [f"{group}.{f.name}" for group, cls in (("optimizer", OptimizerParams), ("data", DataParams))
               for f in dataclasses.fields(cls)]
    close = difflib.get_close_matches(key, fields, n=1)
    if close and not _workload_field(key):
        return f" — did you mean '{close[0]}'?"
    return "; this one changes what the plan was made for: replan with `hetprof plan --set`"


def _workload_field(key: str) -> bool:
    """Whether `key` names a field of the workload spec (its dataclass levels; below them anything goes)."""
    import typing

    from hetprof.specs.overrides import split_field_path

    cls: Any = WorkloadSpec
    for part in split_field_path(key):
        if not dataclasses.is_dataclass(cls):
            return True
        names = {f.name for f in dataclasses.fields(cls)}
        if part not in names:
            return False
        cls = typing.get_type_hints(cls)[part]
    return True


def planned_devices(plan: Plan) -> list[str]:
    """The devices the plan's tasks use, in cluster order (hosts as listed, then index)."""
    used = {d for t in plan.tasks for d in t.devices()}
    return [d.id for d in plan.cluster_spec().devices() if d.id in used]


def planned_hosts(plan: Plan) -> list[str]:
    """Hosts holding at least one planned device, in cluster order: node rank R runs host R."""
    return list(dict.fromkeys(dev.rsplit(":", 1)[0] for dev in planned_devices(plan)))  # ordered, linear


def host_devices(plan: Plan, host: str) -> list[str]:
    """Planned devices of one host: local rank i of that host's launcher runs the i-th."""
    return [d for d in planned_devices(plan) if d.rsplit(":", 1)[0] == host]


def device_kind(cluster: ClusterSpec, device_id: str) -> str:
    """'cpu' for CPU worker slots, 'cuda' for GPUs."""
    return device_kinds(cluster, [device_id])[device_id]


def device_kinds(cluster: ClusterSpec, device_ids: Sequence[str]) -> dict[str, str]:
    """device_kind of many devices with one pass over the cluster (a plan may place thousands)."""
    kinds = {d.id: "cpu" if d.type == "cpu" else "cuda" for d in cluster.devices()}
    for device_id in device_ids:
        if device_id not in kinds:
            raise ExecutionError(f"device {device_id} is not in the plan's cluster")
    return {d: kinds[d] for d in device_ids}


def check_supported(plan: Plan, cuda_available: bool | None = None) -> str:
    """Refuse what this executor cannot carry out; returns the torch.distributed backend to use.

    Carried out: data parallelism everywhere (uneven shares); tensor parallelism (torch's
    tensor-parallel API over each stage's devices) for every task; pipeline stages
    (torch.distributed.pipelining, the plan's layer split) for training tasks and for the reference
    and reward models, combined with TP and DP; Ulysses sequence parallelism (a layout's `sp`) for the
    packed passes of every task but generation, on whole-model replicas; expert parallelism (a
    layout's `ep`) of an MoE model's training and inference passes but generation and critic_infer,
    on whole-model replicas. Refused, naming the task and its layout, what `hetprof.specs.executable`
    lists (the planner plans within the same rules): pipeline stages for actor_gen and critic_infer,
    a pipelined training task whose replicas split the layers differently, a TP degree that does not
    divide the heads, KV heads and FFN width, an `sp` or `ep` it cannot run, context parallelism;
    and here two replicas of one task on one device, and a GPU plan on a machine without CUDA.
    """
    for problem in workload_problems(plan.workload_spec()):
        raise ExecutionError(f"{problem}; it is refused rather than ignored — the plan is a what-if "
                             f"(made with --any-layout): replan without it")
    workload = plan.workload_spec()
    roles, packed = workload.roles(), workload.training.max_tokens_per_microbatch is not None
    for t in plan.tasks:
        lay = t.layout
        problems = [p for tp in sorted(set(lay.tp_degrees()))  # each replica's degree
                    for p in layout_problems(t.task, t.kind, roles[t.role], tp, lay.pp, lay.layer_splits, str(lay),
                                             lay.sharding, sp=lay.sp, cp=lay.cp, ep=lay.ep, packed=packed,
                                             backend=plan.backend)]
        if problems:
            raise ExecutionError(f"{problems[0]}; it is refused rather than changed — replan with `hetprof plan` "
                                 f"(it plans within what `hetprof run` carries out unless given --any-layout) "
                                 f"or edit the plan")
        devices = t.devices()
        if len(set(devices)) != len(devices):
            raise ExecutionError(f"task {t.task} places two replicas on one device ({devices}); "
                                 f"one device runs one replica of a task")
    cluster = plan.cluster_spec()
    kinds = set(device_kinds(cluster, planned_devices(plan)).values())
    if kinds == {"cpu"}:
        return "gloo"
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if not cuda_available:
        raise ExecutionError("the plan places tasks on GPUs but this machine has no CUDA device; "
                             "plan for a cluster of `type: cpu` slots to run without a GPU")
    if kinds == {"cuda"}:
        return "nccl"
    return "gloo"  # mixed CPU slots and GPUs: gloo reaches both


def check_backend(plan: Plan, backend: str | None, path: str | Path = "the plan") -> str:
    """The generation backend to run: the plan's own, or `backend` if it is the same one.

    A plan's generation times were priced for one engine (continuous batching or the padded loop),
    so running it with another would measure something the plan did not predict: refused (exit 2).
    """
    if plan.backend not in RUNNABLE_BACKENDS:
        raise HetprofError(f"{path} was planned for the {plan.backend} generation backend, which `hetprof run` "
                           f"cannot run (it runs {', '.join(RUNNABLE_BACKENDS)}): replan with `hetprof plan --backend "
                           f"{RUNNABLE_BACKENDS[0]}` or `--backend {RUNNABLE_BACKENDS[1]}`")
    if backend is None or backend == plan.backend:
        return plan.backend
    raise HetprofError(f"{path} was planned for the {plan.backend} generation backend, not {backend} (--backend): "
                       f"run it with --backend {plan.backend} or replan with `hetprof plan --backend {backend}`")


MAX_SLOTS_PER_CORE = 4  # cpu slots may share a core (cpuslots.py); beyond this many a run only thrashes
TRAINED_BYTES_PER_PARAM = 16  # fp32 weights, gradients and Adam's two moments
SERVED_BYTES_PER_PARAM = 4  # fp32 weights


def check_host_capacity(plan: Plan, host: str, cores: int | None = None, available: int | None = None) -> None:
    """Refuse up front a plan this host cannot hold: more `cpu` slot workers than MAX_SLOTS_PER_CORE
    per usable core, or more memory than the host has available — each worker at least this
    launcher's own resident size (Python and torch loaded), plus the fp32 state of the models its
    `cpu` slot holds. A worker that runs out fails after minutes, in a collective; this fails now."""
    from hetprof.runtime.cpuslots import usable_cores

    devices = host_devices(plan, host)
    cluster = plan.cluster_spec()
    kinds = device_kinds(cluster, devices)
    cpu_slots = [d for d in devices if kinds[d] == "cpu"]
    cores = len(usable_cores()) if cores is None else cores
    if len(cpu_slots) > MAX_SLOTS_PER_CORE * cores:
        raise HetprofError(f"the plan runs {len(cpu_slots)} cpu-slot workers on host {host}, which has {cores} usable "
                           f"cores: at most {MAX_SLOTS_PER_CORE} per core run; replan for this host's cores")
    available = _available_memory() if available is None else available
    if available is None:
        return
    roles = plan.workload_spec().roles()
    need = len(devices) * _own_resident_bytes()
    on_cpu = set(cpu_slots)
    for t in plan.tasks:
        per_param = TRAINED_BYTES_PER_PARAM if t.kind == TaskKind.TRAINING else SERVED_BYTES_PER_PARAM
        need += sum(1 for d in t.devices() if d in on_cpu) * roles[t.role].params * per_param
    if need > available:
        raise HetprofError(f"the plan's {len(devices)} workers on host {host} need at least {need / 2**30:.1f} GiB "
                           f"(each worker's Python and torch, and the fp32 models of its cpu slots), more than the "
                           f"{available / 2**30:.1f} GiB this host has available; replan for fewer workers or smaller models")


def _available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where the platform has no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _own_resident_bytes() -> int:
    """This process's resident size: what a worker holds before its first model (it imports the same)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def plan_is_cpu(plan: Plan) -> bool:
    """Whether every planned device is a `cpu` worker slot (one core each)."""
    cluster = plan.cluster_spec()
    used = {d for t in plan.tasks for d in t.devices()}
    return all(d.type == "cpu" for d in cluster.devices() if d.id in used)


def check_resumable(checkpoint_dir: str | Path, plan: Plan) -> int:
    """Refuse --resume before any worker starts when there is nothing (or another plan's) to resume;
    every state.pt it resumes from is checked here, and a damaged newest checkpoint is skipped for the
    newest intact one with a warning (the leader picks the same)."""
    from hetprof.executor.checkpoints.checkpoint import resume_point
    from hetprof.executor.records.run_log import plan_hash

    start, _, warnings = resume_point(checkpoint_dir, plan_hash(plan))
    for warning in warnings:
        print(f"warning: {warning}; resuming from an earlier checkpoint", file=sys.stderr)
    check_learner_progress(checkpoint_dir, plan, start)
    return start


def check_learner_progress(checkpoint_dir: str | Path, plan: Plan, start: int) -> None:
    """Refuse, before any worker starts, a trainer's checkpoint at `start` that holds no learner
    progress (step counters, learning-rate schedule, shuffler: an older hetprof saved only the model
    and optimizer). Why here: resumed from it, a run would restart its schedule and shuffle, so a
    worker refuses it anyway, after every rank has started. A unit on another host is that host's check."""
    from hetprof.executor.checkpoints.checkpoint import (
        STATE,
        CheckpointRefused,
        iteration_folder,
        load_state,
        unit_folders,
    )

    training = {t.task for t in plan.tasks if t.kind == TaskKind.TRAINING}
    root = Path(checkpoint_dir)
    for unit in unit_folders(root, start):
        folder = unit.relative_to(root).parts[0]
        if folder not in training and folder != "ranks":
            continue
        path = unit / iteration_folder(start) / STATE
        # a trained unit holds its learner's progress; a rank's own state its replicas' shufflers
        key, what = ("learner", "no learner progress (step counters, learning-rate schedule, shuffler)") \
            if folder in training else ("runners", "no state of this rank's own (its trainer replica's shuffler)")
        if not isinstance(load_state(path, "cpu", mmap=True).get(key), dict):
            raise CheckpointRefused(f"--resume: checkpoint {path} holds {what}: an older hetprof wrote it, and a "
                                    "run resumed from it would restart them; start a new run instead")


# ---- what the run reads and writes: refused as bad input (exit 2) before any worker starts ------------

def warn_streaming(plan: Plan, path: str | Path = "the plan") -> str | None:
    """One line on stderr when the plan was priced with streaming generation this executor does not carry
    out (hetprof/specs/executable.py): the run goes on, its prediction will not hold. Returns the line."""
    problem = streaming_problem(plan.streaming)
    if problem is None:
        return None
    line = f"warning: {path}: {problem}"
    print(line, file=sys.stderr)
    return line


def check_inputs(plan: Plan, plan_path: str | Path, backend: str, reward: str, prompts: str | None, seed: int,
                 outputs: dict[str, tuple[str | None, str]], overrides: Sequence[str] = (),
                 allow_prompts_outside: bool = False) -> None:
    """The prompts (every row) and the chat template, the reward, the generation backend's package
    and the output paths — each a one-line error naming the file (and line). A plan's own prompt
    files must lie in its folder unless `allow_prompts_outside` or the user set them (`--set data.*`)."""
    workload = plan.workload_spec()
    if not allow_prompts_outside:
        from hetprof.executor.prompts.prompt_files import check_confined

        named = {f"data.{f}" for f in ("prompts", "validation") for item in overrides
                 if item.partition("=")[0].strip() in ("data", f"data.{f}")}
        named |= {"data.prompts"} if prompts else set()  # --prompts replaces the plan's own file
        check_confined(workload.data, workload.base_dir, plan_path, sorted(named))
    for option, (path, kind) in outputs.items():
        check_writable(option, path, kind)
    check_generation_backend(backend, plan_path)
    from hetprof.executor.runners.rewards import get_reward, needs_answers

    check_prompts(workload, prompts, seed, answers_for=reward if needs_answers(get_reward(reward)) else None)


def check_writable(option: str, path: str | None, kind: str) -> None:
    """`path` (a "file" or a "folder") can be created or written; the nearest existing folder decides."""
    if not path:
        return
    target = Path(path)
    problem = None
    if target.exists():
        if kind == "file" and target.is_dir():
            problem = "it is a folder"
        elif kind == "folder" and not target.is_dir():
            problem = "it is a file"
        elif not os.access(target, os.W_OK):
            problem = "it is not writable"
    else:
        parent = target.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            problem = f"{parent} is a file, not a folder"
        elif not os.access(parent, os.W_OK | os.X_OK):
            problem = f"{parent} is not writable"
    if problem:
        raise HetprofError(f"{option} {path}: cannot write there ({problem})")


def check_generation_backend(backend: str, plan_path: str | Path) -> None:
    """The backend is registered and its engine's package importable in this Python.

    A built-in backend is hetprof's own module: its name is checked, not imported — importing the hf
    engine brings in transformers' modeling stack (seconds of CPU), which only the workers need. A
    plugin's entry point is loaded, so a broken one is named here rather than in every worker."""
    import importlib.util

    from hetprof.executor.backends import BACKENDS, get_backend

    if backend not in BACKENDS.builtins:
        get_backend(backend)  # an unknown name is refused listing the names there are
    package = BACKEND_PACKAGES.get(backend)
    if package and importlib.util.find_spec(package) is None:
        raise HetprofError(f"{plan_path} runs the {backend} generation backend, but {package} is not installed in "
                           f"this Python (pip install 'hetprof[{backend}]'), or replan with `hetprof plan --backend hf`")


BACKEND_PACKAGES = {"vllm": "vllm"}  # engines that live in an optional package


def check_prompts(workload: WorkloadSpec, prompts: str | None, seed: int, answers_for: str | None = None) -> None:
    """Read every prompt (and validation prompt) as the workers will, and render one in the chat
    template; with `answers_for` (a reward that scores against answers) every prompt must have one."""
    from hetprof.executor.models.model_ref import model_ref
    from hetprof.executor.models.tokenizer import load_tokenizer
    from hetprof.executor.prompts.data import encode_prompt
    from hetprof.executor.prompts.prompt_files import prompt_sets
    from hetprof.specs.vocabulary import Role

    sets = prompt_sets(workload.data, workload.base_dir, prompts, seed, answers_for)
    tokenizer = load_tokenizer(model_ref(workload, Role.ACTOR))
    check_prompt_lengths(workload, [*sets.train, *sets.validation],
                         lambda prompt: encode_prompt(tokenizer, prompt, workload.data.chat_template))


TOKENIZER_SLACK = 8  # tokens a tokenizer may add that cover no byte of the text (a leading "▁", say)


def check_prompt_lengths(workload: WorkloadSpec, prompts: Sequence[Prompt],
                         encode: Callable[[Prompt], list[int]]) -> None:
    """Each prompt as sent (chat template included) plus response_len.max fits the positions of the
    models that read it; the generator would refuse it mid-run. A token covers at least one UTF-8
    byte of the text, so only prompts whose bytes come near the limit are encoded (large sets stay fast)."""
    shapes = workload.roles()
    limit = min(shapes[role].max_position for role in ("actor", "reference", "critic") if role in shapes)
    cap = workload.response_len.cap
    room = limit - cap
    overhead = len(encode(Prompt(""))) + TOKENIZER_SLACK  # a turn's template tokens and BOS
    for prompt in prompts:
        if len(prompt.text.encode("utf-8")) + overhead * max(1, len(prompt.messages)) <= room:
            continue
        tokens = len(encode(prompt))
        if tokens > room:
            raise HetprofError(f"{prompt.source or 'a prompt'}: the prompt's {tokens} tokens + response_len.max {cap} "
                               f"exceed the model's {limit} positions (max_position_embeddings); shorten or drop "
                               f"that prompt, or lower response_len.max")
