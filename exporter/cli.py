"""`hetprof export PLAN --to verl|areal`: write what a framework needs to run a hetprof plan."""

from __future__ import annotations

from pathlib import Path

import click

from hetprof.cli import RegistryOption


def _targets() -> list[str]:
    from hetprof.exporter import available_targets

    return available_targets()


@click.command("export")
@click.argument("plan_path", type=click.Path(dir_okay=False))
@click.option("--to", "target", required=True, cls=RegistryOption, names=lambda: _targets(),
              help="framework to export to")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="folder to write into [default: PLAN's name with -TARGET]")
def export(plan_path: str, target: str, out_dir: str | None) -> None:
    """Write the config, Ray node resources and launch script that run PLAN under verl or AReaL.

    A plan the framework cannot express is refused in one line naming the feature; re-plan with
    `hetprof plan --target TARGET`.

    \b
    Examples:
      hetprof export plan.json --to verl
      hetprof export plan.json --to areal --out areal-run
    """
    from hetprof.exporter import get_target
    from hetprof.specs import Plan

    plan = Plan.load(plan_path)
    out = Path(out_dir) if out_dir else Path(plan_path).with_suffix("").with_name(f"{Path(plan_path).stem}-{target}")
    for path in get_target(target).export(plan, plan_path, out):
        click.echo(f"wrote {path}")
