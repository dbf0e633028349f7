"""Profiler benchmark: does the link suite see the bandwidth a link really has, and how long is --quick?

Measured side by side in one run:
  * for three tbf-shaped rates between two network-namespace "hosts", the fitted β of each
    direction against the configured rate (goal: ratio 0.95–1.05);
  * the wall time of `hetprof profile --quick` on this machine against the 120 s goal.

    .venv/bin/python bench/profiler_bench.py [--quick]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from hetprof.runtime.distributed import unassigned_port

HETPROF = str(Path(sys.executable).parent / "hetprof")
QUICK_GOAL_S = 120.0


def link_rows(rates: list[float], quick: bool, workdir: Path) -> list[tuple]:
    from hetprof.profiler import testbed
    from hetprof.profiles import ProfileDB

    ok, why = testbed.available()
    if not ok:
        return [(f"link @ {r:g} Mbit/s", "-", "-", f"skipped: {why}", "") for r in rates]
    rows = []
    db = workdir / "links.db"
    with testbed.shaped_pair(rates[0], tag="b") as pair:
        for rate in rates:
            pair = pair.shape(rate)
            port = unassigned_port()
            procs = []
            start = time.perf_counter()
            for side in (0, 1):
                cmd = [HETPROF, "--db", str(db), "profile", "--suite", "link", "--nnodes", "2",
                       "--node-rank", str(side), "--rdzv", f"{pair.addr[0]}:{port}", "--rdzv-id", f"b{rate:g}",
                       "--host", f"h{side}-{rate:g}", *(["--quick"] if quick else [])]
                procs.append(subprocess.Popen(pair.argv(side, cmd), stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True))
            outs = [p.communicate(timeout=300)[0] for p in procs]
            took = time.perf_counter() - start
            if any(p.returncode for p in procs):
                rows.append((f"link @ {rate:g} Mbit/s", "-", "-", "FAILED", outs[0][-300:] + outs[1][-300:]))
                continue
            with ProfileDB(db) as pdb:
                links = pdb.links()
            links = links[links["src_host"].str.endswith(f"-{rate:g}")]
            for _, link in links.sort_values("src_host").iterrows():
                fitted = link["beta_Bps"] * 8 / 1e6
                ratio = fitted / rate
                rows.append((f"link {link['src_host']}→{link['dst_host']}", f"{rate:g} Mbit/s",
                             f"{fitted:.2f} Mbit/s", f"{ratio:.3f}",
                             f"{'ok' if 0.95 <= ratio <= 1.05 else 'MISSED'} (0.95–1.05); α {link['alpha_s'] * 1e3:.2f} ms, "
                             f"resid {link['residual']:.3f}, both sides {took:.0f} s"))
    return rows


def quick_profile_row(workdir: Path) -> tuple:
    start = time.perf_counter()
    done = subprocess.run([HETPROF, "--db", str(workdir / "quick.db"), "profile", "--quick"],
                          capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode:
        return ("hetprof profile --quick", f"{QUICK_GOAL_S:.0f} s", "-", "FAILED", done.stderr[-300:])
    ratio = took / QUICK_GOAL_S
    return ("hetprof profile --quick", f"≤ {QUICK_GOAL_S:.0f} s", f"{took:.1f} s", f"{ratio:.2f}",
            f"{'ok' if ratio <= 1 else 'MISSED'} (≤ 1.00)")


def _plain_median(fn, repeats: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def suite_rows(workdir: Path) -> list[tuple]:
    """The compute and memory suites on one thread against plain torch timed just before and after
    them (the better of the two: the machine is shared)."""
    import torch

    from hetprof.profiler.context import ProfileContext
    from hetprof.profiler.suites.compute import ComputeSuite
    from hetprof.profiler.suites.memory import MemorySuite, sizes_for
    from hetprof.profiles import ProfileDB

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    a, b = torch.rand(1024, 1024) + 0.5, torch.rand(1024, 1024) + 0.5
    size = sizes_for("cpu", True)[0]
    src = torch.rand(size // 4) + 0.5
    dst = torch.empty_like(src)
    try:
        def plain() -> tuple[float, float]:
            return (2 * 1024**3 / _plain_median(lambda: a @ b) / 1e12,
                    2 * size / _plain_median(lambda: dst.copy_(src)))

        before = plain()
        with ProfileDB(workdir / "suites.db") as db:
            ctx = ProfileContext(db=db, host="bench", device="cpu", device_id=None, quick=True, threads=1,
                                 devices=["cpu"])
            ComputeSuite().run(ctx)
            MemorySuite().run(ctx)
            matmul, copy = db.samples("compute.matmul"), db.samples("memory.copy")
        after = plain()
    finally:
        torch.set_num_threads(threads)
    tflops = matmul[(matmul.m == 1024) & (matmul.n == 1024) & (matmul.k == 1024)]["tflops"].median()
    bandwidth = copy[copy.size_bytes == size]["bandwidth_Bps"].median()
    rows = []
    for what, ours, ref, unit, scale in (("compute.matmul 1024³ fp32", tflops, max(before[0], after[0]), "TFLOP/s", 1),
                                         (f"memory.copy {size >> 20} MiB", bandwidth, max(before[1], after[1]),
                                          "GB/s", 1e-9)):
        ratio = ours / ref
        rows.append((f"{what}, 1 thread", f"plain torch {ref * scale:.3g} {unit}", f"{ours * scale:.3g} {unit}",
                     f"{ratio:.2f}", f"{'ok' if 0.5 < ratio < 2.0 else 'MISSED'} (0.5–2)"))
    return rows


@click.command()
@click.option("--quick", is_flag=True, help="shorter link sweeps (the quick profile is timed either way)")
@click.option("--rates", default="50,200,800", show_default=True, help="shaped link rates in Mbit/s")
def main(quick: bool, rates: str) -> None:
    rate_list = [float(r) for r in rates.split(",")]
    with tempfile.TemporaryDirectory(prefix="hetprof-bench-") as tmp:
        rows = link_rows(rate_list, quick, Path(tmp))
        rows.extend(suite_rows(Path(tmp)))
        rows.append(quick_profile_row(Path(tmp)))
    table = Table(title="profiler bench: configured vs measured (one run, side by side)")
    for col in ("what", "configured / goal", "measured", "ratio", "verdict"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    console = Console(width=160)
    console.print(table)
    console.print("tbf counts layer-2 bytes; the testbed's veth uses 9000-byte frames so headers cost < 1% "
                  "of the configured rate.")


if __name__ == "__main__":
    main()
