"""The README's exit-code table is true: every example command in it exits with its row's code."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from hetprof.cli import cli
from hetprof.errors import ExecutionError, HetprofError, InfeasibleError, SpecError

ROOT = Path(__file__).resolve().parents[2]


def exit_code_rows() -> list[tuple[int, str, str]]:
    """(code, example command, the row's note) for every row of the table under '### Exit codes'."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("### Exit codes", 1)[1].split("\n\n", 2)[1]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].isdigit():
            continue
        for example in re.findall(r"`(hetprof [^`]+)`", cells[2]):
            rows.append((int(cells[0]), example, cells[2]))
    return rows


ROWS = exit_code_rows()


def test_the_table_is_there_and_covers_every_designed_code():
    assert {code for code, _, _ in ROWS} == {0, 2, 3, 4}
    assert (HetprofError.exit_code, SpecError.exit_code, InfeasibleError.exit_code, ExecutionError.exit_code) == (
        2, 2, 3, 4)


@pytest.mark.parametrize(("code", "example", "note"), ROWS, ids=[f"{c}:{e[:50]}" for c, e, _ in ROWS])
def test_each_example_exits_with_its_code(tmp_path, monkeypatch, code, example, note):
    if "without CUDA" in note and torch.cuda.is_available():
        pytest.skip("the example needs a machine without CUDA")
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # the examples' relative paths, outputs in tmp
    monkeypatch.chdir(tmp_path)
    result = None
    for command in example.split(" && "):
        args = shlex.split(command)
        assert args[0] == "hetprof"
        result = CliRunner().invoke(cli, args[1:])
        if result.exit_code != 0:
            break
    assert result is not None and result.exit_code == code, (example, result.output)
    if code:
        assert "Traceback" not in result.output and "error" in result.output.lower()
