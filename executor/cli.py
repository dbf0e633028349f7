"""`hetprof run` and `hetprof validate`: carry a plan out, then hold its prediction against the measurement."""

from __future__ import annotations

import os
from pathlib import Path

import click

from hetprof.cli import RegistryOption, db_option, db_path, existing_db_path


def _backends() -> list[str]:
    from hetprof.executor.backends import available_backends

    return available_backends()


def _recorded_run(source: str) -> str:
    """SOURCE itself if it is a log file, else the full name of the one stored run it names (exit 2 if none);
    resolved as the argument is parsed (--db is eager, so it is known by then)."""
    from hetprof.errors import HetprofError

    if os.path.lexists(source):  # a FIFO or device is refused by the reader, naming it
        return source
    if source.endswith((".jsonl", ".json", ".log")) or os.sep in source:
        raise HetprofError(f"{source}: no such run log file")
    from hetprof.profiles import ProfileDB
    from hetprof.profiles.names import RUN, resolve

    with ProfileDB(existing_db_path(), readonly=True) as db:
        return resolve(db.conn, source, kinds=(RUN,)).key


def _rewards() -> list[str]:
    from hetprof.executor.runners.rewards import available_rewards

    return available_rewards()


@click.command("run")
@click.argument("plan", type=click.Path(exists=True, dir_okay=False))
@click.option("--iterations", type=int, default=20, show_default=True, help="RL iterations to run in total")
@click.option("--backend", default=None, cls=RegistryOption, names=lambda: _backends(),
              help="generation backend; default: the one the plan was made for, and another is refused")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False), help="where checkpoints go (none: no checkpoints)")
@click.option("--checkpoint-every", type=int, default=5, show_default=True, help="iterations between checkpoints")
@click.option("--resume", is_flag=True, help="continue from the last complete checkpoint in --checkpoint-dir")
@click.option("--log", "log", type=click.Path(dir_okay=False), help="JSONL log, one record per iteration (appended)")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of weights, data and sampling")
@click.option("--prompts", type=click.Path(),
              help="prompt file (.jsonl .json .parquet .arrow .csv, or a saved dataset folder) with the workload's "
                   "data.prompt_field/answer_field; default: data.prompts, else built-in arithmetic")
@click.option("--reward", default="arithmetic", show_default=True, cls=RegistryOption, names=lambda: _rewards(),
              help="reward by name, path/to/file.py:function (a file of yours), or module:function (an installed "
                   "module)")
@click.option("--nnodes", type=int, default=1, show_default=True, help="hosts taking part (one `hetprof run` each)")
@click.option("--node-rank", type=int, default=0, show_default=True, help="which of the plan's hosts this is")
@click.option("--rdzv", help="HOST:PORT of node 0's rendezvous (multi-host runs)")
@click.option("--local-addr", help="this host's address as the others reach it (multi-homed hosts)")
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True,
              help="seconds a worker waits for a peer before the run is stopped (hung-worker bound)")
@click.option("--bucket-mb", type=float, default=32.0, show_default=True, help="weight-sync bucket size")
@click.option("--verify-sync", is_flag=True, help="check after every sync that generators hold the trainer's "
              "weights bitwise (hashes; costs one pass over the weights)")
@click.option("--quiet", is_flag=True, help="no per-iteration console lines and no progress bar")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="override the plan's workload: optimizer.*, data.*, training.lr … (repeatable; YAML values)")
@click.option("--tensorboard-dir", type=click.Path(file_okay=False),
              help="TensorBoard event files go to DIR/<run name>; default: tensorboard/ beside --log, else ./tensorboard")
@click.option("--no-tensorboard", is_flag=True, help="write no TensorBoard event file")
@click.option("--wandb", "wandb_project", metavar="PROJECT",
              help="also log to this Weights & Biases project (pip install 'hetprof[wandb]'; WANDB_MODE=offline "
                   "keeps it local); its files go beside --log, else in the current folder")
@click.option("--trace", "trace_dir", type=click.Path(file_okay=False),
              help="write a torch.profiler (Chrome/Perfetto) trace per rank to this folder")
@click.option("--trace-iterations", type=click.IntRange(min=1), default=2, show_default=True,
              help="iterations the --trace covers (after the first, which warms up)")
@click.option("--allow-prompts-outside", is_flag=True,
              help="let the plan's data.prompts/data.validation name files outside the plan's folder "
                   "(refused by default: a shared plan must not read your files elsewhere)")
@db_option
def run(plan: str, iterations: int, backend: str | None, checkpoint_dir: str | None, checkpoint_every: int, resume: bool,
        log: str | None, seed: int, prompts: str | None, reward: str, nnodes: int, node_rank: int, rdzv: str | None,
        local_addr: str | None, timeout_s: float, bucket_mb: float, verify_sync: bool, quiet: bool,
        tensorboard_dir: str | None, no_tensorboard: bool, trace_dir: str | None, trace_iterations: int,
        overrides: tuple[str, ...] = (), allow_prompts_outside: bool = False, wandb_project: str | None = None
        ) -> None:
    """Run PLAN (a plan JSON from `hetprof plan`) with one worker process per planned device.

    \b
    Single host:   hetprof run plan.json --iterations 20 --log run.jsonl --checkpoint-dir ckpt
    Resume:        hetprof run plan.json --iterations 20 --log run.jsonl --checkpoint-dir ckpt --resume
    Two hosts:     hetprof run plan.json --nnodes 2 --node-rank 0 --rdzv 10.0.0.1:29400   (on host 0)
                   hetprof run plan.json --nnodes 2 --node-rank 1 --rdzv 10.0.0.1:29400   (on host 1)
    Measured stage times go to the log, the console, TensorBoard and the profile database (run records).
    """
    from hetprof.executor.launch.elastic import launch
    from hetprof.executor.options import RunOptions
    from hetprof.profiles import ProfileDB

    # The leader writes run records into --db only after training starts: a database someone else
    # made is checked now, before any worker, as every other command checks it when it opens it.
    if Path(db_path()).exists():
        ProfileDB(db_path(), readonly=True).close()
    options = RunOptions(
        plan_path=os.path.abspath(plan), iterations=iterations, backend=backend,
        checkpoint_dir=os.path.abspath(checkpoint_dir) if checkpoint_dir else None,
        checkpoint_every=checkpoint_every, resume=resume, log=os.path.abspath(log) if log else None,
        db=str(db_path()), seed=seed, prompts=os.path.abspath(prompts) if prompts else None,
        reward=_reward_spec(reward),
        timeout_s=timeout_s, bucket_mb=bucket_mb, verify_sync=verify_sync, quiet=quiet, overrides=overrides,
        tensorboard_dir=None if no_tensorboard else _tensorboard_root(tensorboard_dir, log),
        wandb_project=wandb_project, wandb_dir=_beside_log(log) if wandb_project else None,
        trace_dir=os.path.abspath(trace_dir) if trace_dir else None, trace_iterations=trace_iterations,
        allow_prompts_outside=allow_prompts_outside)
    launch(options, nnodes=nnodes, node_rank=node_rank, rdzv=rdzv, local_addr=local_addr)


def _reward_spec(reward: str) -> str:
    """A file reward's path made absolute, so every worker loads the file the user named."""
    from hetprof.executor.runners.rewards import is_file_spec

    if not is_file_spec(reward):
        return reward
    where, _, attr = reward.rpartition(":")
    return f"{os.path.abspath(os.path.expanduser(where))}:{attr}"


def _tensorboard_root(given: str | None, log: str | None) -> str:
    """The run's TensorBoard root: as given, else beside the run's log, else under the current folder."""
    if given:
        return os.path.abspath(given)
    return os.path.join(_beside_log(log), "tensorboard")


def _beside_log(log: str | None) -> str:
    """The folder of the run's log, else the current folder: where a run's own outputs go by default."""
    return os.path.dirname(os.path.abspath(log)) if log else os.getcwd()


@click.command("validate")
@click.argument("source", callback=lambda _ctx, _param, value: _recorded_run(value))
@click.option("--skip", type=int, default=1, show_default=True,
              help="leading iterations left out of the summary (start-up, warm caches)")
@click.option("--gantt", type=click.Path(dir_okay=False),
              help="also draw one iteration's measured timeline above the plan's predicted one (PNG)")
@click.option("--iteration", type=int, default=None,
              help="the iteration --gantt draws; default: the steady one of median time")
@db_option
def validate(source: str, skip: int, gantt: str | None, iteration: int | None) -> None:
    """Print predicted (from the plan) against measured, per task and per iteration.

    SOURCE is a run's JSONL log, or a run id whose records are in the profile database.

    \b
    Timeline:  hetprof validate run.jsonl --gantt run.png
    """
    from hetprof.executor.records.predicted_vs_measured import load_records, render

    if gantt:
        from hetprof.executor.records.measured_gantt import check_gantt_path

        check_gantt_path(gantt)
    records = load_records(source, db_path())
    render(records, skip=skip)
    if gantt:
        from hetprof.executor.records.measured_gantt import save_measured_gantt

        click.echo(f"timeline: {save_measured_gantt(records, gantt, skip=skip, iteration=iteration)}")
