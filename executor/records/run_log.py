"""What a run measured, per iteration: a JSONL log, a console line, and run records in the profile DB.

One JSON object per iteration (schema below) is the durable record; `hetprof validate` reads it
back, and the same numbers go to the profile database as one row per (iteration, task) so
`hetprof fit` can learn from real runs. The log is appended to, so a resumed run continues it.

Iteration record fields: run, plan_hash, iteration, version, mode, staleness_bound, iteration_s,
stages {task or phase: seconds}, replicas {task: [seconds per replica]}, predicted {task: seconds},
predicted_iteration_s, tokens, tokens_per_s, reward_mean, reward_std, kl, entropy, clip_frac, grad_norm, lr,
critic_<stat> (PPO), kl_in_reward, mfu {training task: model FLOPs utilisation} (where the catalog
has a peak), sequences, device_count, staleness_max, staleness_mean, sync_bytes, sync_Bps, layouts {task: "DP2×TP1×PP1"},
devices {task: [ids]}, time, samples [{prompt, answer, response, reward}] (a few, for reading),
timeline [{device, task, start, end}] (seconds since the iteration's first task began; the measured Gantt),
work {task: what one replica ran: kind, role, model shape, layout}, phase_times {task: [{kind, batch,
tokens, seconds, device, device_type, dtype, threads, with_head}]} (built by run_record.build_record;
costmodels/runrows.py reads them back as task rows).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from hetprof.errors import HetprofError
from hetprof.specs import Plan


def plan_hash(plan: Plan) -> str:
    """Content hash of a plan: what a run record is tied to, and what --resume checks."""
    text = json.dumps(plan.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class RunLog:
    """Appends iteration records to a JSONL file, flushing each line (a killed run keeps its log).

    A run killed while writing a record leaves a torn last line; a resumed run appending after it
    would glue its first record to the fragment and spoil the log for every reader. So opening a
    log drops a torn tail first (`torn_bytes` says how much): that record was never written whole,
    and the resumed run records its iteration again."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None
        self.torn_bytes = 0
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.torn_bytes = drop_torn_tail(self.path)

    def write(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()


def drop_torn_tail(path: Path) -> int:
    """Cut a regular file back to its last newline; returns the bytes removed (0: it ends whole, is
    empty, or is missing or not a regular file, which the writer's open reports)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return 0
    with os.fdopen(fd, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode) or size == 0:
            return 0
        end = size
        while end > 0:  # backwards a chunk at a time: a log can be large, its torn record too
            start = max(0, end - TAIL_CHUNK)
            f.seek(start)
            chunk = f.read(end - start)
            if start + len(chunk) == size and chunk.endswith(b"\n"):
                return 0
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                end = start + cut + 1
                break
            end = start
        f.truncate(end)
        return size - end


TAIL_CHUNK = 1 << 16
MAX_LOG_BYTES = 1 << 30  # a 10,000-iteration log with timelines and samples is ~100 MB
MAX_LINE_BYTES = 32 << 20  # one iteration's record
MAX_BARS = 5_000  # timeline spans of one iteration (ranks × tasks × phases, ~1k at 64 ranks); --gantt draws
# them all, ~1 s per thousand on a small machine


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """Iteration records of a JSONL log; with a resumed run, the last record of an iteration wins.

    The log may come from someone else: only a regular file of at most MAX_LOG_BYTES, read line by
    line (each at most MAX_LINE_BYTES), each record plain JSON (depth, finite numbers) whose fields
    have the types `check_record` names — any problem one HetprofError naming the file and line. A
    last line with no newline that is not JSON is a record a killed run was writing: left out."""
    from hetprof.safety import safefiles
    from hetprof.specs.loader import check_plain

    path = Path(path)
    by_iter: dict[tuple[str, int], dict[str, Any]] = {}
    try:
        f = safefiles.open_regular(path)
    except safefiles.NotReadable as exc:
        raise HetprofError(f"run log {path}: {exc}") from None
    with f:
        if os.fstat(f.fileno()).st_size > MAX_LOG_BYTES:
            raise HetprofError(f"run log {path}: larger than {MAX_LOG_BYTES:,} bytes")
        for n, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            where = f"run log {path}: line {n}"
            if len(raw) > MAX_LINE_BYTES:
                raise HetprofError(f"{where} is longer than {MAX_LINE_BYTES:,} bytes")
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
                check_plain(rec, None)
            except RecursionError:
                raise HetprofError(f"{where} is nested too deep") from None
            except (ValueError, HetprofError):  # JSON, UTF-8, NaN/Infinity, depth, inf, surrogates
                if not raw.endswith(b"\n"):  # the last line, torn: a record a killed run never finished
                    break
                raise HetprofError(f"{where} is not an iteration record") from None
            check_record(rec, where)
            by_iter[(rec["run"], rec["iteration"])] = rec
    return [by_iter[k] for k in sorted(by_iter, key=lambda k: k[1])]


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def check_record(rec: Any, where: str) -> None:
    """The fields `hetprof validate` reads, typed: a HetprofError naming `where` and the field otherwise."""
    def bad(name: str, expected: str) -> HetprofError:
        return HetprofError(f"{where}: field '{name}': expected {expected}")

    if not isinstance(rec, dict):
        raise HetprofError(f"{where} is not an iteration record")
    if not isinstance(rec.get("run"), str):
        raise bad("run", "a run name")
    if type(rec.get("iteration")) is not int or not 0 <= rec["iteration"] <= 10**9:
        raise bad("iteration", "an integer in 0..1,000,000,000")
    for name in ("iteration_s", "predicted_iteration_s"):
        value = rec.get(name)
        if value is not None and not (_number(value) and value >= 0):
            raise bad(name, "a non-negative number of seconds")
    for name in ("stages", "predicted"):
        table = rec.get(name, {})
        if not isinstance(table, dict) or not all(v is None or (_number(v) and v >= 0) for v in table.values()):
            raise bad(name, "a mapping of task to non-negative seconds")
    devices = rec.get("devices", {})
    if not isinstance(devices, dict) or not all(isinstance(v, list) and all(isinstance(d, str) for d in v)
                                                for v in devices.values()):
        raise bad("devices", "a mapping of task to a list of device ids")
    timeline = rec.get("timeline", [])
    if not isinstance(timeline, list) or len(timeline) > MAX_BARS:
        raise bad("timeline", f"a list of at most {MAX_BARS:,} spans")
    for span in timeline:
        if not (isinstance(span, dict) and isinstance(span.get("device"), str) and isinstance(span.get("task"), str)
                and _number(span.get("start")) and _number(span.get("end"))):
            raise bad("timeline", "spans {device, task, start, end} with finite times")


SHAPE_KEYS = ("name", "layers", "hidden", "ffn", "heads", "kv_heads", "head_dim", "vocab")
DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def dtype_name(dtype: Any) -> str:
    """The cost models' name of a torch dtype (torch.float32 → 'fp32')."""
    return DTYPE_NAMES.get(str(dtype).removeprefix("torch."), str(dtype))


def work_description(plan: Plan) -> dict[str, dict[str, Any]]:
    """Per task, what one replica runs in the cost model's terms: the shape a run record is about.

    Stage times alone cannot teach a cost model anything; with the model shape and layout next to
    them (and the phases each rank timed, see `run_record.work_timings`) `hetprof fit` can learn from real runs.
    """
    roles = plan.workload_spec().roles()
    out: dict[str, dict[str, Any]] = {}
    for t in plan.tasks:
        shape = roles[t.role]
        out[t.task] = {"kind": t.kind, "role": t.role, "model": {k: getattr(shape, k) for k in SHAPE_KEYS},
                       "tp": t.layout.tp, "pp": t.layout.pp, "dp": t.layout.dp}
        if t.layout.tp_varies:  # generation replicas of different TP: each device's own degree
            out[t.task]["device_tp"] = {d: t.layout.tp_of(r) for r, devs in enumerate(t.layout.replicas) for d in devs}
    return out


def db_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Run-record rows for the profile DB: one per task of the iteration, plus the iteration itself."""
    rows = []
    for task, seconds in record["stages"].items():
        rows.append({
            "run": record["run"], "plan_hash": record["plan_hash"], "iteration": record["iteration"],
            "task": task, "seconds": float(seconds), "predicted_s": record["predicted"].get(task),
            "device_ids": record["devices"].get(task, []),
            "extra": {"layout": record["layouts"].get(task), "replicas": record["replicas"].get(task),
                      "mode": record["mode"], "version": record["version"],
                      **({"work": record["work"][task]} if task in record.get("work", {}) else {}),
                      **({"phases": record["phase_times"][task]} if task in record.get("phase_times", {}) else {})},
        })
    rows.append({
        "run": record["run"], "plan_hash": record["plan_hash"], "iteration": record["iteration"],
        "task": "iteration", "seconds": float(record["iteration_s"]),
        "predicted_s": record.get("predicted_iteration_s"),
        "device_ids": sorted({d for ids in record["devices"].values() for d in ids}),
        "extra": {k: record[k] for k in ("tokens_per_s", "reward_mean", "kl", "clip_frac", "staleness_max",
                                         "mode", "sync_Bps", "val_reward_mean", "timeline") if k in record},
    })
    return rows


def write_db(db_file: str | Path, records: list[dict[str, Any]]) -> None:
    """Store iteration records as run records in the profile database (one transaction)."""
    writer = DBWriter(db_file)
    try:
        writer.write(records)
    finally:
        writer.close()


class DBWriter:
    """Run records into the profile database over one connection kept open for the run.

    The leader writes a record per iteration from its writer thread, beside the next iteration's
    work; on a CPU slot that thread shares the worker's core, so the schema check and connection
    setup are paid once per run, not per record. Opened on first use, so the
    connection belongs to the thread that writes (SQLite connections stay in their thread).
    """

    def __init__(self, db_file: str | Path):
        self.db_file = db_file
        self._db: Any = None

    def write(self, records: list[dict[str, Any]]) -> None:
        from hetprof.profiles import ProfileDB

        if self._db is None:
            self._db = ProfileDB(self.db_file)
        self._db.add_run_records([row for rec in records for row in db_rows(rec)])

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


def read_db(db_file: str | Path, run: str) -> list[dict[str, Any]]:
    """Rebuild iteration records (stages, predicted, iteration_s) of one run from the profile DB."""
    from hetprof.profiles import ProfileDB

    with ProfileDB(db_file) as db:
        df = db.run_records()
    if df.empty or "run" not in df.columns or run not in set(df["run"]):
        raise HetprofError(f"run {run!r} has no records in the profile database {db_file}")
    out: dict[int, dict[str, Any]] = {}
    for row in df[df["run"] == run].to_dict("records"):
        rec = out.setdefault(int(row["iteration"]), {"run": run, "plan_hash": row.get("plan_hash"),
                                                     "iteration": int(row["iteration"]), "stages": {},
                                                     "predicted": {}})
        predicted = row.get("predicted_s")
        predicted = None if predicted is None or predicted != predicted else float(predicted)  # NaN → None
        if row["task"] == "iteration":
            rec["iteration_s"] = float(row["seconds"])
            rec["predicted_iteration_s"] = predicted
            if isinstance(row.get("extra"), dict) and row["extra"].get("timeline"):
                rec["timeline"] = row["extra"]["timeline"]
        else:
            rec["stages"][row["task"]] = float(row["seconds"])
            if isinstance(row.get("device_ids"), list):
                rec.setdefault("devices", {})[row["task"]] = row["device_ids"]
            if predicted is not None:
                rec["predicted"][row["task"]] = predicted
    return [out[i] for i in sorted(out)]


def console_line(record: dict[str, Any]) -> str:
    """A one-line summary of an iteration for the console (rich markup)."""
    stages = " ".join(f"{k}={v:.2f}s" for k, v in record["stages"].items())
    return (f"[bold]iter {record['iteration']}[/bold] {record['iteration_s']:.2f}s "
            f"reward={record['reward_mean']:.3f} kl={record['kl']:.4f} clip={record['clip_frac']:.3f} "
            f"tok/s={record['tokens_per_s']:.0f} stale≤{record['staleness_max']} "
            + (f"val_reward={record['val_reward_mean']:.3f} " if "val_reward_mean" in record else "")
            + f"[dim]{stages}[/dim]")
