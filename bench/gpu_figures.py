"""What a GPU session measured, read back from its profile database, run log and plan.

`bench/gpu_session.py` runs this in a subprocess that imports the hetprof the kit installed (the
session itself imports only the standard library, so that it can install the kit first):

    python bench/gpu_figures.py cluster DB OUT.yaml      # a one-host cluster spec of the profiled device
    python bench/gpu_figures.py summary DB REFS.yaml LOG PLAN OUT.json

The summary sets each measurement beside the catalog's datasheet peak (hetprof/data/gpus.yaml), what
the catalog's efficiency curve predicts for that kernel, and the reference figure measured on such
machines (bench/gpu_references.yaml), and the run's measured beside the plan's predicted seconds per
task and per iteration (`hetprof validate`'s summary). A part whose input is missing is left out,
so a session cut short still reports what it finished.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

from hetprof.executor.records.predicted_vs_measured import load_records, summary
from hetprof.profiles import ProfileDB
from hetprof.specs.catalog import builtin

VALIDATE_SKIP = 1  # leading iterations `hetprof validate` leaves out (start-up)


def this_device(db: ProfileDB) -> dict[str, Any]:
    """The profiled device: the GPU if one was measured, else the CPU."""
    devices = db.devices()
    devices = devices[devices["source"] == "measured"]
    if not len(devices):
        raise SystemExit(f"{db.path}: no measured device (the inventory step did not run)")
    gpus = devices[devices["kind"] == "cuda"]
    return (gpus if len(gpus) else devices).iloc[-1].to_dict()


def cluster_spec(db_path: Path) -> dict[str, Any]:
    """This machine as a cluster of one device of its catalog type."""
    with ProfileDB(db_path, readonly=True) as db:
        device = this_device(db)
    kind = device["catalog_type"]
    if not kind:
        raise SystemExit(f"{device['name']} is not a GPU type of the catalog (hetprof/data/gpus.yaml): add it "
                         "with a cluster spec's gpu_types section to plan on it")
    return {"name": f"this-{kind.lower()}", "hosts": [{"name": "localhost", "gpus": {"type": kind, "count": 1},
                                                       "region": "local"}]}


def _reference(refs: dict, kind: str, what: str) -> dict | None:
    return ((refs.get("gpus") or {}).get(kind) or {}).get(what)


def _verdict(measured: float, reference: float | None, tolerance: float) -> dict[str, Any]:
    if not reference:
        return {"reference": None, "ratio": None, "within_tolerance": None}
    ratio = measured / reference
    return {"reference": reference, "ratio": ratio, "within_tolerance": abs(ratio - 1) <= tolerance}


def matmul_rows(db: ProfileDB, kind: str, refs: dict) -> list[dict[str, Any]]:
    """Per dtype: best and median TFLOP/s, the datasheet peak and the curve's prediction at the best
    shape's rows, and the reference figure at its shape."""
    df = db.samples("compute.matmul")
    if not len(df):
        return []
    gpu = builtin().lookup(kind)
    ref = _reference(refs, kind, "matmul")
    out = []
    for dtype, rows in df.groupby("dtype"):
        best = rows.loc[rows["tflops"].idxmax()]
        try:
            peak = gpu.peak_flops(dtype) / 1e12
        except KeyError:  # no datasheet figure for this dtype (fp8)
            peak = None
        row = {"dtype": dtype, "best_tflops": float(best["tflops"]), "median_tflops": float(rows["tflops"].median()),
               "best_shape": [int(best["m"]), int(best["n"]), int(best["k"])], "datasheet_tflops": peak,
               "datasheet_fraction": float(best["tflops"]) / peak if peak else None,
               "catalog_predicted_tflops": peak * gpu.efficiency.matmul(float(best["m"])) if peak else None}
        if ref and ref["dtype"] == dtype:
            m, n, k = ref["shape"]
            at = rows[(rows["m"] == m) & (rows["n"] == n) & (rows["k"] == k)]["tflops"]
            row["reference_shape"] = [m, n, k]
            row["reference_shape_best_tflops"] = float(at.max()) if len(at) else None
            row.update(_verdict(float(at.max()), ref["tflops"], refs["tolerance"]) if len(at) else {})
            row["reference_source"] = ref["source"]
        out.append(row)
    return out


def copy_row(db: ProfileDB, kind: str, refs: dict) -> dict[str, Any] | None:
    """Best and median device-to-device copy bandwidth against the datasheet, the curve and the reference."""
    df = db.samples("memory.copy")
    if not len(df):
        return None
    gpu = builtin().lookup(kind)
    best = df.loc[df["bandwidth_Bps"].idxmax()]
    tbps = float(best["bandwidth_Bps"]) / 1e12
    ref = _reference(refs, kind, "copy")
    row = {"best_TBps": tbps, "median_TBps": float(df["bandwidth_Bps"].median()) / 1e12,
           "best_size_bytes": int(best["size_bytes"]), "datasheet_TBps": gpu.hbm_Bps / 1e12,
           "datasheet_fraction": float(best["bandwidth_Bps"]) / gpu.hbm_Bps,
           "catalog_predicted_TBps": gpu.hbm_Bps * gpu.efficiency.memory(2.0 * float(best["size_bytes"])) / 1e12}
    row.update(_verdict(tbps, ref["TBps"] if ref else None, refs["tolerance"]))
    row["reference_source"] = ref["source"] if ref else None
    return row


def task_rows(db: ProfileDB) -> list[dict[str, Any]]:
    """Per task kernel and model: points, samples, blocks run and the median seconds."""
    df = db.samples("task.")
    if not len(df):
        return []
    length = df["seq_len"].fillna(df["context_len"]) if "context_len" in df else df["seq_len"]
    df = df.assign(length=length)
    out = []
    for (bench, model), rows in df.groupby(["benchmark", "model"], sort=False):
        out.append({"task": bench.removeprefix("task."), "model": model, "layers_run": int(rows["layers_run"].max()),
                    "points": int(rows.groupby(["batch", "length"]).ngroups), "samples": len(rows),
                    "median_s": float(rows["seconds"].median())})
    return out


def run_summary(log: Path, plan: Path) -> dict[str, Any] | None:
    """The run's measured against the plan's predicted seconds, per task and per iteration."""
    if not log.is_file():
        return None
    records = load_records(str(log), None)
    rewards = [r["reward_mean"] for r in records if "reward_mean" in r]
    out: dict[str, Any] = {"iterations": len(records), "skip": VALIDATE_SKIP,
                           "predicted_vs_measured": summary(records, VALIDATE_SKIP),
                           "reward_first": rewards[0] if rewards else None,
                           "reward_last": rewards[-1] if rewards else None,
                           "tokens_per_s": statistics.median(r["tokens_per_s"] for r in records
                                                             if "tokens_per_s" in r) if records else None}
    if plan.is_file():
        data = json.loads(plan.read_text())
        out["plan"] = {"cost_model": data.get("cost_model"), "search": data.get("search"),
                       "predicted_iteration_s": (data.get("predicted") or {}).get("iteration_s"),
                       "bottleneck": (data.get("predicted") or {}).get("bottleneck")}
    return out


def device_summary(db: ProfileDB) -> dict[str, Any]:
    """The device's fingerprint and its last inventory readings (NVML: clocks, power, PCIe, NVLink)."""
    device = this_device(db)
    inv = db.samples("inventory.device")
    readings = {}
    if len(inv):
        first = inv[inv["device_id"] == device["id"]].head(1)
        readings = {k: v for k, v in first.iloc[0].to_dict().items() if v == v and v is not None} if len(first) else {}
        for key in ("sample_id", "run_id", "benchmark", "device_id", "device_name", "seq", "run_source"):
            readings.pop(key, None)
    keys = ("name", "kind", "catalog_type", "memory_bytes", "host", "driver", "cuda", "torch")
    return {**{k: device[k] for k in keys}, "extra": device["extra"], "inventory": readings}


def summarise(db_path: Path, refs_path: Path, log: Path, plan: Path) -> dict[str, Any]:
    refs = yaml.safe_load(refs_path.read_text())
    with ProfileDB(db_path, readonly=True) as db:
        device = device_summary(db)
        kind = device["catalog_type"] or "cpu"
        return {"device": device, "matmul": matmul_rows(db, kind, refs), "copy": copy_row(db, kind, refs),
                "tasks": task_rows(db), "run": run_summary(log, plan), "tolerance": refs["tolerance"],
                "reference_sources": refs.get("sources", {})}


def main(argv: list[str]) -> None:
    what, *paths = argv
    if what == "cluster":
        db, out = map(Path, paths)
        out.write_text(yaml.safe_dump(cluster_spec(db), sort_keys=False))
    else:
        db, refs, log, plan, out = map(Path, paths)
        out.write_text(json.dumps(summarise(db, refs, log, plan), indent=2, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
