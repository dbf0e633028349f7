"""Atomic checkpoints of tensors only, so a killed run resumes and a shared checkpoint runs no code.

A checkpoint is a directory `iter-NNNNNN/` holding `state.pt` (a torch.save of nested dicts of
tensors and numbers: models, optimizers, learner progress, RNG states, rollouts in flight) and
`meta.json` (plan hash, run, iteration, a rank's data position). It is written under a temporary name and renamed into place, and the
`LATEST` pointer is replaced atomically after it, so a crash mid-write leaves the previous
checkpoint intact. Loading uses `weights_only=True`: a checkpoint file cannot execute code.

A checkpoint folder may come from someone else (or hold folders another run planted), so: markers
(`COMMITTED.json`, `meta.json`, `LATEST`, `WRITTEN.json`) are small regular files parsed with depth
and value limits; the run name they hold is a name, never a path; pruning removes only the folders
this run recorded in `WRITTEN.json` as its own; a `state.pt` is checked (regular file, size,
`weights_only` load) before a run resumes from it, and a resume falls back to the newest good one.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hetprof.errors import ExecutionError, HetprofError, SpecError
from hetprof.executor.records.run_name import run_name_problem
from hetprof.safety import safefiles
from hetprof.specs.loader import check_plain

LATEST = "LATEST"
STATE = "state.pt"
META = "meta.json"
WRITTEN = "WRITTEN.json"  # the iteration folders this task directory's current run wrote, oldest first

MAX_MARKER_BYTES = 1 << 20  # a marker holds a few fields; 1 MiB is far above any we write
MAX_ITERATION = 10**9  # iteration numbers we write; beyond is not ours
MAX_STATE_BYTES = 1 << 40  # a state.pt larger than 1 TiB is no model state this runtime holds
ITER_NAME = re.compile(r"iter-(\d{6,9})")


class CheckpointRefused(HetprofError):
    """A checkpoint file cannot be used as it is (bad input: exit 2); the message names the file."""


def iteration_folder(iteration: int) -> str:
    return f"iter-{iteration:06d}"


def _torch_problem(exc: Exception) -> str:
    """torch's reason in one line, without its advice to load with weights_only=False (that runs code)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    unpickler = [line for line in lines[1:] if "weights_only" not in line and "torch.load" not in line]
    if lines and lines[0].startswith("Weights only load failed") and unpickler:
        return f"{type(exc).__name__}: {unpickler[0][:160]}"
    if not lines or "weights_only" in lines[0] or "torch.save" in lines[0]:
        return f"{type(exc).__name__}: not a zip archive of tensors and plain values"
    return f"{type(exc).__name__}: {lines[0][:160]}"


def read_marker(path: str | Path) -> Any:
    """Plain JSON data of a marker file: a regular file of at most MAX_MARKER_BYTES, UTF-8, nested at
    most loader.MAX_DEPTH deep, finite numbers only; anything else is a CheckpointRefused naming it."""
    path = Path(path)
    try:
        text = safefiles.read_bounded(path, MAX_MARKER_BYTES).decode("utf-8")
        data = json.loads(text, parse_constant=_no_constant)
        check_plain(data, str(path))
    except safefiles.NotReadable as exc:
        raise CheckpointRefused(f"checkpoint marker {path}: {exc}") from None
    except SpecError as exc:
        raise CheckpointRefused(f"checkpoint marker {exc}") from None
    except (ValueError, RecursionError) as exc:  # JSON syntax, bad UTF-8, 10k-digit numbers, deep nesting
        problem = "nested too deep" if isinstance(exc, RecursionError) else str(exc).splitlines()[0][:120]
        raise CheckpointRefused(f"checkpoint marker {path}: not valid JSON ({problem})") from None
    return data


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _checked_meta(path: Path) -> dict[str, Any]:
    """A marker naming an iteration and a run: both checked, so no reader can be led astray by them."""
    meta = read_marker(path)
    if not isinstance(meta, dict):
        raise CheckpointRefused(f"checkpoint marker {path}: expected a JSON object")
    it = meta.get("iteration")
    if type(it) is not int or not 0 <= it <= MAX_ITERATION:
        raise CheckpointRefused(f"checkpoint marker {path}: field 'iteration': expected an integer in "
                                f"0..{MAX_ITERATION:,}, got {it!r:.80}")
    if "run" in meta and (problem := run_name_problem(meta["run"])):
        raise CheckpointRefused(f"checkpoint marker {path}: field 'run': expected {problem}")
    return meta


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(directory: str | Path, iteration: int, state: dict[str, Any], meta: dict[str, Any],
         keep: int = 2, protect: Collection[str] = ()) -> Path:
    """Write checkpoint `iteration` atomically and point LATEST at it; keep the newest `keep` this run
    wrote (by its WRITTEN.json record: folders another run or person put there are never removed),
    and never remove a folder named in `protect` (the committed iteration: a resume's start)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    final = root / iteration_folder(iteration)

    def write(tmp: Path) -> None:
        torch.save(state, tmp / STATE)
        (tmp / META).write_text(json.dumps({**meta, "iteration": iteration}, indent=1))

    atomic_folder(final, write)
    _write_atomic(root / LATEST, final.name + "\n")
    prune_own(root, final.name, str(meta.get("run", "")), keep, WRITTEN,
              lambda name: shutil.rmtree(root / name, ignore_errors=True), protect)
    return final


def prune_own(root: Path, written: str, run: str, keep: int, record: str, remove: Callable[[str], None],
              protect: Collection[str] = ()) -> None:
    """Record `written` (an iteration folder under `root`) as `run`'s in `root/record` and `remove` this
    run's older folders beyond the newest `keep`, except those in `protect` (kept, and recorded, until
    a later save finds them unprotected). A record of another run (or an unreadable one) is started
    afresh: what it names is left alone, and a folder nobody recorded is never touched."""
    try:
        entry = read_marker(root / record)
        ours = entry["written"] if isinstance(entry, dict) and entry.get("run") == run else []
    except (CheckpointRefused, KeyError):
        ours = []
    if not isinstance(ours, list):
        ours = []
    ours = [n for n in ours if isinstance(n, str) and ITER_NAME.fullmatch(n) and n != written] + [written]
    drop = [n for n in (ours[:-keep] if keep > 0 else []) if n not in protect]
    ours = [n for n in ours if n not in drop]
    _write_atomic(root / record, json.dumps({"run": run, "written": ours}))
    for name in drop:
        remove(name)


def committed_folder(root: str | Path) -> str | None:
    """The iteration folder COMMITTED.json names under checkpoint root `root` (None: none, or unreadable).
    The leader commits from its record thread, which may trail the saves by several iterations, so a
    save must not prune the checkpoint a resume would start from."""
    try:
        meta = committed(root)
    except (CheckpointRefused, ExecutionError):
        return None
    return iteration_folder(meta["iteration"]) if meta is not None else None


def atomic_folder(final: Path, write: Callable[[Path], None]) -> None:
    """Fill a fresh temporary folder beside `final` with `write(tmp)`, then rename it to `final` (replacing
    an older one): a reader sees the whole folder or none of it, and a failed write leaves nothing."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
    try:
        write(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def latest(directory: str | Path) -> Path | None:
    """The newest complete checkpoint directory, or None if there is none."""
    root = Path(directory)
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    try:
        name = safefiles.read_bounded(pointer, 64).decode("ascii").strip()
    except (safefiles.NotReadable, UnicodeDecodeError):
        return None
    if not ITER_NAME.fullmatch(name):  # a name, never a path out of the folder
        return None
    path = root / name
    return path if (path / STATE).is_file() and (path / META).is_file() else None


def load(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[dict[str, Any], dict[str, Any]]:
    """(state, meta) of a checkpoint directory; tensors only (weights_only=True)."""
    path = Path(path)
    meta = _checked_meta(path / META)
    state = load_state(path / STATE, map_location)
    return state, meta


def load_state(path: Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> dict[str, Any]:
    """A state.pt's nested dict of tensors; a file that is not one is a CheckpointRefused naming it
    (torch's own advice to pass weights_only=False is never shown: that would run the file's code)."""
    try:
        with safefiles.open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
        if size > MAX_STATE_BYTES:
            raise safefiles.NotReadable(f"larger than {MAX_STATE_BYTES:,} bytes")
        with warnings.catch_warnings():  # torch warns of pickle protocols; the refusal below says it all
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except safefiles.NotReadable as exc:
        raise CheckpointRefused(f"checkpoint {path}: {exc}") from None
    except Exception as exc:  # torch raises many kinds (UnpicklingError, RuntimeError, EOFError...)
        raise CheckpointRefused(f"checkpoint {path}: not a tensors-only torch checkpoint "
                                f"({_torch_problem(exc)})") from None
    if not isinstance(state, dict):
        raise CheckpointRefused(f"checkpoint {path}: expected a mapping of states, got {type(state).__name__}")
    return state


def rng_state() -> dict[str, Any]:
    """Every process-wide random generator of this process as tensors and numbers: torch's (CPU, and
    CUDA when in use), Python's `random` and numpy's legacy global one (a reward function may draw
    from either), so a resumed rank draws what the uninterrupted one would have."""
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    out: dict[str, Any] = {
        "torch_cpu": torch.get_rng_state(),
        "python": {"version": version, "words": torch.tensor(words, dtype=torch.int64), "gauss": gauss},
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["torch_cuda"] = torch.cuda.get_rng_state()
    return out


def set_rng_state(state: Any) -> None:
    """Restore what `rng_state` took; a ValueError says what is malformed (and nothing is set then)."""
    try:
        python, numpy_state = state["python"], state["numpy"]
        words = tuple(int(w) for w in python["words"].tolist())
        gauss = python["gauss"]
        if not (gauss is None or isinstance(gauss, float)) or len(words) != len(random.getstate()[1]):
            raise ValueError("Python's random state has the wrong shape")
        keys = numpy_state["keys"].numpy().astype(np.uint32)
        legacy = (str(numpy_state["kind"]), keys, int(numpy_state["pos"]), int(numpy_state["has_gauss"]),
                  float(numpy_state["cached"]))
        cpu = state["torch_cpu"]
        if not isinstance(cpu, torch.Tensor) or cpu.shape != torch.get_rng_state().shape:
            raise ValueError("torch's CPU generator state has the wrong shape")
        probe = np.random.RandomState()
        probe.set_state(legacy)  # numpy checks the state here, before any generator is changed
    except (KeyError, TypeError, AttributeError, RuntimeError, ValueError) as exc:
        raise ValueError(f"random generator states: {type(exc).__name__}: {str(exc)[:120]}") from None
    torch.set_rng_state(cpu)
    if isinstance(state.get("torch_cuda"), torch.Tensor) and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["torch_cuda"])
    random.setstate((int(python["version"]), words, gauss))
    np.random.set_state(legacy)


COMMIT = "COMMITTED.json"


def task_dir(root: str | Path, task: str) -> Path:
    """Each training task's lead writes its own checkpoints (models live on different ranks)."""
    return Path(root) / task


def commit(root: str | Path, iteration: int, meta: dict[str, Any]) -> None:
    """Mark `iteration` complete once every training task has saved it; --resume starts here."""
    path = Path(root) / COMMIT
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, json.dumps({**meta, "iteration": iteration}, indent=1))


def committed(root: str | Path) -> dict[str, Any] | None:
    """The last committed iteration's metadata, or None when no checkpoint was completed."""
    path = Path(root) / COMMIT
    if not os.path.lexists(path):
        return None
    meta = _checked_meta(path)
    if "run" not in meta:
        raise CheckpointRefused(f"checkpoint marker {path}: field 'run': expected a run name, got nothing")
    return meta


def unit_folders(root: str | Path, iteration: int) -> list[Path]:
    """The task folders under `root` (a task, or task/stage-unit) holding checkpoint `iteration`."""
    name = iteration_folder(iteration)
    return sorted(p.parent for p in _unit_candidates(Path(root)) if p.name == name and p.is_dir())


def _unit_candidates(root: Path) -> Iterator[Path]:
    """Checkpoint folders of units ("task" or "task/stageN-tpM"): those holding a meta.json or state.pt
    (other folders under the root, such as hf_export's iter-NNNNNN/, are no unit's checkpoints)."""
    for pattern in ("*/iter-*", "*/*/iter-*"):
        yield from (p for p in root.glob(pattern) if os.path.lexists(p / META) or os.path.lexists(p / STATE))


def check_iteration(root: str | Path, iteration: int, plan_hash: str, mmap: bool = True) -> str | None:
    """Why checkpoint `iteration` under `root` cannot be resumed from (None if it can): every unit's
    meta.json names this plan and iteration, and every state.pt is a tensors-only torch file."""
    units = unit_folders(root, iteration)
    if not units:
        return f"no task folder under {root} holds {iteration_folder(iteration)}"
    for unit in units:
        path = unit / iteration_folder(iteration)
        try:
            meta = _checked_meta(path / META)
            if meta.get("plan_hash") != plan_hash or meta["iteration"] != iteration:
                return f"{path / META}: made for plan {meta.get('plan_hash')!r:.40} iteration {meta['iteration']}"
            load_state(path / STATE, "cpu", mmap=mmap)
        except CheckpointRefused as exc:
            return str(exc)
    return None


def resume_point(root: str | Path, plan_hash: str) -> tuple[int, str, list[str]]:
    """(iteration, run name, warnings) a --resume starts from: the committed checkpoint, or when it is
    damaged the newest older one every task folder holds intact (each skipped one is a warning)."""
    meta = committed(root)
    if meta is None:
        raise CheckpointRefused(f"--resume: no complete checkpoint under {root}")
    if meta.get("plan_hash") != plan_hash:
        raise ExecutionError(f"--resume: the checkpoint under {root} was made for plan "
                             f"{str(meta.get('plan_hash'))[:40]}, not this plan ({plan_hash})")
    newest = meta["iteration"]
    units = {u for u in unit_folders(root, newest)}
    earlier = sorted({int(m.group(1)) for p in _unit_candidates(Path(root))
                      if (m := ITER_NAME.fullmatch(p.name)) and int(m.group(1)) < newest}, reverse=True)
    if not units and not earlier:  # no unit's checkpoint on this host (multi-host, host-local folders):
        return newest, meta["run"], []  # each unit's own host loads, and checks, its state
    warnings: list[str] = []
    for iteration in [newest, *earlier]:
        if iteration != newest and units - set(unit_folders(root, iteration)):
            continue  # a task folder lacks it: not a checkpoint of the whole run
        problem = check_iteration(root, iteration, plan_hash)
        if problem is None:
            return iteration, meta["run"], warnings
        warnings.append(f"checkpoint {iteration_folder(iteration)} skipped: {problem}")
    raise CheckpointRefused(f"--resume: no intact checkpoint under {root}: {warnings[0]}")
