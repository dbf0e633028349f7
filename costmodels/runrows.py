"""Real runs as training rows: the phase timings `hetprof run` records, shaped like profiler task rows.

The executor stores, next to each task's stage time, what one replica ran (model shape, layout)
and the phases each rank timed: generation's prefill and every decode step (sampling included),
an inference forward, and a training task's time per optimizer step over its mini-batch. Each of
those is exactly one `Phase`, so it becomes one row in the same columns as `db.samples("task.")`
and is compared with the profiler's rows. Rows carry `source = "run"` and their run (`run_key`),
which keeps them their own shapes per run: a decode step measured inside a run (the executor's loop
around it, other workers on the host) is not the same target as the microbenchmark's, and
`runcalibration` learns the difference. `dp` and `dp_hosts` say whether a training step also held
a gradient all-reduce, and over which hosts; `packs`, over how many packed passes the step (and so
its all-reduce) is shared: a packed step's row is one pack's pass with one optimizer step.

Skipped, and counted: pipeline-parallel tasks (a stage's share of layers is not in the record),
and phases whose record lacks a field a task row needs.

A generation replica's whole call is a row too (`run_call_rows`, shaped like the profiler's
`task.generate` rows): the replica's recorded stage time at its prefill's batch and padded prompt,
with the tokens it sampled (its decode laps and the one sampled from the prefill's logits). What it
takes beyond the run-calibrated phases is what a call costs in a run (calloverhead.py). Only a
replica that made one call (one prefill lap on its lead device) gives one; an engine that does not
time its phases (vLLM) gives none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from hetprof.costmodels.features import PHASE_TASK, SHAPE_FIELDS

SOURCE = "run"
CALL_BENCHMARK = "task.generate"  # whole generation calls (calloverhead.BENCHMARK)


def phase_row(record: Mapping[str, Any], work: Mapping[str, Any], phase: Mapping[str, Any], seq: int
              ) -> dict[str, Any] | None:
    """One recorded phase as a task row; None when it cannot be one (see the module's docstring)."""
    kind = phase.get("kind")
    model = work.get("model")
    if kind not in PHASE_TASK or not isinstance(model, Mapping) or int(work.get("pp", 1) or 1) > 1:
        return None
    try:
        seconds = float(phase["seconds"])
        batch, tokens = int(phase["batch"]), int(phase["tokens"])
        shape = {k: int(model[k]) for k in SHAPE_FIELDS}
        layers = int(model["layers"])
    except (KeyError, TypeError, ValueError):
        return None
    if not (seconds > 0 and batch >= 1 and tokens >= 1 and phase.get("device_type")):
        return None
    # a generation call's prefill computes the last position's logits only (hetprof.runtime.generation):
    # no LM head, as the cost model prices it (base.generation_phases); a record may say otherwise
    return {
        "sample_id": f"{record['run']}/{record['iteration']}/{record['task']}/{seq}",
        "run_id": str(record["run"]), "benchmark": PHASE_TASK[kind], "device_id": phase.get("device"),
        "device_name": phase.get("device_type"), "catalog_type": phase.get("device_type"), "host": None,
        "seq": seq, "model": str(model.get("name", "custom")), "layers_run": layers, **shape, "batch": batch,
        ("context_len" if kind == "decode" else "seq_len"): tokens, "dtype": phase.get("dtype") or "bf16",
        "with_head": bool(phase.get("with_head", not (kind == "prefill" and work.get("kind") == "generation"))),
        "tp": _tp(work, phase.get("device")),
        "threads": phase.get("threads"), "source": SOURCE, "run_key": str(record["run"]),
        "dp": int(work.get("dp", 1) or 1), "dp_hosts": hosts_of(record.get("device_ids")),
        "packs": packs_of(phase), "seconds": seconds,
    }


def _tp(work: Mapping[str, Any], device: Any) -> int:
    """The TP degree the phase ran at: its device's own where a task's generation replicas differ."""
    per_device = work.get("device_tp")
    tp = per_device.get(device) if isinstance(per_device, Mapping) else None
    return int(tp or work.get("tp", 1) or 1)


def packs_of(phase: Mapping[str, Any]) -> float:
    """Over how many packs a training row's optimizer step, and so its all-reduce, is shared (1: padded)."""
    try:
        packs = float(phase.get("packs", 1.0))
    except (TypeError, ValueError):
        return 1.0
    return packs if packs >= 1.0 and packs < float("inf") else 1.0


def hosts_of(device_ids: Any) -> int:
    """How many hosts a task's devices ("host:index") sit on; 1 when the record does not say."""
    if not isinstance(device_ids, (list, tuple)) or not device_ids:
        return 1
    return len({str(d).rsplit(":", 1)[0] for d in device_ids})


def call_rows(record: Mapping[str, Any], work: Mapping[str, Any], phases: list) -> list[dict[str, Any]]:
    """Each generation replica's whole call in one run record, as `task.generate` rows (module docstring)."""
    model, replicas, leads = work.get("model"), record.get("extra", {}).get("replicas"), record.get("device_ids")
    if (work.get("kind") != "generation" or not isinstance(model, Mapping) or int(work.get("pp", 1) or 1) > 1
            or not isinstance(replicas, list) or not isinstance(leads, list) or len(replicas) != len(leads)):
        return []
    out = []
    for r, (seconds, lead) in enumerate(zip(replicas, leads, strict=True)):
        laps = [p for p in phases if isinstance(p, Mapping) and p.get("device") == lead]
        prefills = [p for p in laps if p.get("kind") == "prefill"]
        if len(prefills) != 1:
            continue
        row = phase_row(record, work, {**prefills[0], "seconds": seconds}, r)
        if row is None:
            continue
        row.update(benchmark=CALL_BENCHMARK, sample_id=f"{row['sample_id']}/call",
                   new_tokens=1 + sum(p.get("kind") == "decode" for p in laps), with_head=True)
        out.append(row)
    return out


def run_call_rows(db: Any) -> pd.DataFrame:
    """Every generation replica's whole call in the run records of the database (`call_rows`)."""
    df = db.run_records()
    rows: list[dict[str, Any]] = []
    for rec in df.to_dict("records") if len(df) else []:
        extra = rec.get("extra")
        if isinstance(extra, Mapping) and isinstance(extra.get("phases"), list) and isinstance(extra.get("work"), Mapping):
            rows += call_rows(rec, extra["work"], extra["phases"])
    return pd.DataFrame(rows)


def run_task_rows(db: Any, skipped: list[str] | None = None) -> pd.DataFrame:
    """Every usable phase of every run record in the database, as task-row samples."""
    df = db.run_records()
    rows: list[dict[str, Any]] = []
    dropped = 0
    for rec in df.to_dict("records") if len(df) else []:
        extra = rec.get("extra")
        if not isinstance(extra, Mapping) or not isinstance(extra.get("phases"), list):
            continue
        work = extra.get("work") if isinstance(extra.get("work"), Mapping) else {}
        for seq, phase in enumerate(extra["phases"]):
            row = phase_row(rec, work, phase, seq) if isinstance(phase, Mapping) else None
            if row is None:
                dropped += 1
            else:
                rows.append(row)
    if dropped and skipped is not None:
        skipped.append(f"{dropped} recorded run phases that are not task rows (pipeline stages or missing fields)")
    return pd.DataFrame(rows)
