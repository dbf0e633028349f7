"""Profile-database throughput: bulk insert, 8 concurrent writers, and export / import / merge at 10⁶ samples.

Everything is measured in one run, side by side, because this machine is shared and absolute times
drift; the ratios (8 writers vs one, merge vs import) are what to compare between runs.

    .venv/bin/python bench/db_bench.py            # 10⁶ samples per database (the issue's figure)
    .venv/bin/python bench/db_bench.py --quick    # 10⁵, for a fast look
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hetprof.profiles import DeviceInfo, ProfileDB, export, import_file, merge

PER_RUN = 10_000  # samples per benchmark run: a large profiler sweep writes batches of this order


def _samples(n: int, offset: int, tag: int) -> list[dict]:
    return [{"params": {"m": 64 + (offset + i) % 4096, "n": 1024, "k": 4096, "dtype": "bf16", "tag": tag},
             "metrics": {"seconds": 1e-4 + (offset + i) * 1e-9, "tflops": 100.0 + (i % 97)}}
            for i in range(n)]


def fill(path: Path, total: int, tag: int) -> float:
    """Write `total` samples in runs of PER_RUN; returns seconds spent inside the database calls."""
    spent = 0.0
    with ProfileDB(path) as db:
        dev = db.add_device(DeviceInfo(name=f"bench-{tag}", kind="cpu", host=f"host-{tag}", catalog_type="cpu"))
        for start in range(0, total, PER_RUN):
            batch = _samples(min(PER_RUN, total - start), start, tag)
            t0 = time.perf_counter()
            db.add_benchmark("compute.matmul", dev, f"host-{tag}", {"start": start, "tag": tag}, batch)
            spent += time.perf_counter() - t0
    return spent


def _writer(path: str, tag: int, total: int, barrier) -> None:
    barrier.wait()
    fill(Path(path), total, tag)


def concurrent(path: Path, writers: int, per_writer: int) -> float:
    """Wall seconds for `writers` processes to each write `per_writer` samples into one database."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(writers + 1)
    procs = [ctx.Process(target=_writer, args=(str(path), 100 + w, per_writer, barrier)) for w in range(writers)]
    for p in procs:
        p.start()
    barrier.wait()
    t0 = time.perf_counter()
    for p in procs:
        p.join()
    elapsed = time.perf_counter() - t0
    if any(p.exitcode for p in procs):
        raise SystemExit(f"a writer failed: exit codes {[p.exitcode for p in procs]}")
    return elapsed


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000, help="samples per database")
    parser.add_argument("--quick", action="store_true", help="10⁵ samples instead of 10⁶")
    args = parser.parse_args()
    n = 100_000 if args.quick else args.samples
    console = Console()
    with tempfile.TemporaryDirectory(prefix="hetprof-dbbench-") as tmp:
        root = Path(tmp)
        a, b = root / "a.db", root / "b.db"
        console.print(f"filling two databases with {n:,} samples each …")
        t_bulk = fill(a, n, tag=1)
        fill(b, n, tag=2)
        one = 80_000
        t_one = concurrent(root / "one.db", 1, one)
        t_eight = concurrent(root / "eight.db", 8, one // 8)  # the same rows, split over 8 writers
        with ProfileDB(root / "eight.db") as db:
            assert db.counts()["samples"] == one, "rows were lost under concurrent writers"

        out = root / "a.hetprof.gz"
        with ProfileDB(a, readonly=True) as db:
            t_export = timed(export, db, out)
        with ProfileDB(root / "imported.db") as db:
            t_import = timed(import_file, db, out)
            assert db.counts()["samples"] == n
        with ProfileDB(b) as db:
            t_merge = timed(merge, db, a)
            assert db.counts()["samples"] == 2 * n
            t_again = timed(merge, db, a)
            assert db.counts()["samples"] == 2 * n

    table = Table(title=f"profile database, {n:,} samples per database")
    for col in ("figure", "measured", "goal"):
        table.add_column(col, justify="right" if col != "figure" else "left")
    table.add_row("bulk insert", f"{n / t_bulk:,.0f} rows/s", "≥ 50,000 rows/s")
    table.add_row("8 writers / 1 writer (aggregate rows/s)", f"{t_one / t_eight:.2f}×", "no rows lost")
    table.add_row("export", f"{t_export:.1f} s", "")
    table.add_row("import into an empty database", f"{t_import:.1f} s", "")
    table.add_row("merge two databases", f"{t_merge:.1f} s", "≤ 15 s")
    table.add_row("merge again (idempotent, adds nothing)", f"{t_again:.1f} s", "")
    table.add_row("merge / import", f"{t_merge / t_import:.2f}×", "")
    console.print(table)


if __name__ == "__main__":
    main()
