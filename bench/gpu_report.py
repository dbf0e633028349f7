"""The GPU session's report: report.json (everything) and report.md (the tables a reader wants).

Written by `bench/gpu_session.py` from what its steps left: the step outcomes (status, seconds, cap,
why, the last lines of a failed step's output), the kit's versions, and the figures
`bench/gpu_figures.py` read back (absent parts are said to be absent, never guessed).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def _f(x: Any, spec: str = ".3g") -> str:
    return "—" if x is None else format(x, spec)


def _pct(x: Any) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def _yes(x: Any) -> str:
    return "—" if x is None else ("yes" if x else "**no**")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(r) + " |" for r in rows], ""]


def _steps(results: list[Any]) -> list[str]:
    lines = ["## Steps", ""]
    lines += _table(["step", "status", "seconds", "cap s", "why"],
                    [[r.name, r.status, f"{r.seconds:.1f}", f"{r.cap_s:.0f}", r.why] for r in results])
    for r in results:
        if r.tail:
            lines += [f"Last lines of `{r.name}` ({r.status}):", "", "```", *r.tail, "```", ""]
    return lines


def _device(d: dict) -> list[str]:
    extra, inv = d.get("extra") or {}, d.get("inventory") or {}
    fields = [("name", d.get("name")), ("catalog type", d.get("catalog_type")),
              ("memory", f"{(d.get('memory_bytes') or 0) / 2**30:.1f} GiB"), ("driver", d.get("driver")),
              ("CUDA", d.get("cuda")), ("torch", d.get("torch")), ("compute capability", extra.get("capability")),
              ("SMs", extra.get("sm_count")), ("SM clock max / now (MHz)",
                                              f"{_f(extra.get('sm_clock_max_mhz'))} / {_f(inv.get('sm_clock_mhz'))}"),
              ("memory clock max (MHz)", extra.get("mem_clock_max_mhz")),
              ("power limit / now (W)", f"{_f(extra.get('power_limit_w'))} / {_f(inv.get('power_w'))}"),
              ("PCIe max / now", f"gen {_f(extra.get('pcie_gen_max'))} x{_f(extra.get('pcie_width_max'))} / "
                                 f"gen {_f(inv.get('pcie_gen'))} x{_f(inv.get('pcie_width'))}"),
              ("NVLinks active", extra.get("nvlinks_active")), ("NVML", extra.get("nvml"))]
    return ["## Device", "", *_table(["", ""], [[k, "—" if v is None else str(v)] for k, v in fields])]


def _matmul(rows: list[dict], tolerance: float) -> list[str]:
    if not rows:
        return ["## Matmul", "", "not measured", ""]
    header = ["dtype", "best TFLOP/s", "best shape", "median", "datasheet", "of datasheet", "catalog predicts",
              "reference", "at reference shape", "measured / reference", f"within {tolerance:.0%}"]
    body = [[r["dtype"], _f(r["best_tflops"], ".1f"), "×".join(map(str, r["best_shape"])), _f(r["median_tflops"], ".1f"),
             _f(r["datasheet_tflops"]), _pct(r["datasheet_fraction"]), _f(r["catalog_predicted_tflops"]),
             _f(r.get("reference")), _f(r.get("reference_shape_best_tflops"), ".1f"), _f(r.get("ratio"), ".2f"),
             _yes(r.get("within_tolerance"))] for r in rows]
    return ["## Matmul (TFLOP/s)", "", *_table(header, body)]


def _copy(r: dict | None, tolerance: float) -> list[str]:
    if not r:
        return ["## Device-to-device copy", "", "not measured", ""]
    header = ["best TB/s", "median", "at size", "datasheet", "of datasheet", "catalog predicts", "reference",
              "measured / reference", f"within {tolerance:.0%}"]
    body = [[_f(r["best_TBps"], ".2f"), _f(r["median_TBps"], ".2f"), f"{r['best_size_bytes'] / 2**20:.0f} MiB",
             _f(r["datasheet_TBps"], ".2f"), _pct(r["datasheet_fraction"]), _f(r["catalog_predicted_TBps"], ".2f"),
             _f(r.get("reference"), ".2f"), _f(r.get("ratio"), ".2f"), _yes(r.get("within_tolerance"))]]
    return ["## Device-to-device copy (bytes read + written)", "", *_table(header, body)]


def _tasks(rows: list[dict]) -> list[str]:
    if not rows:
        return ["## Task rows profiled", "", "none", ""]
    body = [[r["task"], r["model"], str(r["layers_run"]), str(r["points"]), str(r["samples"]),
             _f(r["median_s"] * 1e3, ".2f")] for r in rows]
    return ["## Task rows profiled", "", *_table(["task", "model", "blocks run", "points", "samples", "median ms"], body)]


def _run(run: dict | None) -> list[str]:
    if not run:
        return ["## GRPO run", "", "no run log", ""]
    plan = run.get("plan") or {}
    lines = ["## GRPO run: measured against the plan's prediction", "",
             f"{run['iterations']} iterations; medians over iterations ≥ {run['skip']}; plan by {plan.get('search')} "
             f"with the {plan.get('cost_model')} cost model (bottleneck {plan.get('bottleneck')}); reward "
             f"{_f(run.get('reward_first'))} → {_f(run.get('reward_last'))}; {_f(run.get('tokens_per_s'), '.0f')} "
             "tokens/s.", ""]
    body = [[task, _f(v["predicted"], ".3f"), _f(v["measured"], ".3f"), _f(v["ratio"], ".2f")]
            for task, v in run["predicted_vs_measured"].items()]
    return lines + _table(["task", "predicted s", "measured s", "measured / predicted"], body)


def _kit(facts: dict) -> list[str]:
    rows = [[v["package"], v["required"] or "—", v["found"] or "—", v["note"] or ""] for v in facts.get("versions", [])]
    return ["## Packages", "", f"kit: {facts.get('kit_install', 'not installed')}", "",
            *_table(["package", "pyproject accepts", "found", ""], rows)]


def markdown(started: datetime, args: dict, results: list[Any], facts: dict, data: dict) -> str:
    device = data.get("device") or {}
    tolerance = data.get("tolerance", 0.1)
    title = f"# GPU session: {device.get('name', 'device unknown')} ({device.get('catalog_type') or '—'}), " \
            f"{started:%Y-%m-%d %H:%M} UTC"
    lines = [title, "", f"`bench/gpu_session.py {' '.join(args.get('argv', []))}`; "
             f"{sum(r.seconds for r in results):.0f} s of steps.", "", *_steps(results)]
    if device:
        lines += _device(device)
    lines += _matmul(data.get("matmul") or [], tolerance) + _copy(data.get("copy"), tolerance)
    lines += _run(data.get("run")) + _tasks(data.get("tasks") or []) + _kit(facts)
    sources = data.get("reference_sources") or {}
    lines += [f"Reference figures: {k}: {v.get('title', '')}" for k, v in sources.items()]
    return "\n".join(lines) + "\n"


def write(out: Path, started: datetime, args: dict, results: list[Any], facts: dict,
          data: dict) -> tuple[Path, Path]:
    """report.md and report.json under `out`."""
    md, js = out / "report.md", out / "report.json"
    md.write_text(markdown(started, args, results, facts, data))
    js.write_text(json.dumps({"started": started.isoformat(), "finished": datetime.now(timezone.utc).isoformat(),
                              "args": args, "steps": [dataclasses.asdict(r) for r in results], "facts": facts,
                              **data}, indent=2, default=str))
    return md, js
