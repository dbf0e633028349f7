"""The models and RL-library objects one rank holds for the tasks the plan put on its device.

A rank builds only what its tasks need (a generator never builds an optimizer, an inference rank
never builds the actor), so a device's memory holds what the planner's memory model counted. All
models are seeded the same way on every rank, and the runtime's first weight sync makes the
generators' copy of the actor equal to the trainer's whatever the initialisation did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from hetprof.errors import ExecutionError
from hetprof.executor.models.modeling import (
    build_causal_lm,
    build_reward_model,
    build_value_model,
    torch_dtype,
    unwrap,
)
from hetprof.executor.models.tokenizer import load_tokenizer
from hetprof.executor.options import RunOptions
from hetprof.executor.parallel.process_groups import ProcessGroups
from hetprof.executor.parallel.sharded import ShardedModel
from hetprof.executor.parallel.tensorpar import is_sharded, load_full
from hetprof.executor.parallel.topology import Topology
from hetprof.executor.parallel.weightsync import flatten_params
from hetprof.executor.prompts.data import Prompt, PromptSource, encode_prompt
from hetprof.runtime.dataparallel import wrap_replica
from hetprof.specs import WorkloadSpec
from hetprof.specs.models import PRESETS
from hetprof.specs.vocabulary import Role, Task

# The RLBatch fields that travel to training replicas (None fields are left out).
BATCH_FIELDS = ("input_ids", "attention_mask", "mask", "rewards", "behaviour_logprobs", "ref_logprobs",
                "proximal_logprobs", "values", "advantages", "returns", "versions")


def model_ref(workload: WorkloadSpec, role: str) -> str:
    """A preset name, or the absolute path of a local HF model (relative to the workload file)."""
    ref = getattr(workload.models, role) or workload.models.actor
    if ref.strip().lower() in PRESETS:
        return ref.strip().lower()
    path = Path(ref)
    if not path.is_absolute() and workload.base_dir:
        path = Path(workload.base_dir) / path
    return str(path)


class RankModels:
    """Models, optimizers and library objects for the tasks on one rank."""

    def __init__(self, workload: WorkloadSpec, tasks: list[str], device: torch.device, options: RunOptions,
                 topo: Topology, groups: ProcessGroups, rank: int):
        from hetprof.executor.algorithms import AlgorithmConfig, get_algorithm
        from hetprof.executor.backends import get_backend

        self.workload = workload
        self.tasks = tasks
        self.device = device
        self.opts = options
        self.topo = topo
        self.groups = groups
        self.rank = rank
        self.console = Console()
        self.training = workload.training
        actor = model_ref(workload, Role.ACTOR)
        self.tokenizer = load_tokenizer(actor)
        self.pad_id = self.tokenizer.pad_id
        # Masters and optimizer state in fp32; generation and inference in the workload's precision
        # on GPUs (CPUs compute in fp32: bf16 matmuls there are emulated and slow).
        self.train_dtype = torch.float32
        self.infer_dtype = torch.float32 if device.type == "cpu" else torch_dtype(workload.precision)
        self.wire_dtype = self.infer_dtype if self.infer_dtype != self.train_dtype else None
        t = workload.training
        self.algorithm = get_algorithm(workload.algorithm)(AlgorithmConfig(
            clip_eps=t.clip_eps, kl_coef=t.kl_coef, gamma=t.gamma, lam=t.lam))
        self.async_k = workload.staleness if workload.mode == "async" else 0
        seed = options.seed
        self.source = self._prompt_source()
        self.models: dict[str, torch.nn.Module] = {}
        self.learners: dict[str, Any] = {}
        self.sharded: dict[str, ShardedModel] = {}  # tasks this rank runs tensor- or pipeline-parallel
        if Task.ACTOR_GEN in tasks:
            model = build_causal_lm(actor, seed=seed, dtype=self.infer_dtype, device=device)
            self.models[Task.ACTOR_GEN] = self._place(Task.ACTOR_GEN, model, head="lm")
            self.backend = get_backend(options.backend)(self.models[Task.ACTOR_GEN], self.tokenizer, device)
        if Task.REF_INFER in tasks:
            model = build_causal_lm(model_ref(workload, Role.REFERENCE), seed=seed, dtype=self.infer_dtype,
                                    device=device).eval()
            self.models[Task.REF_INFER] = self._place(Task.REF_INFER, model, head="lm", flatten=False)
        if Task.CRITIC_INFER in tasks:
            model = build_value_model(model_ref(workload, Role.CRITIC), seed=seed + 1, dtype=self.infer_dtype,
                                      device=device).eval()
            self.models[Task.CRITIC_INFER] = self._place(Task.CRITIC_INFER, model, head="value")
        if Task.REWARD_INFER in tasks:
            from hetprof.executor.runners.rewards import RewardModelScorer

            rm = build_reward_model(model_ref(workload, Role.REWARD), seed=seed + 2, dtype=self.infer_dtype,
                                    device=device).eval()
            self.models[Task.REWARD_INFER] = self._place(Task.REWARD_INFER, rm, head="value", flatten=False)
            self.reward_model = RewardModelScorer(rm, self.tokenizer, device)
        if Task.ACTOR_TRAIN in tasks:
            model = build_causal_lm(actor, seed=seed, dtype=self.train_dtype, device=device)
            self._add_learner(Task.ACTOR_TRAIN, model, self.training.lr)
        if Task.CRITIC_TRAIN in tasks:
            model = build_value_model(model_ref(workload, Role.CRITIC), seed=seed + 1, dtype=self.train_dtype,
                                      device=device)
            self._add_learner(Task.CRITIC_TRAIN, model, self.training.critic_lr)
        from hetprof.executor.runners.rewards import get_reward

        self.reward_fn = get_reward(options.reward)

    def _place(self, task: str, model: torch.nn.Module, head: str, flatten: bool = True) -> torch.nn.Module:
        """Shard a generation/inference model over its replica's TP ranks and pipeline stages, or
        (one device) lay its weights out flat so weight syncs land in place."""
        tr = self.topo.tasks[task]
        if tr.tp_of(tr.replica_of(self.rank)) > 1 or tr.pp > 1:  # this rank's replica is TP- or PP-sharded
            self.sharded[task] = ShardedModel(model, self.topo, self.groups, task, self.rank, self.device, head)
            return self.sharded[task].module
        if flatten:
            flatten_params(model, self.opts.bucket_mb)
        return model

    def _prompt_source(self) -> PromptSource:
        from hetprof.executor.prompts.prompt_files import prompt_sets

        sets = prompt_sets(self.workload.data, self.workload.base_dir, self.opts.prompts, self.opts.seed)
        self.validation_prompts = sets.validation
        return PromptSource(sets.train, self.workload.prompts_per_step, seed=self.opts.seed)

    def _add_learner(self, task: str, model: torch.nn.Module, lr: float) -> None:
        from hetprof.executor.algorithms.learner import Learner

        group = self.groups.replicas(task)
        tr = self.topo.tasks[task]
        ranks = tr.ranks
        sharded = None
        if tr.tp > 1 or tr.pp > 1:
            # TP/PP: torch's tensor-parallel API and pipeline stages, data parallelism by an explicit
            # gradient average over the replicas (parallel.py says why not DDP/FSDP here).
            sharded = self.sharded[task] = ShardedModel(model, self.topo, self.groups, task, self.rank, self.device,
                                                        head="lm" if task == Task.ACTOR_TRAIN else "value")
            wrapped = model = sharded.module
        else:
            # the plan's sharding (DDP or FSDP2, dataparallel.py); a sharded model's weights are DTensors
            sharding = tr.sharding if len(ranks) > 1 else "none"
            if sharding == "none" and (self.device.type == "cpu" or len(ranks) == 1):
                flatten_params(model, self.opts.bucket_mb)  # syncs broadcast straight from the weights
            wrapped = model
            if len(ranks) > 1:
                wrapped = wrap_replica(model, group, self.device, sharding)
        from hetprof.executor.algorithms.optimizer import build_optimizer, build_scheduler, optimizer_steps

        settings = self.workload.optimizer
        optimizer = build_optimizer(model.parameters(), lr, settings)
        scheduler = build_scheduler(optimizer, settings, optimizer_steps(self.workload, self.opts.iterations))
        self.models[task] = wrapped
        # The plan's log-prob pass (actor_logprob, on these ranks) runs as its own forward pass before
        # the advantages (proximal_logprobs) and hands the learner π_prox on the batch; the learner
        # recomputes it only for a batch that lacks it, and without the pass π_behav serves.
        self.learners[task] = Learner(wrapped, optimizer, self.algorithm, ppo_epochs=self.workload.ppo_epochs,
                                      mini_batches=self.workload.mini_batches,
                                      role=Role.ACTOR if task == Task.ACTOR_TRAIN else Role.CRITIC,
                                      temperature=self.training.temperature,
                                      recompute_proximal=Task.ACTOR_LOGPROB in self.tasks,
                                      seed=self.opts.seed, parallel=sharded, lr_scheduler=scheduler,
                                      max_grad_norm=settings.max_grad_norm,
                                      process_group=group if sharded is None and len(ranks) > 1 else None,
                                      max_tokens_per_microbatch=self.training.max_tokens_per_microbatch)

    # ---- data --------------------------------------------------------------------------------
    def prompts(self, batch: int) -> list[Prompt]:
        return self.source.batch(batch)

    # ---- generation ----------------------------------------------------------------------------
    def generate(self, prompts: list[Prompt], batch: int, replica: int, version: int) -> dict[str, torch.Tensor]:
        n = self.workload.responses_per_prompt
        ids = [encode_prompt(self.tokenizer, p, self.workload.data.chat_template) for p in prompts for _ in range(n)]
        gen = torch.Generator(device=self.device)
        gen.manual_seed(hash_seed(self.opts.seed, batch, replica))
        out = self.backend.generate(ids, self.workload.response_len.cap, temperature=self.training.temperature,
                                    top_p=self.training.top_p, generator=gen)
        return {"input_ids": out.input_ids, "attention_mask": out.attention_mask,
                "response_mask": out.response_mask, "logprobs": out.logprobs.float(),
                "version": torch.full((len(ids),), version, dtype=torch.long)}

    # ---- inference -----------------------------------------------------------------------------
    def proximal_logprobs(self, part: dict[str, torch.Tensor]) -> torch.Tensor:
        """π_prox over a replica's rows: the actor trainer's own module before this iteration's update
        (every rank of the replica takes part: its TP shards and pipeline stages compute together)."""
        from hetprof.executor.algorithms import RLBatch

        ids = part["input_ids"]
        mask = part["response_mask"][:, 1:]
        rows = RLBatch(input_ids=ids, attention_mask=part["attention_mask"], mask=mask,
                       rewards=mask.new_zeros(len(ids), dtype=torch.float32),
                       behaviour_logprobs=mask.new_zeros(mask.shape, dtype=torch.float32))
        return self.learners[Task.ACTOR_TRAIN].proximal_logprobs(rows).float()

    @torch.no_grad()
    def infer(self, task: str, part: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        from hetprof.executor.models.logprobs import token_logprobs
        from hetprof.runtime.packedpass import logits_to_logprobs

        ids, mask = part["input_ids"], part["attention_mask"]
        if task == Task.ACTOR_LOGPROB:
            return {"proximal_logprobs": self.proximal_logprobs(part)}
        pipe = self.sharded[task].pipeline if task in self.sharded else None
        if pipe is not None:  # every stage runs the schedule; the last stage's output reaches all
            out = pipe.forward(ids, mask)
            if task == Task.REF_INFER:
                return {"ref_logprobs": logits_to_logprobs(out[:, :-1], ids[:, 1:], self.training.temperature)}
            if task == Task.REWARD_INFER:  # the score at each sequence's last attended token
                t = torch.arange(mask.shape[1], device=mask.device)
                last = (mask.bool() * t).amax(dim=1)
                return {"rm_scores": out.gather(1, last[:, None]).squeeze(1).float()}
            raise ExecutionError(f"task {task}: no pipelined inference for it")
        budget = self.training.max_tokens_per_microbatch
        if budget is not None:  # packed passes of at most `budget` tokens (executor/models/packing.py)
            return self._infer_packed(task, ids, mask, budget, part.get("response_mask"))
        if task == Task.REF_INFER:
            lp = token_logprobs(self.models[task], ids, mask, temperature=self.training.temperature)
            return {"ref_logprobs": lp.float()}
        if task == Task.CRITIC_INFER:  # values in the trainer's shifted space (column t: state before token t+1)
            return {"values": self.models[task](ids, mask)[:, :-1].float()}
        if task == Task.REWARD_INFER:
            return {"rm_scores": self.reward_model.score_ids(ids, mask).float()}
        raise ExecutionError(f"no inference role for task {task}")

    def _infer_packed(self, task: str, ids: torch.Tensor, mask: torch.Tensor, budget: int,
                      response_mask: torch.Tensor | None) -> dict[str, torch.Tensor]:
        from hetprof.executor.models.packing import packed_sequence_scores, packed_values
        from hetprof.runtime.packedpass import packed_token_logprobs

        if task == Task.REF_INFER:
            # only response columns are read (KL terms), so the LM head skips the prompts
            needed = response_mask[:, 1:] if response_mask is not None else None
            lp = packed_token_logprobs(self.models[task], ids, mask, self.training.temperature, max_tokens=budget,
                                       needed=needed)
            return {"ref_logprobs": lp.float()}
        if task == Task.CRITIC_INFER:
            return {"values": packed_values(self.models[task], ids, mask, budget)[:, :-1].float()}
        if task == Task.REWARD_INFER:
            scorer = self.reward_model
            scores = packed_sequence_scores(scorer.model, ids.to(scorer.device), mask.to(scorer.device), budget)
            return {"rm_scores": scores.float()}
        raise ExecutionError(f"no inference role for task {task}")

    # ---- the leader's part ---------------------------------------------------------------------
    def score(self, batch: dict[str, torch.Tensor], prompts: list[Prompt]) -> dict[str, torch.Tensor]:
        """Rewards per sequence: the rule (or user) reward, plus the reward model's score if planned."""
        texts, responses, answers = [], [], []
        for row, rmask, idx in zip(batch["input_ids"].tolist(), batch["response_mask"].tolist(),
                                   batch["prompt_index"].tolist(), strict=True):
            resp = [t for t, m in zip(row, rmask, strict=True) if m]
            responses.append(self.tokenizer.decode(resp))
            texts.append(prompts[idx].text)
            answers.append(prompts[idx].answer)
        rewards = torch.tensor(self.reward_fn(texts, responses, answers), dtype=torch.float32)
        if "rm_scores" in batch:
            rewards = rewards + batch["rm_scores"].float()
        return {**batch, "rewards": rewards}

    def advantages(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The algorithm's advantages (and PPO returns) over the whole batch, as RLBatch fields."""
        from hetprof.executor.algorithms import RLBatch

        rl = RLBatch(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     mask=batch["response_mask"][:, 1:], rewards=batch["rewards"],
                     behaviour_logprobs=batch["logprobs"][:, 1:], group_size=self.workload.responses_per_prompt,
                     ref_logprobs=batch.get("ref_logprobs"), proximal_logprobs=batch.get("proximal_logprobs"),
                     values=batch.get("values"),
                     versions=batch["version"])
        self.algorithm.advantages(rl)
        return {f: getattr(rl, f) for f in BATCH_FIELDS if getattr(rl, f) is not None}

    # ---- training ------------------------------------------------------------------------------
    def train(self, task: str, part: dict[str, torch.Tensor]) -> dict[str, float]:
        from hetprof.executor.algorithms import RLBatch

        rl = RLBatch(**part, group_size=self.workload.responses_per_prompt)
        return self.learners[task].update(rl)

    # ---- weights -------------------------------------------------------------------------------
    def full_weights(self, role: str) -> dict[str, torch.Tensor] | None:
        """Every replica of a sharded (FSDP) trainer must take part in gathering the full weights
        before its lead can broadcast them; DDP replicas hold full copies and skip this."""
        task = Task.ACTOR_TRAIN if role == Role.ACTOR else Task.CRITIC_TRAIN
        if task in self.sharded:  # TP/PP: replica 0's ranks gather, its first rank gets the result
            return self.sharded[task].full_state()
        model = self.models.get(task)
        if model is None or not _is_sharded(model):
            return None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        # the parameters the sync manifest names: a tied LM head appears in the state dict twice
        names = {n for n, _ in unwrap(model).named_parameters()}
        return {n: t for n, t in state.items() if n in names}

    def close(self) -> None:
        """Release what the generation engine holds (vLLM's engine processes)."""
        backend = getattr(self, "backend", None)
        if backend is not None:
            backend.close()

    def weights_arrived(self, role: str) -> dict[str, float]:
        """After a sync of `role` landed on this rank: the generation engine takes the new weights
        (an engine with its own copy, vLLM, loads and checks them); returns its checks."""
        if role != Role.ACTOR or Task.ACTOR_GEN not in self.models:
            return {}
        return self.backend.weights_arrived()

    def holds_receiver(self, role: str) -> bool:
        """Whether this rank holds a copy a sync must overwrite (a separate module from the trainer's)."""
        name = Task.ACTOR_GEN if role == Role.ACTOR else Task.CRITIC_INFER
        trainer = self.models.get(Task.ACTOR_TRAIN if role == Role.ACTOR else Task.CRITIC_TRAIN)
        return name in self.models and (trainer is None or unwrap(trainer) is not unwrap(self.models[name]))

    def model_for_sync(self, role: str, sender: bool) -> torch.nn.Module:
        """The module whose parameters a sync edge sends (trainer) or overwrites (generator/inference)."""
        if role == Role.ACTOR:
            name = Task.ACTOR_TRAIN if sender else Task.ACTOR_GEN
        else:
            name = Task.CRITIC_TRAIN if sender else Task.CRITIC_INFER
        if name not in self.models:
            raise ExecutionError(f"weight sync: this rank holds no {name} model")
        if name in self.sharded:  # full names and shapes (a pipeline stage's meta skeleton)
            return self.sharded[name].reference
        return unwrap(self.models[name])

    def sync_target(self, role: str) -> torch.nn.Module:
        """The module a received sync lands in (its flattened buckets are written in place)."""
        return unwrap(self.models[Task.ACTOR_GEN if role == Role.ACTOR else Task.CRITIC_INFER])

    def apply_weights(self, role: str):
        target = self.sync_target(role)
        if is_sharded(target):
            return load_full(target)  # each TP rank keeps its shard of the full tensors
        if role == Role.ACTOR:
            return self.backend.load_weights
        params = dict(unwrap(self.models[Task.CRITIC_INFER]).named_parameters())

        def apply(state: dict[str, torch.Tensor]) -> None:
            with torch.no_grad():
                for name, tensor in state.items():
                    params[name].copy_(tensor)

        return apply

    # ---- checkpoints ---------------------------------------------------------------------------
    def trained_units(self, lead_only: bool) -> list[str]:
        """Checkpoint units on this rank: a training task, or for a TP/PP task one unit per (stage,
        TP position) such as "actor_train/stage1-tp0" (its own directory). Replica 0 writes each
        unit (`lead_only`); every replica loads the unit of its position."""
        units = []
        for t in (Task.ACTOR_TRAIN, Task.CRITIC_TRAIN):
            if t not in self.learners:
                continue
            if t in self.sharded:
                pos = self.sharded[t].pos
                if not lead_only or pos.replica == 0:
                    units.append(f"{t}/{pos.unit}")
            elif not lead_only or self.topo.tasks[t].lead == self.rank:
                units.append(t)
        return units

    def gathers_state(self, unit: str) -> bool:
        """Whether taking a unit's state is a collective of its replicas (an FSDP-sharded trainer)."""
        task = unit.split("/")[0]
        return task not in self.sharded and _is_sharded(self.models[task])

    def state(self, unit: str) -> dict[str, Any]:
        """A unit's model and optimizer state; an FSDP-sharded trainer gathers the full state, so
        every replica must call this (a collective), though only the lead writes it."""
        task = unit.split("/")[0]
        if task in self.sharded:
            return self.sharded[task].local_state(self.learners[task].optimizer)
        model, optimizer = self.models[task], self.learners[task].optimizer
        if _is_sharded(model):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

            weights, moments = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
            return {"model": weights, "optimizer": moments}
        return {"model": unwrap(model).state_dict(), "optimizer": optimizer.state_dict()}

    def load_state(self, unit: str, state: dict[str, Any]) -> None:
        task = unit.split("/")[0]
        if task in self.sharded:
            self.sharded[task].load_local_state(self.learners[task].optimizer, state)
            return
        model, optimizer = self.models[task], self.learners[task].optimizer
        if _is_sharded(model):  # every replica reads the full state and keeps its shard
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                           options=StateDictOptions(full_state_dict=True))
            return
        unwrap(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])


def _is_sharded(model: torch.nn.Module) -> bool:
    return any(hasattr(p, "full_tensor") for p in model.parameters())


def hash_seed(*parts: int) -> int:
    """A 63-bit seed from integers: the same (seed, batch, replica) samples the same on any run."""
    value = 0x9E3779B97F4A7C15
    for p in parts:
        value = (value * 6364136223846793005 + int(p) + 1442695040888963407) % (1 << 63)
    return value
