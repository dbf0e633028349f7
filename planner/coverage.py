"""What the profile database lacks for one job: one line per task whose shapes or engine it has no rows of.

The fitted cost model answers any shape — a model it has no rows of from the rows of other models (or
the roofline where a whole task type is missing), a generation engine whose calls it never timed with
the `hf` loop's per-call term — but those answers are extrapolations, and a plan made on them says
nothing about it. So before planning, each task of the job is checked against the database: rows of
its phases (prefill, decode, train) of its model's shape, in the job's dtype, on every GPU type of the
cluster; for generation also whole calls of the plan's engine; for an MoE model also its grouped expert
GEMMs (`moe.experts`, the `moe` suite), which price its routed experts once `hetprof fit` has learned
them (the catalog curve answers otherwise). A task that lacks any is named in one line with the
`hetprof profile` command that measures what is missing.

A shape is matched by the model's dimensions, not its name: a preset and the HF config it came from
are the same rows.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

import pandas as pd

from hetprof.planner.graph import build_graph
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.specs.catalog import canonical_name
from hetprof.specs.models import ModelShape
from hetprof.specs.vocabulary import MoeBenchmark, TaskKind

# The phases a task of each kind is priced from (costmodels.features.TASK_PHASE's benchmarks).
KIND_BENCHMARKS = {TaskKind.GENERATION: ("task.prefill", "task.decode"), TaskKind.INFERENCE: ("task.prefill",),
                   TaskKind.TRAINING: ("task.train",)}
CALLS = "task.generate"  # whole generation calls (costmodels/calloverhead.py)
DEFAULT_ENGINE = "hf"    # the engine of a call row without `backend`
# The profiler suites: the one timing the phases (its `generate` rows are the hf engine's whole calls),
# and the one timing each engine's whole calls; an engine without one (static) is not checked.
PHASE_SUITE = "tasks"
ENGINE_SUITES = {"hf": PHASE_SUITE, "vllm": "vllmgen"}
SHAPE_COLUMNS = ("hidden", "ffn", "heads", "kv_heads", "head_dim", "vocab")
MOE_SUITE = "moe"  # times an MoE model's router, grouped expert GEMMs and all-to-all


def _shape_rows(rows: pd.DataFrame, model: ModelShape) -> pd.DataFrame:
    """The rows of `model`'s shape (every dimension column equal)."""
    keep = pd.Series(True, index=rows.index)
    for col in SHAPE_COLUMNS:
        if col not in rows:
            return rows.iloc[0:0]
        keep &= pd.to_numeric(rows[col], errors="coerce") == float(getattr(model, col))
    return rows[keep]


def _types(rows: pd.DataFrame) -> set[str]:
    return {canonical_name(c) or c for c in rows["catalog_type"].dropna().astype(str)} if "catalog_type" in rows else set()


def _db_rows(rows: pd.DataFrame, dtype: str) -> pd.DataFrame:
    """The task rows (`db.samples(benchmark="task.")`) of one dtype (absent dtype: bf16, as `hetprof fit`
    reads them)."""
    if not len(rows) or "benchmark" not in rows:
        return pd.DataFrame(columns=["benchmark", "catalog_type", "backend", "dtype", *SHAPE_COLUMNS])
    rows = rows.copy()
    rows["dtype"] = rows["dtype"].fillna("bf16") if "dtype" in rows else "bf16"
    rows = rows[rows["dtype"] == dtype]
    rows["backend"] = rows["backend"].fillna(DEFAULT_ENGINE) if "backend" in rows else DEFAULT_ENGINE
    return rows


def _expert_types(rows: pd.DataFrame, model: ModelShape) -> set[str]:
    """The device types with `moe.experts` rows of `model`'s expert shape (hidden, expert width)."""
    if model.moe is None or not len(rows) or not {"hidden", "expert_ffn"} <= set(rows.columns):
        return set()
    same = ((pd.to_numeric(rows["hidden"], errors="coerce") == float(model.hidden))
            & (pd.to_numeric(rows["expert_ffn"], errors="coerce") == float(model.moe.expert_ffn)))
    return _types(rows[same])


def missing_rows(db: Any, workload: WorkloadSpec, cluster: ClusterSpec, engine: str,
                 samples: pd.DataFrame | None = None,
                 experts: pd.DataFrame | None = None) -> dict[str, list[tuple[str, str]]]:
    """Per task of the job, what the database has no rows of and the profiler suite that measures it
    (("task.decode of tiny on cpu", "tasks"), ("hf generation calls of tiny on cpu", "tasks"),
    ("moe.experts of tiny-moe on cpu", "moe")); tasks it has everything for are left out. `samples`:
    the database's task rows, `experts` its `moe.experts` rows, when the caller read them."""
    samples = db.samples(benchmark="task.") if samples is None else samples
    experts = db.samples(benchmark=MoeBenchmark.EXPERTS) if experts is None else experts
    by_dtype: dict[str, pd.DataFrame] = {}
    moe_by_dtype: dict[str, pd.DataFrame] = {}
    types = sorted({canonical_name(d.type) or d.type for d in cluster.devices()})
    graph = build_graph(workload)
    out: dict[str, list[tuple[str, str]]] = {}
    for task in graph.tasks:
        kind, model = graph.kind_of(task), graph.model_of(task)
        dtype = workload.dtype_of(kind)  # a task's own precision (FP8 generation beside bf16 training)
        if dtype not in by_dtype:
            by_dtype[dtype] = _db_rows(samples, dtype)
        shaped = _shape_rows(by_dtype[dtype], model)
        missing = []
        for bench in KIND_BENCHMARKS[kind]:
            lacking = [t for t in types if t not in _types(shaped[shaped["benchmark"] == bench])]
            if lacking:
                missing.append((f"{bench} of {model.name} on {', '.join(lacking)}", PHASE_SUITE))
        if kind == TaskKind.GENERATION and engine in ENGINE_SUITES:
            calls = shaped[(shaped["benchmark"] == CALLS) & (shaped["backend"] == engine)]
            lacking = [t for t in types if t not in _types(calls)]
            if lacking:
                missing.append((f"{engine} generation calls of {model.name} on {', '.join(lacking)}",
                                ENGINE_SUITES[engine]))
        if model.moe is not None:
            if dtype not in moe_by_dtype:
                moe_by_dtype[dtype] = _db_rows(experts, dtype)
            lacking = [t for t in types if t not in _expert_types(moe_by_dtype[dtype], model)]
            if lacking:
                missing.append((f"{MoeBenchmark.EXPERTS} of {model.name} on {', '.join(lacking)}", MOE_SUITE))
        if missing:
            out[task] = missing
    return out


def profile_command(suites: Sequence[str], workload_path: str, cluster_path: str, db_path: str) -> str:
    """The `hetprof profile` command that measures a job's shapes (--workload, sized by --cluster)."""
    return shlex.join(["hetprof", "profile", "--db", db_path, "--suite", ",".join(suites), "--workload",
                       workload_path, "--cluster", cluster_path])


def coverage_warnings(db: Any, workload: WorkloadSpec, cluster: ClusterSpec, engine: str, workload_path: str,
                      cluster_path: str, db_path: str) -> list[str]:
    """One line per task the database lacks rows for, with the command that profiles them (on a host of
    each GPU type named)."""
    samples = db.samples(benchmark="task.")
    if not len(samples):  # nothing profiled: the fitted model's own warning names every GPU type once,
        return []         # and one line per task adds nothing
    graph = build_graph(workload)
    lines = []
    for task, missing in missing_rows(db, workload, cluster, engine, samples).items():
        suites = list(dict.fromkeys(suite for _, suite in missing))
        what = "; ".join(m for m, _ in missing)
        lines.append(f"{task}: the profile database has no rows of {what} "
                     f"({workload.dtype_of(graph.kind_of(task))}), "
                     f"so its time is extrapolated; profile them: {profile_command(suites, workload_path, cluster_path, db_path)}")
    return lines

