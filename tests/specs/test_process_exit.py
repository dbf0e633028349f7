"""A worker that finished ends after its exit handlers but without the interpreter's module teardown."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import atexit, sys
    from pathlib import Path
    from hetprof.safety.processes import skip_teardown_at_exit

    out = Path(sys.argv[1])

    class TornDown:
        def __del__(self):  # runs only in module teardown
            (out / "teardown").write_text("ran")

    keep = TornDown()
    atexit.register(lambda: (out / "handler").write_text("ran"))
    if sys.argv[2] == "ok":
        skip_teardown_at_exit()
    else:
        sys.exit(3)
""")


def _run(tmp_path: Path, how: str) -> int:
    return subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), how], timeout=60).returncode


def test_a_finished_worker_runs_its_exit_handlers_and_skips_teardown(tmp_path):
    assert _run(tmp_path, "ok") == 0
    assert (tmp_path / "handler").read_text() == "ran"
    assert not (tmp_path / "teardown").exists()


def test_a_failing_worker_keeps_its_exit_code_and_its_teardown(tmp_path):
    assert _run(tmp_path, "fail") == 3
    assert (tmp_path / "handler").exists() and (tmp_path / "teardown").exists()
