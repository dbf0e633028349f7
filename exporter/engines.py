"""Which training engine a hetprof training layout is in verl and AReaL (both offer FSDP and Megatron)."""

from __future__ import annotations

from hetprof.specs.layout import TaskLayout


def trainer_engine(lay: TaskLayout) -> str:
    """fsdp for whole-model replicas that shard their state (zero2, fsdp); megatron for the rest
    (TP/PP, DDP, or zero1 — Megatron's distributed optimizer)."""
    return "fsdp" if lay.tp == 1 and lay.pp == 1 and lay.sharding in ("zero2", "fsdp") else "megatron"
