"""The CLI root: every stage's command is listed, and user errors print one line, no traceback."""

from __future__ import annotations

import subprocess

from conftest import hetprof_cmd


def test_help_lists_the_pipeline():
    out = subprocess.run(hetprof_cmd() + ["--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for command in ("profile", "db", "fit", "plan", "run", "validate"):
        assert f"  {command}" in out.stdout


def test_version():
    out = subprocess.run(hetprof_cmd() + ["--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "hetprof" in out.stdout
