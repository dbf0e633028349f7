"""Writes docs/results.md, the guide's one page of measured figures, from the benches' own code.

The page is generated, never edited by hand: its header names this command and the commit it ran
at. By default it runs only what is quick and deterministic (the published bench's predicted vs
published table on the committed catalog, under a second); the heavier parts are behind flags.

    .venv/bin/python bench/results_page.py                       # or: make results
    .venv/bin/python bench/results_page.py --loso --trials 150   # + leave-one-source-out (minutes)
    .venv/bin/python bench/results_page.py --planner-rows 12 --planner-evals 1000   # + the planner grid
    .venv/bin/python bench/results_page.py --out /tmp/results.md # somewhere else (the docs check's dry run)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import published_bench as pb
import published_calibration as cal
from published_cases import load_cases
from rich.table import Table
from rich.text import Text

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "results.md"
COMMAND = "make results"


def plain(cell: object) -> str:
    """A rich cell (markup string or Text) as Markdown table text."""
    text = cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain
    return text.replace("|", "\\|").replace("\n", " ").strip()


def markdown_table(table: Table) -> str:
    """A bench's rich table as a Markdown table: the same rows and columns, markup dropped."""
    header = [plain(c.header) or " " for c in table.columns]
    columns = [[plain(cell) for cell in c.cells] for c in table.columns]
    align = ["---:" if c.justify == "right" else "---" for c in table.columns]
    lines = [f"**{plain(table.title)}**", ""] if table.title else []
    lines += ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in zip(*columns, strict=True)]
    return "\n".join(lines)


def commit() -> str:
    """The commit the page was generated at, marked when the tree had other changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD")
    dirty = [line for line in git("status", "--porcelain").splitlines() if not line.endswith("docs/results.md")]
    return head + (" (with uncommitted changes)" if dirty else "")


def published_section(loso: bool, trials: int, seed: int) -> list[str]:
    """bench/published_bench.py's tables on the committed catalog (factors 1: nothing refitted)."""
    cases = load_cases()
    priced = cal.price_all(cases, cal.catalog_with(dict(cal.NEUTRAL), cal.builtin_data()))
    folds = cal.leave_one_source_out(cases, trials, seed) if loso else None
    out = ["## Published runs: predicted vs published step time", "",
           "Each case is a public RL framework's measured step, priced by the simulator at the layout the "
           "run used, with the committed GPU catalog (one set of constants for every case). "
           "What the columns mean: [Benchmarks](benchmarks.md#published-runs). Source: "
           f"`bench/published_bench.py{'' if loso else ' --no-loso'}`"
           f"{f' (leave-one-source-out: {trials} trials a fold, seed {seed})' if loso else ''}.", "",
           markdown_table(pb.summary_table(priced, folds)), ""]
    if folds:
        out += [markdown_table(pb.folds_table(folds)), ""]
    out += ["### Per case", ""]
    for p in priced:
        out += [markdown_table(pb.case_table(p)), ""]
    return out


def planner_section(rows: int, evals: int, seed: int) -> list[str]:
    """bench/planner_bench.py's rows on the first `rows` of its 12-row subset, every search on the
    same evaluation budget (deterministic: no clock decides anything)."""
    import planner_bench as plb
    from planner_checks import subset12

    from hetprof.costmodels import get_cost_model

    args = plb.options().parse_args(["--equal-evals", str(evals), "--no-ilp", "--seed", str(seed)])
    args.budget_s = 60.0
    cm = get_cost_model("analytical")
    table = Table(title=f"hetrl against the baselines, every search {evals} evaluations, seed {seed} "
                        "(HetRL 64-GPU cluster, analytical cost model)")
    for col in ("scenario", "model", "alg", "mode", "hetrl s/iter", "÷best", "÷verl", "÷streamrl", "÷arealhex",
                "hetrl $/iter", "best baseline $/iter", "evaluations hetrl/verl/streamrl/arealhex"):
        table.add_column(col, justify="left" if col in ("scenario", "model", "alg", "mode") else "right")
    for key in subset12()[:rows]:
        r = plb.run_row(*key, args, cm)
        evaluations = "/".join(str(r.get(f"{k}_evals", "—")) for k in ("hetrl", "verl", "streamrl", "arealhex"))
        table.add_row(r["scenario"], r["model"], r["algorithm"], r["mode"], f"{r['hetrl_iter_s']:.2f}",
                      *(plb.fmt(r.get(k, float("nan"))) for k in ("best", "verl", "streamrl", "arealhex")),
                      f"${r['hetrl_cost']:.3f}", f"${r['best_baseline_cost']:.3f}", evaluations)
    return ["## Planner: hetrl against the baselines", "",
            "Throughput of hetrl over each search's plan on the same simulator (÷x: x's iteration time over "
            "hetrl's). Source: `bench/planner_bench.py --subset12 --equal-evals "
            f"{evals} --no-ilp --no-scale --limit {rows}`.", "", markdown_table(table), ""]


def page(args: argparse.Namespace, flags: Sequence[str]) -> str:
    """The whole page; `flags` are the command line's, named in the header so it can be rerun as is."""
    shown = [f for f in flags if not f.startswith("--out")]
    command = f"python bench/results_page.py {' '.join(shown)}" if shown else COMMAND
    lines = [f"<!-- GENERATED by `{command}` at commit {commit()}. Do not edit by hand: rerun the command. -->",
             "", "# Results", "",
             f"!!! note \"Generated, not written\"\n    This page is generated by `{command}` at commit "
             f"`{commit()}` from the benches' own code. Do not edit it by hand; rerun the command and commit "
             "what it writes. Other figures are whatever the benches print ([Benchmarks](benchmarks.md)).", ""]
    lines += published_section(args.loso, args.trials, args.seed)
    if args.planner_rows:
        lines += planner_section(args.planner_rows, args.planner_evals, args.seed)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=PAGE, help="where to write the page (default docs/results.md)")
    ap.add_argument("--loso", action="store_true", help="add leave-one-source-out (refits per source; minutes)")
    ap.add_argument("--trials", type=int, default=150, help="optuna trials per leave-one-source-out fit")
    ap.add_argument("--planner-rows", type=int, default=0, help="add the planner grid's first N subset rows")
    ap.add_argument("--planner-evals", type=int, default=1000, help="evaluations per search in the planner rows")
    ap.add_argument("--seed", type=int, default=0)
    flags = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(flags)
    if "--out" in flags:  # its value is no flag of the page's content
        del flags[flags.index("--out") + 1]
    args.out.write_text(page(args, flags))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
