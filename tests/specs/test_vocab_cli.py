"""The CLI root: every stage's command is listed and loads, and user errors print one line, no traceback."""

from __future__ import annotations

import subprocess

import click
from click.testing import CliRunner
from helpers.commands import hetprof_cmd

from hetprof.cli import LazyGroup, cli


def test_help_lists_the_pipeline():
    out = subprocess.run(hetprof_cmd() + ["--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for command in ("profile", "db", "fit", "plan", "run", "validate"):
        assert f"  {command}" in out.stdout
    assert "unavailable" not in out.stdout, out.stdout


def test_every_command_has_its_own_help():
    runner = CliRunner()
    for command in ("profile", "db", "fit", "plan", "run", "validate"):
        result = runner.invoke(cli, [command, "--help"])
        assert result.exit_code == 0, (command, result.output)
        assert "Usage:" in result.output and "unavailable" not in result.output


def test_version():
    out = subprocess.run(hetprof_cmd() + ["--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "hetprof" in out.stdout


def test_a_broken_plugin_is_listed_as_unavailable_and_explains_itself(monkeypatch):
    class FakeEntry:
        name = "broken"
        value = "no_such_module:cmd"

        def load(self):
            raise ModuleNotFoundError("No module named 'no_such_module'")

    monkeypatch.setattr(LazyGroup, "_entries", lambda self: {"broken": FakeEntry()})
    group = LazyGroup(name="hetprof")
    ctx = click.Context(group)
    cmd = group.get_command(ctx, "broken")
    assert "unavailable" in cmd.get_short_help_str()
    result = CliRunner().invoke(group, ["broken"])
    assert result.exit_code == 2
    assert "no_such_module" in result.output and "Traceback" not in result.output


def test_help_lists_read_the_registries_so_a_registered_name_shows_up(monkeypatch):
    from hetprof.executor import backends
    from hetprof.planner import search

    runner = CliRunner()

    def help_of(command: str) -> str:  # click wraps help lines: compare with whitespace collapsed
        return " ".join(runner.invoke(cli, [command, "--help"]).output.split())

    plan_help = help_of("plan")
    assert all(name in plan_help for name in (*search.available_searches(), "all", "analytical", "fitted"))
    monkeypatch.setattr(backends, "available_backends", lambda: ["hf", "vllm", "my-engine"])
    run_help = help_of("run")
    assert "one of: hf, vllm, my-engine" in run_help and "arithmetic" in run_help
    assert "one of: inventory, compute, memory" in help_of("profile")
