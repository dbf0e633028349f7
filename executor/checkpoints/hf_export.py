"""Hugging Face exports of the trained models beside each checkpoint, loadable without hetprof.

At every checkpoint (and so at the last iteration) the actor is written as a causal LM and a PPO
critic as a token-classification model with one label (its value head is `score`, one value per
position), each with `save_pretrained` (safetensors), the run's tokenizer and a generation config
holding the run's sampling settings:

  <checkpoint-dir>/hf/iter-NNNNNN/actor/    AutoModelForCausalLM.from_pretrained loads it
  <checkpoint-dir>/hf/iter-NNNNNN/critic/   AutoModelForTokenClassification (num_labels=1)

A sharded trainer (FSDP, TP, PP) is gathered to full tensors first — a collective every rank of
the trainer joins — and only the task's lead rank writes. Each folder is written under a temporary
name and renamed into place, so a reader never sees half an export; the newest `keep` are kept.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hetprof.errors import ExecutionError
from hetprof.executor.checkpoints.checkpoint import atomic_folder
from hetprof.executor.models.hf_tokenizer import save_tokenizer
from hetprof.executor.models.modeling import hf_config, unwrap
from hetprof.specs.vocabulary import Role, Task, TaskKind

if TYPE_CHECKING:
    from hetprof.executor.runners.base import RunnerBase
    from hetprof.executor.runners.context import RankContext

EXPORT = "hf"


def export_folder(checkpoint_dir: str | Path, iteration: int, role: str) -> Path:
    """Where the export of `role` (actor or critic) after `iteration` iterations lives."""
    return Path(checkpoint_dir) / EXPORT / f"iter-{iteration:06d}" / role


def export_models(runners: Mapping[str, RunnerBase], ctx: RankContext, checkpoint_dir: str, iteration: int,
                  keep: int = 2) -> list[Path]:
    """Export every trained model on this rank; every rank of a trainer calls it (the gather is a
    collective), the trainer's lead writes. Returns the folders this rank wrote."""
    written = []
    for task, runner in runners.items():
        if Task(task).kind != TaskKind.TRAINING:
            continue
        role = Task(task).role
        writer = WRITERS[role]
        state = runner.full_weights()  # FSDP/TP/PP: gathered; DDP/one device: None (full already)
        if ctx.rank != runner.placement.lead:
            continue
        if state is None:
            state = unwrap(runner.module).state_dict()
        folder = export_folder(checkpoint_dir, iteration, role)
        atomic_folder(folder, lambda tmp, w=writer, s=state, r=role: w(tmp, s, ctx.model_ref(r), ctx))
        _prune(Path(checkpoint_dir) / EXPORT, role, keep, iteration)
        written.append(folder)
    return written


def _write_actor(folder: Path, state: dict[str, torch.Tensor], ref: str, ctx: RankContext) -> None:
    from transformers import AutoModelForCausalLM

    _save(AutoModelForCausalLM, hf_config(ref), state, folder, ctx)


def _write_critic(folder: Path, state: dict[str, torch.Tensor], ref: str, ctx: RankContext) -> None:
    """The critic's backbone under the token classifier's base prefix, its head as `score`."""
    from transformers import AutoModelForTokenClassification

    config = hf_config(ref)
    config.num_labels = 1
    renamed = {("score." + k.removeprefix("head.")) if k.startswith("head.")
               else ("model." + k.removeprefix("backbone.")): v for k, v in state.items()}
    _save(AutoModelForTokenClassification, config, renamed, folder, ctx)


def _save(auto: Any, config: Any, state: dict[str, torch.Tensor], folder: Path, ctx: RankContext) -> None:
    """`save_pretrained` from a weightless skeleton and the given full state (no second copy built)."""
    from transformers import GenerationConfig

    tok = ctx.tokenizer
    config.update({"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id})
    dtype = next(iter(state.values())).dtype
    with torch.device("meta"):
        skeleton = auto.from_config(config, dtype=dtype)
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    skeleton.generation_config = GenerationConfig(
        bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id, do_sample=True,
        temperature=ctx.workload.training.temperature, top_p=ctx.workload.training.top_p,
        max_new_tokens=ctx.workload.response_len.cap)
    # transformers writes only on global rank 0 of an initialised process group; hetprof picked this
    # rank (the trainer's lead) as the one writer, so this rank saves whatever its number
    skeleton.should_save_on_this_rank = lambda is_main_process: True
    with _quiet_transformers():
        skeleton.save_pretrained(str(folder), state_dict=cpu, safe_serialization=True)
    save_tokenizer(tok, folder)
    missing = [f for f in ("config.json", "model.safetensors") if not (folder / f).is_file()]
    if missing:
        raise ExecutionError(f"Hugging Face export {folder}: save_pretrained wrote no {', '.join(missing)}")


# the export format of each trained role
WRITERS = {Role.ACTOR: _write_actor, Role.CRITIC: _write_critic}


@contextlib.contextmanager
def _quiet_transformers() -> Any:
    """No per-shard progress bars from a worker: they would break into the run's console lines."""
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            logging.enable_progress_bar()


def _prune(root: Path, role: str, keep: int, iteration: int) -> None:
    """Drop all but the newest `keep` exports of `role` this run wrote (by its own record: folders
    another run or person put there are never removed), and iteration folders left empty."""
    from hetprof.executor.checkpoints.checkpoint import iteration_folder, prune_own

    def remove(name: str) -> None:
        shutil.rmtree(root / name / role, ignore_errors=True)
        with contextlib.suppress(OSError):
            (root / name).rmdir()  # only once empty: another role's lead may still hold its export there

    prune_own(root, iteration_folder(iteration), "", keep, f"WRITTEN-{role}.json", remove)
