"""Reference profiles: published microbenchmark figures shipped with the package, imported on request.

`profiles/reference/figures.yaml` holds the figures with their citations; each top-level entry is
built into `profiles/reference/NAME.hetprof.gz` — the `hetprof db export` format, so importing one
goes through exactly the checks any shared file does. Every run is stored with source `reference`
and carries its citation in its params; calibration prefers measured rows to them
(costmodels/calibration.py), so a team's own measurements always win.

Rebuild the shipped files after editing the figures: `python -m hetprof.profiles.references`.
"""

from __future__ import annotations

import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from hetprof.errors import ProfileDBError
from hetprof.profiles.db import DeviceInfo, ProfileDB
from hetprof.profiles.share import export, import_file

REFERENCE = "reference"
FIGURES = "figures.yaml"
SUFFIX = ".hetprof.gz"
REFERENCE_HOST = "reference"
CITATION_KEYS = ("title", "url", "where", "date")


def reference_dir() -> Path:
    return Path(str(resources.files("hetprof.profiles") / "reference"))


def names() -> list[str]:
    """The reference profiles the package ships (file stems)."""
    return sorted(p.name[: -len(SUFFIX)] for p in reference_dir().glob(f"*{SUFFIX}"))


def reference_file(name: str) -> Path:
    path = reference_dir() / f"{name}{SUFFIX}"
    if not path.exists():
        raise ProfileDBError(f"no reference profile {name!r} (shipped: {', '.join(names()) or 'none'})")
    return path


def import_reference(db: ProfileDB, name: str) -> dict[str, int]:
    """Import one shipped reference profile (idempotent: rows are content-addressed)."""
    return import_file(db, reference_file(name))


def load_figures(path: Path | None = None) -> dict[str, Any]:
    """The figures file, with each run's citation complete and its rows as wide as its columns."""
    path = path or reference_dir() / FIGURES
    data = yaml.safe_load(path.read_text())
    for name, entry in data.items():
        for i, run in enumerate(entry["runs"]):
            where = f"{path}: {name}.runs[{i}]"
            missing = [k for k in CITATION_KEYS if not run.get("citation", {}).get(k)]
            if missing:
                raise ValueError(f"{where}.citation: missing {', '.join(missing)}")
            if any(len(row) != len(run["columns"]) for row in run["rows"]):
                raise ValueError(f"{where}.rows: every row needs {len(run['columns'])} values")
    return data


def samples(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A run's rows as profiler-style samples: shape parameters and metrics (seconds where derivable)."""
    out = []
    for row in run["rows"]:
        values = dict(zip(run["columns"], row, strict=True))
        metrics = {k: float(values.pop(k)) for k in list(values)
                   if k in ("tflops", "bandwidth_Bps", "busbw_Bps", "busbw_GBps", "time_us")}
        if "tflops" in metrics:
            metrics["seconds"] = 2.0 * values["m"] * values["n"] * values["k"] / (metrics["tflops"] * 1e12)
        if "time_us" in metrics:
            metrics["seconds"] = metrics.pop("time_us") * 1e-6
        if "busbw_GBps" in metrics:
            metrics["busbw_Bps"] = metrics.pop("busbw_GBps") * 1e9
        if "seconds" not in metrics and run["benchmark"] == "collective.all_reduce" and "busbw_Bps" in metrics:
            n = run["params"]["world"]  # nccl-tests: busbw = size / time × 2(n−1)/n for an all-reduce
            metrics["seconds"] = values["size_bytes"] * 2 * (n - 1) / n / metrics["busbw_Bps"]
        out.append({"params": {**run["params"], **values}, "metrics": metrics})
    return out


def build(name: str, entry: dict[str, Any], out: Path) -> dict[str, int]:
    """Write one reference profile (export format) from its figures entry."""
    with tempfile.TemporaryDirectory() as tmp, ProfileDB(Path(tmp) / "ref.db") as db:
        dev = entry["device"]
        device_id = db.add_device(DeviceInfo(name=dev["name"], kind=dev["kind"], catalog_type=dev["catalog_type"],
                                             host=REFERENCE_HOST, extra={"reference": name}, source=REFERENCE))
        for run in entry["runs"]:
            params = {**run["params"], "citation": run["citation"]}
            db.add_benchmark(run["benchmark"], device_id, REFERENCE_HOST, params, samples(run), source=REFERENCE)
        return export(db, out)


def main(argv: list[str] | None = None) -> int:
    """Rebuild every shipped reference profile from figures.yaml."""
    for name, entry in load_figures().items():
        out = reference_dir() / f"{name}{SUFFIX}"
        counts = build(name, entry, out)
        print(f"{out}: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
