"""Where a planned run's time goes, shape by shape: what each task recorded, what the profile measured
at that shape, and what the fitted model answers there, beside the task's measured and planned time.

Reads a folder `bench/executor_bench.py --keep DIR` left (profiles.db, run-N.jsonl, run-N.plan.json).
A run records each task's work as the profiler's rows (one pass of the shape the plan priced; a
packed training row is one pack's pass plus the step's one optimizer step, `packs` of them a
step), so the three columns on the left should agree up to the run factor, and a task whose
measured and planned times disagree while its rows agree points at pricing, not at the model.

    .venv/bin/python bench/run_rows.py DIR
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hetprof.costmodels.data import Phase
from hetprof.costmodels.features import phase_features
from hetprof.costmodels.fitted import FittedCostModel
from hetprof.executor.records.run_log import read_log
from hetprof.profiles import ProfileDB
from hetprof.specs.models import ModelShape


def recorded_rows(records: list[dict]) -> dict[tuple[str, str, int], list[dict]]:
    """(task, kind, batch) → the phases the run recorded at that batch (any length), over its records."""
    out: dict[tuple[str, str, int], list[dict]] = {}
    for rec in records:
        for task, phases in (rec.get("phase_times") or {}).items():
            for p in phases:
                out.setdefault((task, p["kind"], int(p["batch"])), []).append(p)
    return out


def profile_median(samples, kind: str, batch: int, tokens: int) -> float | None:
    key = "context_len" if kind == "decode" else "seq_len"
    sel = samples[(samples["benchmark"] == f"task.{kind}") & (samples["batch"] == batch) & (samples[key] == tokens)]
    if "recompute" in sel:
        sel = sel[~sel["recompute"].fillna(False).astype(bool)]
    return float(sel["seconds"].median()) if len(sel) else None


def fitted(cm: FittedCostModel, model: ModelShape, kind: str, batch: int, tokens: int) -> tuple[float, float] | None:
    """(profile-only answer, with the run factor) of the newest fit at this shape."""
    loaded = cm.lookup(kind, "cpu", "fp32")
    if loaded is None:
        return None
    x = phase_features(Phase(kind, model, model.layers, batch, tokens, with_head=True, dtype="fp32"), "cpu")
    answer = loaded.predict(x)
    return answer / loaded.run_factor, answer


def run_table(log: Path, samples, cm: FittedCostModel) -> Table:
    records = read_log(log)
    steady = records[2:] if len(records) > 4 else records[1:]
    table = Table(title=f"{log.name}: recorded rows vs profile vs fit (ms, medians; newest fit)")
    for col in ("task", "rows", "packs", "recorded", "profile", "fit", "fit × run", "recorded / fit × run",
                "task measured", "task planned"):
        table.add_column(col, justify="left" if col in ("task", "rows") else "right")
    ms = lambda v: f"{v * 1e3:.2f}" if v is not None else "—"  # noqa: E731
    med = lambda vs: statistics.median(vs) if vs else None  # noqa: E731
    for (task, kind, batch), phases in sorted(recorded_rows(steady).items()):
        shape = steady[0]["work"][task]["model"]
        model = ModelShape(name=shape["name"], family="qwen3", tie_embeddings=True, **{
            k: shape[k] for k in ("layers", "hidden", "ffn", "heads", "kv_heads", "head_dim", "vocab")})
        answers = [fitted(cm, model, kind, batch, int(p["tokens"])) for p in phases]
        profiled = [profile_median(samples, kind, batch, int(p["tokens"])) for p in phases]
        tokens = sorted(int(p["tokens"]) for p in phases)
        ratio = med([p["seconds"] / a[1] for p, a in zip(phases, answers, strict=True) if a])
        table.add_row(task, f"{kind} {batch}×{tokens[0]}–{tokens[-1]} ({len(phases)})",
                      f"{med([float(p.get('packs', 1.0)) for p in phases]):.2f}",
                      ms(med([p["seconds"] for p in phases])), ms(med([v for v in profiled if v is not None])),
                      ms(med([a[0] for a in answers if a])), ms(med([a[1] for a in answers if a])),
                      f"{ratio:.2f}" if ratio else "—",
                      ms(med([r["stages"][task] for r in steady if task in r["stages"]])),
                      ms(steady[0]["predicted"].get(task)))
    return table


def main() -> None:
    folder = Path(sys.argv[1])
    with ProfileDB(folder / "profiles.db") as db:
        samples = db.samples("task.")
        cm = FittedCostModel(db)
    for log in sorted(folder.glob("run-*.jsonl")):
        Console(width=200).print(run_table(log, samples, cm))


if __name__ == "__main__":
    main()
