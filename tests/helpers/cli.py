"""The CLI run in-process as a user's terminal shows it."""

from __future__ import annotations

import re

import yaml
from click.testing import CliRunner

from hetprof.cli import cli

NARROW = 64  # columns of a narrow terminal

# A two-host, two-region cluster and a small GRPO workload: the plan command's usual inputs.
CLUSTER = {"name": "duo", "hosts": [
    {"name": "a", "gpus": {"type": "A100-40GB", "count": 2}, "region": "east"},
    {"name": "b", "gpus": {"type": "L4", "count": 2}, "region": "west"}],
    "network": {"inter_region": {"latency": "10ms", "bandwidth": "5Gbps"}}}
WORKLOAD = {"name": "tiny-grpo", "algorithm": "grpo", "models": {"actor": "qwen3-0.6b"}, "prompts_per_step": 8,
            "responses_per_prompt": 4, "prompt_len": {"mean": 64, "max": 128},
            "response_len": {"mean": 128, "max": 512, "dist": "lognormal", "std": 100},
            "training": {"recompute": True}}


def write(tmp_path, name: str, data: dict) -> str:
    """`data` as a YAML file `name` under `tmp_path`; its path."""
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def invoke(*args: str, columns: int = NARROW):
    """`hetprof ARGS` in a terminal `columns` wide."""
    return CliRunner().invoke(cli, list(args), env={"COLUMNS": str(columns)}, catch_exceptions=False)


def printed_names(output: str) -> list[str]:
    """The first cell of every table row `db list` printed: the names it offers."""
    return [m.group(1) for m in re.finditer(r"^│ (\S+)\s+│", output, re.M)]
