"""One worker of a run: walks the plan's RL iteration for the tasks placed on its device.

Every rank walks the same static loop (staleness.schedule) and, within a loop step, the same phase
order — generate, each inference task, reward + advantages, each training task, weight sync — so
the collectives of different groups line up without a coordinator; each rank then sends its report
of the iteration to the leader without waiting. Data moves between task
leaders as tensor dicts (non-blocking sends, blocking receives): a rank only ever waits for data that
an earlier phase produces, so the order cannot deadlock, and generators on their own devices run
the next batch while the trainers work on the previous one (async mode, k ≥ 1).

The leader (actor_train's replica 0) assembles each batch, scores rewards, computes advantages,
splits the batch over the training replicas by the plan's shares, and records the iteration.
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import signal
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from hetprof.errors import ExecutionError
from hetprof.executor import checkpoint
from hetprof.executor.groups import Outbox, Topology, check_supported, device_kind, host_devices, recv_tensors
from hetprof.executor.launch import RunOptions, load_plan
from hetprof.executor.records import (
    DBWriter,
    RunLog,
    console_line,
    dtype_name,
    gather_phase_times,
    plan_hash,
    train_phase,
    work_description,
)
from hetprof.executor.roles import RoleSet
from hetprof.executor.shares import offsets, split_counts
from hetprof.executor.staleness import VersionCounter, schedule
from hetprof.executor.weightsync import WeightSync, state_digest
from hetprof.hostmemory import keep_freed_memory

# Message kinds; a tag is batch * KINDS + kind, so batches in flight (async) never mix.
KINDS = 16
ROLLOUT, TRAIN_IN, CRITIC_IN = 1, 2, 3
INFER_IN = {"ref_infer": 4, "reward_infer": 5, "critic_infer": 6}
INFER_OUT = {"ref_infer": 7, "reward_infer": 8, "critic_infer": 9}
REPORT = 10
PAD_KEYS = ("input_ids", "attention_mask", "response_mask", "logprobs")


def tag(batch: int, kind: int) -> int:
    return batch * KINDS + kind


def pad_cat(parts: list[dict[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """Concatenate replica batches whose sequence lengths differ: right-pad [B, T] tensors."""
    parts = [p for p in parts if p]
    if not parts:
        return {}
    width = {k: max(p[k].shape[1] for p in parts) for k in parts[0] if parts[0][k].dim() == 2}
    out = {}
    for key in parts[0]:
        if key in width:
            fill = pad_id if key == "input_ids" else 0
            out[key] = torch.cat([torch.nn.functional.pad(p[key], (0, width[key] - p[key].shape[1]), value=fill)
                                  for p in parts])
        else:
            out[key] = torch.cat([p[key] for p in parts])
    return out


def take(batch: dict[str, torch.Tensor], keys: tuple[str, ...], rows: slice) -> dict[str, torch.Tensor]:
    return {k: batch[k][rows] for k in keys if k in batch}


class Laps:
    """Wall time between successive calls, by name (a phase's time includes its waits)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._mark = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._mark
        self._mark = now


class Worker:
    """The tasks of one rank and the loop that runs them."""

    def __init__(self, options: RunOptions, topo: Topology, rank: int, device: torch.device):
        self.opts = options
        self.topo = topo
        self.plan = topo.plan
        self.workload = self.plan.workload_spec()
        self.rank = rank
        self.device = device
        self.device_id = topo.device_of[rank]
        self.k = self.workload.staleness if self.workload.mode == "async" else 0
        self.tasks = topo.tasks_on(rank)
        self.leader = topo.leader
        self.is_leader = rank == self.leader
        self.roles = RoleSet(self.workload, self.tasks, device, options, topo, rank)
        self.msg_group = topo.groups.get("messages")
        self.msg_device = torch.device("cpu") if self.msg_group is not None else device
        self.outbox = Outbox(options.timeout_s, self.msg_group)
        self.report_group = topo.groups.get("reports")
        self.reports = Outbox(options.timeout_s, self.report_group)
        self.version = 0  # generator: weight version held; leader: optimizer iterations applied
        self.actor_sync = self._make_sync("weight_sync", "actor")
        self.critic_sync = self._make_sync("critic_sync", "critic")
        self.hash = plan_hash(self.plan)
        self.work = work_description(self.plan)
        kinds = {t.task: t.kind for t in self.plan.tasks}
        device_types = {d.id: d.type for d in self.plan.cluster_spec().devices()}
        self.phase_meta = {"device_type": device_types.get(self.device_id), "threads": torch.get_num_threads(),
                           "dtypes": {task: dtype_name(self.roles.train_dtype if kinds.get(task) == "training"
                                                       else self.roles.infer_dtype) for task in self.tasks}}
        self.run_name = f"run-{self.hash[:8]}-{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M%S}"
        self.log = RunLog(options.log) if self.is_leader else None
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hetprof-records")
        self.db_writer = DBWriter(options.db) if self.is_leader and options.db else None
        self._pending: list[Future] = []

    # ---- setup -------------------------------------------------------------------------------
    def _make_sync(self, group: str, role: str) -> WeightSync | None:
        members = self.topo.sync_members(group)
        if self.rank not in members:
            return None
        src = self.topo.sync_source(group)
        model = self.roles.model_for_sync(role, sender=self.rank == src)
        return WeightSync(self.topo.groups[group], src, model.named_parameters(), self.opts.bucket_mb,
                          device=self.device, wire_dtype=self.roles.wire_dtype, timeout_s=self.opts.timeout_s,
                          members="; ".join(self.topo.describe(r) for r in members if r != src))

    def _resume_point(self) -> int:
        """Iteration to start at (0, or the last committed checkpoint's); the leader decides for all."""
        box: list[Any] = [None]
        if self.is_leader:
            start, run = 0, self.run_name
            if self.opts.resume:
                meta = checkpoint.committed(self.opts.checkpoint_dir)
                if meta is None:
                    box[0] = {"error": f"--resume: no complete checkpoint under {self.opts.checkpoint_dir}"}
                elif meta.get("plan_hash") != self.hash:
                    box[0] = {"error": f"--resume: the checkpoint under {self.opts.checkpoint_dir} was made "
                                       f"for plan {meta.get('plan_hash')}, not this plan ({self.hash})"}
                else:
                    start, run = int(meta["iteration"]), meta["run"]
            box[0] = box[0] or {"start": start, "run": run}
        dist.broadcast_object_list(box, src=self.leader)
        if "error" in box[0]:
            raise ExecutionError(box[0]["error"])
        self.run_name = box[0]["run"]
        return int(box[0]["start"])

    def _load_checkpoint(self, start: int) -> None:
        for task in self.roles.trained_tasks(lead_only=False):
            path = checkpoint.task_dir(self.opts.checkpoint_dir, task) / f"iter-{start:06d}"
            state, _ = checkpoint.load(path, map_location=self.device)
            self.roles.load_state(task, state)

    def _save_checkpoint(self, iteration: int) -> bool:
        saved = False
        for task in self.roles.trained_tasks(lead_only=True):
            checkpoint.save(checkpoint.task_dir(self.opts.checkpoint_dir, task), iteration,
                            self.roles.state(task), {"plan_hash": self.hash, "run": self.run_name, "task": task})
            saved = True
        return saved

    # ---- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        start = self._resume_point()
        if start and self.opts.resume:
            self._load_checkpoint(start)
        if start >= self.opts.iterations:
            if self.is_leader and not self.opts.quiet:
                self.roles.console.print(f"nothing to do: the checkpoint is at iteration {start} "
                                         f"(--iterations {self.opts.iterations})")
            return
        self.version = start
        counter = VersionCounter(start, self.k)
        self._sync(start)  # generators start from the trainer's weights, fresh or resumed
        last = time.perf_counter()
        for step in schedule(start, self.opts.iterations, self.k):
            times: dict[str, float] = {}
            info: dict[str, Any] = {"rank": self.rank, "device": self.device_id, "pid": os.getpid(),
                                    "phase_meta": self.phase_meta}
            # Wall time of each phase on this rank, waits included: where the leader's iteration
            # went beyond the stages' compute (the executor's own overhead) shows up here.
            lap = Laps()

            if step.generate is not None and "actor_gen" in self.tasks:
                self._generate(step.generate, times, info)
                lap("generate")
            if step.consume is not None:
                b = step.consume
                batch = self._assemble(b, times) if self.is_leader else None
                lap("collect_rollouts")
                for task in self.topo.inference_tasks():
                    batch = self._infer(task.task, b, batch, times, info)
                    lap(task.task)
                if self.is_leader:
                    batch = self._score(b, batch, counter, times, info)
                    lap("reward_advantage")
                self._train(b, batch, times, info)
                lap("train")
                if self.is_leader:
                    counter.advance()
                self._sync(b + 1, times, info)
                lap("sync")
                if self.opts.checkpoint_dir and ((b + 1) % self.opts.checkpoint_every == 0
                                                 or b + 1 == self.opts.iterations):
                    info["saved"] = self._save_checkpoint(b + 1)
                    lap("checkpoint")
            info["times"] = times
            info["phases"] = dict(lap.seconds)
            now = time.perf_counter()
            if step.consume is not None:
                self._report(step.consume, now - last, info)
            last = now
        self.outbox.flush()
        self.reports.flush()
        if self.db_writer is not None:
            self._pending.append(self.writer.submit(self.db_writer.close))
        self.writer.shutdown(wait=True)
        for f in self._pending:
            f.result()  # a failed write (disk full, locked database) fails the run visibly

    # ---- phases ------------------------------------------------------------------------------
    def _recv(self, src: int, tag_: int, what: str, reports: bool = False) -> dict[str, torch.Tensor]:
        """Receive from a peer (a loop message, or with `reports` an iteration report, kept on the
        CPU); a dead or hung peer becomes an error that names it."""
        try:
            if reports:
                return recv_tensors(src, tag_, torch.device("cpu"), self.report_group)
            got = recv_tensors(src, tag_, self.msg_device, self.msg_group)
            return {k: v.to(self.device) for k, v in got.items()}
        except (RuntimeError, dist.DistError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ExecutionError(f"{self.topo.describe(self.rank)} got no {what} from {self.topo.describe(src)}: "
                                 f"{first}") from None

    def _generate(self, b: int, times: dict, info: dict) -> None:
        """Generate this replica's prompts; the TP ranks of a replica all run it (same seed, same
        tokens) and its first rank sends the rollout to the leader."""
        gen = self.topo.tasks["actor_gen"]
        replica = gen.replica_of(self.rank)
        prompts = self.roles.prompts(b)
        counts = split_counts(len(prompts), gen.shares, minimum=1)
        mine = offsets(counts)[replica]
        t0 = time.perf_counter()
        out = self.roles.generate(prompts[mine], b, replica, self.version)
        out["prompt_index"] = torch.arange(mine.start, mine.stop).repeat_interleave(
            self.workload.responses_per_prompt)
        times["actor_gen"] = time.perf_counter() - t0
        if self.rank != gen.ranks[replica]:
            return
        info["gen_tokens"] = int(out["response_mask"].sum())
        info.setdefault("phase_times", {})["actor_gen"] = list(getattr(self.roles.backend, "last_phases", []))
        if self.is_leader:
            self._own_rollout = out
        else:
            self.outbox.send(out, self.leader, tag(b, ROLLOUT), self.msg_device)

    def _assemble(self, b: int, times: dict) -> dict[str, torch.Tensor]:
        t0 = time.perf_counter()
        parts = []
        for r in self.topo.tasks["actor_gen"].ranks:
            parts.append(self._own_rollout if r == self.rank else self._recv(r, tag(b, ROLLOUT), f"rollouts of batch {b}"))
        times["wait_rollouts"] = time.perf_counter() - t0
        return pad_cat(parts, self.roles.pad_id)

    def _infer(self, task: str, b: int, batch: dict | None, times: dict, info: dict) -> dict | None:
        """Scatter the batch over the task's replicas by share (every TP rank of a replica gets its
        slice), compute, and gather the replicas' results (from each replica's first rank)."""
        tr = self.topo.tasks[task]
        keys = ("input_ids", "attention_mask", "response_mask")
        replicas = tr.tp_ranks or tuple((r,) for r in tr.ranks)
        if self.is_leader:
            counts = split_counts(batch["input_ids"].shape[0], tr.shares, minimum=1)
            slices = offsets(counts)
            for members, rows in zip(replicas, slices, strict=True):
                for r in members:
                    if r != self.rank:
                        self.outbox.send(take(batch, keys, rows), r, tag(b, INFER_IN[task]), self.msg_device)
        result = None
        if self.rank in tr.all_ranks:
            replica = tr.replica_of(self.rank)
            if self.is_leader:
                part = take(batch, keys, slices[replica])
            else:
                part = self._recv(self.leader, tag(b, INFER_IN[task]), f"{task} inputs of batch {b}")
            t0 = time.perf_counter()
            result = self.roles.infer(task, part)
            times[task] = time.perf_counter() - t0
            if self.rank == tr.ranks[replica]:  # one forward over the slice: a prefill row with its head
                rows, width = part["input_ids"].shape
                info.setdefault("phase_times", {})[task] = [
                    {"kind": "prefill", "batch": rows, "tokens": width, "seconds": times[task], "with_head": True}]
            if not self.is_leader and self.rank == tr.ranks[replica]:
                self.outbox.send(result, self.leader, tag(b, INFER_OUT[task]), self.msg_device)
        if self.is_leader:
            results = [result if r == self.rank else self._recv(r, tag(b, INFER_OUT[task]), f"{task} results of batch {b}")
                       for r in tr.ranks]
            merged = pad_cat(results, 0)
            batch = {**batch, **merged}
        return batch

    def _score(self, b: int, batch: dict, counter: VersionCounter, times: dict, info: dict) -> dict:
        t0 = time.perf_counter()
        ages = counter.staleness(batch["version"].tolist())
        info["staleness_max"] = max(ages)
        info["staleness_mean"] = sum(ages) / len(ages)
        info["tokens"] = int(batch["response_mask"].sum())
        resp = batch["response_mask"].sum(1).float()
        info["prompt_tokens_mean"] = float((batch["attention_mask"].sum(1).float() - resp).mean())
        info["response_tokens_mean"] = float(resp.mean())
        self._check_lengths(info)
        batch = self.roles.score(batch, self.roles.prompts(b))
        info["reward_mean"] = float(batch["rewards"].mean())
        times["reward"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        batch = self.roles.advantages(batch)
        times["advantage"] = time.perf_counter() - t0
        return batch

    def _check_lengths(self, info: dict) -> None:
        """Say once when the data's lengths are far from the workload's: the plan was predicted for those."""
        if getattr(self, "_lengths_checked", False):
            return
        self._lengths_checked = True
        for what, dist_, seen in (("prompts", self.workload.prompt_len, info["prompt_tokens_mean"]),
                                  ("responses", self.workload.response_len, info["response_tokens_mean"])):
            if not 0.67 <= seen / dist_.mean <= 1.5:
                self.roles.console.print(
                    f"[yellow]note: {what} average {seen:.0f} tokens but the workload says {dist_.mean:g} "
                    f"({what[:-1]}_len.mean); the plan's predictions assume the workload's lengths[/yellow]")

    def _train(self, b: int, batch: dict | None, times: dict, info: dict) -> None:
        """Split the scored batch over each training task's replicas by the plan's shares; DDP
        (with the learner's global token mean) makes uneven shares give the whole batch's gradient."""
        for tr in self.topo.training_tasks():
            kind = TRAIN_IN if tr.task == "actor_train" else CRITIC_IN
            if self.is_leader:
                counts = split_counts(batch["input_ids"].shape[0], tr.shares, minimum=1)
                slices = offsets(counts)
                # every rank of a replica (its TP ranks and pipeline stages) gets the replica's rows
                for members, rows in zip(tr.tp_ranks or tuple((r,) for r in tr.ranks), slices, strict=True):
                    for r in members:
                        if r != self.rank:
                            self.outbox.send(take(batch, tuple(batch), rows), r, tag(b, kind), self.msg_device)
            if self.rank not in tr.all_ranks:
                continue
            replica = tr.replica_of(self.rank)
            if self.is_leader:
                part = take(batch, tuple(batch), slices[replica])
            else:
                part = self._recv(self.leader, tag(b, kind), f"{tr.task} inputs of batch {b}")
            t0 = time.perf_counter()
            stats = self.roles.train(tr.task, part)
            times[tr.task] = time.perf_counter() - t0
            if self.rank != tr.ranks[replica]:
                continue  # a replica's statistics are reported once, by its first rank
            info.setdefault("phase_times", {})[tr.task] = [train_phase(part, times[tr.task], self.workload)]
            info.setdefault("train", {})[tr.task] = {"n": part["input_ids"].shape[0], **stats}

    def _sync(self, version: int, times: dict | None = None, info: dict | None = None) -> None:
        for name, sync, role in (("weight_sync", self.actor_sync, "actor"), ("critic_sync", self.critic_sync, "critic")):
            full = None
            if f"{role}_train" in self.tasks:
                full = self.roles.full_weights(role)  # FSDP: all replicas gather, the lead sends
            if sync is None:
                continue
            t0 = time.perf_counter()
            if self.rank == sync.src:
                named = dict(full.items() if full is not None
                             else self.roles.model_for_sync(role, True).named_parameters())
                stats = sync.send(named.items(), version)
                if self.roles.holds_receiver(role):  # the trainer's own generator (or critic_infer) copy
                    self.roles.apply_weights(role)({n: t.detach().to(sync.wire_dtype or t.dtype)
                                                    for n, t in named.items()})
                if role == "actor" and "actor_gen" in self.tasks:
                    self.version = version
            else:
                stats, got = sync.receive(self.roles.apply_weights(role), target=self.roles.sync_target(role))
                if role == "actor":
                    self.version = got
            if times is not None:
                times[name] = time.perf_counter() - t0
                info.setdefault("sync", {})[name] = {"bytes": stats.bytes, "seconds": stats.seconds}
            if self.opts.verify_sync and info is not None:
                # a sharded trainer's digest is of the full weights it gathered (on its first rank only)
                models = [full.items() if full is not None else self.roles.model_for_sync(role, sender=True)
                          .named_parameters()] if self.rank == sync.src else []
                if self.roles.holds_receiver(role):
                    models.append(self.roles.model_for_sync(role, sender=False).named_parameters())
                info.setdefault("digest", {})[name] = [state_digest(m, sync.wire_dtype) for m in models]
        if "actor_gen" in self.tasks and info is not None:
            info["gen_version"] = self.version

    # ---- the record --------------------------------------------------------------------------
    def _report(self, b: int, seconds: float, info: dict) -> None:
        """Hand this iteration's report to the leader without waiting for anyone.

        A blocking gather of every rank's report at the end of each iteration cost the loop 1-10 ms
        (gloo round trips, and waiting for the slowest rank to arrive), 3% of the tiny CPU job's
        iteration, in which no RL work happens. Other ranks send theirs without blocking; the
        leader's record thread receives them, in iteration order, while the next iteration runs.
        """
        if not self.is_leader:
            body = torch.frombuffer(bytearray(json.dumps(info, default=_plain).encode()), dtype=torch.uint8)
            self.reports.send({"report": body}, self.leader, tag(b, REPORT), torch.device("cpu"))
            return
        # Writing the log, the database and the console is the leader's bookkeeping, not RL work:
        # the record thread does it while the next iteration runs, in order, so it adds no latency.
        self._pending = [f for f in self._pending if not f.done() or f.result()]
        self._pending.append(self.writer.submit(self._record, b, seconds, info))

    def _record(self, b: int, seconds: float, mine: dict) -> None:
        gathered = [mine if r == self.rank else json.loads(
            self._recv(r, tag(b, REPORT), f"report of iteration {b}", reports=True)["report"].numpy().tobytes())
            for r in range(dist.get_world_size())]
        stages: dict[str, float] = {}
        replicas: dict[str, list[float]] = {}
        for task, tr in self.topo.tasks.items():
            per = [gathered[r]["times"].get(task) for r in tr.ranks]
            per = [p for p in per if p is not None]
            if per:
                replicas[task] = per
                stages[task] = max(per)
        for extra in ("reward", "advantage"):
            if extra in mine["times"]:
                stages[extra] = mine["times"][extra]
        for edge in ("weight_sync", "critic_sync"):
            # The sender's broadcast time is the transfer; receivers' includes waiting for training.
            src = self.topo.sync_source(edge) if self.topo.sync_members(edge) else None
            if src is not None and edge in gathered[src]["times"]:
                stages[edge] = gathered[src]["times"][edge]
        train = [g.get("train", {}).get("actor_train") for g in gathered]
        train = [t for t in train if t]
        n = sum(t["n"] for t in train) or 1

        def weighted(key: str) -> float:
            return float(sum(t.get(key, 0.0) * t["n"] for t in train) / n)

        sync = mine.get("sync", {}).get("weight_sync", {"bytes": 0, "seconds": 0.0})
        verified = None
        if self.opts.verify_sync:
            for edge, receivers in (("weight_sync", self.topo.generators),
                                    ("critic_sync", self.topo.tasks.get("critic_infer", None))):
                if not self.topo.sync_members(edge):
                    continue
                count = len(receivers if edge == "weight_sync" else receivers.all_ranks)
                digests = [d for g in gathered for d in g.get("digest", {}).get(edge, [])]
                # one digest from the trainer and one from every receiving copy, all equal
                if len(set(digests)) != 1 or len(digests) != 1 + count:
                    raise ExecutionError(f"iteration {b}: after the {edge} a receiver's weights differ from the "
                                         f"trainer's ({len(set(digests))} distinct digests of {len(digests)})")
            verified = True
        tokens = sum(g.get("gen_tokens", 0) for g in gathered)
        predicted = {t.task: t.predicted_s for t in self.plan.tasks if t.predicted_s}
        predicted.update({k: v for k, v in self.plan.predicted.breakdown.items() if k not in predicted and v})
        for edge, (src, dst) in (("weight_sync", ("actor_train", "actor_gen")),
                                 ("critic_sync", ("critic_train", "critic_infer"))):
            sent = self.plan.predicted.breakdown.get(f"weights:{src}->{dst}")  # the planner's edge name
            if sent:
                predicted.setdefault(edge, sent)
        predicted_iteration = self.plan.predicted.iteration_s or None
        rec = {
            "type": "iteration", "run": self.run_name, "plan_hash": self.hash, "iteration": b,
            "version": b + 1, "mode": self.workload.mode, "staleness_bound": self.k,
            "algorithm": self.workload.algorithm, "iteration_s": seconds, "stages": stages,
            "replicas": replicas, "predicted": predicted,
            "predicted_iteration_s": predicted_iteration, "predicted_s": predicted_iteration,
            "tokens": tokens, "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
            "reward_mean": mine["reward_mean"], "prompt_tokens_mean": mine["prompt_tokens_mean"],
            "response_tokens_mean": mine["response_tokens_mean"], "kl": weighted("kl"), "clip_frac": weighted("clip_frac"),
            "entropy": weighted("entropy"), "policy_loss": weighted("policy_loss"),
            "staleness_max": mine["staleness_max"], "staleness_mean": mine["staleness_mean"],
            "gen_versions": sorted({g["gen_version"] for g in gathered if "gen_version" in g}),
            "sync_bytes": sync["bytes"], "sync_Bps": sync["bytes"] / sync["seconds"] if sync["seconds"] else 0.0,
            "sync_verified": verified,
            "layouts": {t: tr.layout for t, tr in self.topo.tasks.items()},
            "devices": {t: list(tr.devices) for t, tr in self.topo.tasks.items()},
            "pids": {g["device"]: g["pid"] for g in gathered}, "time": time.time(),
            "leader_phases": mine["phases"],
            "work": self.work, "phase_times": gather_phase_times(gathered),
        }
        commit = bool(self.opts.checkpoint_dir and any(g.get("saved") for g in gathered))
        self._publish(rec, commit)

    def _publish(self, rec: dict, commit: bool) -> None:
        if self.log is not None:
            self.log.write(rec)
        if self.db_writer is not None:
            self.db_writer.write([rec])
        if commit:
            checkpoint.commit(self.opts.checkpoint_dir, rec["iteration"] + 1,
                              {"plan_hash": self.hash, "run": self.run_name})
        if not self.opts.quiet:
            self.roles.console.print(console_line(rec))


def _plain(value: Any) -> Any:
    """JSON for the numbers a report may carry as tensors or numpy scalars."""
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"a run report cannot carry {type(value).__name__}")


def worker_main(options: RunOptions, host: str) -> None:
    """Entry point of one spawned worker (elastic sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT).

    A failed worker leaves at once: its error is already in the agent's error file, and the
    interpreter's normal teardown would run gloo's destructors, which can wait forever on a hung peer.
    """
    try:
        _worker(options, host)
    except BaseException:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


@record
def _worker(options: RunOptions, host: str) -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID` shows where a worker waits
    keep_freed_memory()  # the allocator the profiler measured under (hostmemory.py says why)
    plan = load_plan(options.plan_path)
    backend = check_supported(plan)
    local_rank = int(os.environ["LOCAL_RANK"])
    device_id = host_devices(plan, host)[local_rank]
    cluster = plan.cluster_spec()
    if device_kind(cluster, device_id) == "cpu":
        torch.set_num_threads(1)  # a `cpu` slot is one core, as the profiler measured it
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", int(device_id.rsplit(":", 1)[1]))
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=options.timeout_s))
    ids: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ids, device_id)
    if len(set(ids)) != len(ids):
        raise ExecutionError(f"two workers claim the same device: {sorted(ids)}")
    topo = Topology(plan, {d: r for r, d in enumerate(ids)})
    topo.build_groups()
    Worker(options, topo, dist.get_rank(), device).run()
    dist.barrier()
    # Torn down only on success: after a failure a peer may be dead or hung, and tearing down
    # could wait on it; the process exits and the agent stops the rest.
    dist.destroy_process_group()

