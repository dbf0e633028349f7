"""`hetprof profile`: measure this host's devices, collectives, links and RL tasks into the database."""

from __future__ import annotations

import click

from hetprof.cli import RegistryOption, db_option, db_path
from hetprof.errors import SpecError

DEFAULT_MODELS_CPU = "tiny,tiny-2x"
DEFAULT_MODELS_GPU = "qwen3-4b,qwen3-8b,qwen3-14b"


def _split(values: tuple[str, ...] | str | None) -> list[str]:
    if not values:
        return []
    if isinstance(values, str):
        values = (values,)
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def _models(text: str | None, on_gpu: bool):
    from hetprof.specs.models import PRESETS, resolve_model

    out = []
    for ref in _split(text or (DEFAULT_MODELS_GPU if on_gpu else DEFAULT_MODELS_CPU)):
        try:
            out.append(resolve_model(ref))
        except KeyError:
            raise SpecError("command line", "--models",
                            f"a preset ({', '.join(PRESETS)}) or a Hugging Face config.json path", ref) from None
    return out


def _workload(workload_file: str | None, cluster_file: str | None, chosen: list[str], models: str | None,
              on_gpu: bool) -> tuple[list, dict]:
    """Models and extra task points for --workload (with --models, both model lists are profiled)."""
    if workload_file is None:
        if cluster_file is not None:
            raise SpecError("command line", "--cluster", "--workload too (the cluster only sizes its batches)",
                            cluster_file)
        return _models(models, on_gpu), {}
    import os

    from hetprof.profiler.workloadgrid import workload_models, workload_points
    from hetprof.specs import ClusterSpec, WorkloadSpec

    workload = WorkloadSpec.load(workload_file)
    if cluster_file is not None:
        count = len(ClusterSpec.load(cluster_file).devices())
    else:
        count = len(chosen) if on_gpu else (os.cpu_count() or 1)
    shapes = workload_models(workload)
    for extra in _models(models, on_gpu) if models else []:
        if extra not in shapes:
            shapes.append(extra)
    return shapes, workload_points(workload, count)


def _suites() -> list[str]:
    from hetprof.profiler.registry import available_suites

    return available_suites()


@click.command("profile")
@db_option
@click.option("--suite", "suites", multiple=True, metavar="S,...", cls=RegistryOption, names=lambda: _suites(),
              help="suites to run (default: those marked default by --list-suites; link runs when asked or "
                   "with --nnodes > 1)")
@click.option("--device", "devices", multiple=True, metavar="cpu|cuda:N", help="devices to profile")
@click.option("--all-gpus", is_flag=True, help="profile every local GPU (in parallel where independent)")
@click.option("--quick", is_flag=True, help="a small but meaningful sweep (this CPU machine in < 2 min)")
@click.option("--models", metavar="M,...", help=f"model presets or HF config paths for the tasks suite "
              f"(default: {DEFAULT_MODELS_CPU} on CPU, {DEFAULT_MODELS_GPU} on GPU)")
@click.option("--workload", "workload_file", type=click.Path(dir_okay=False), metavar="W.yaml",
              help="also time the task shapes this workload runs (its models, per-replica batches, prompt "
                   "and sequence lengths), so the fitted model is measured where the plan will ask it")
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False), metavar="C.yaml",
              help="with --workload: the cluster it will run on (how many data-parallel replicas to expect; "
                   "default: the devices profiled here, or this machine's cores)")
@click.option("--tasks", "task_names", metavar="T,...", help="task kernels to time: prefill,decode,train,generate")
@click.option("--layers-run", type=click.IntRange(min=1), help="blocks to run per model (default: whole "
              "model for tiny presets, 2 blocks otherwise)")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), help="task dtype (default: bf16 on "
              "GPU, fp32 on CPU)")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="CPU threads while measuring (a cpu worker slot is one core)")
@click.option("--host", help="this host's name in the database (default: the hostname)")
@click.option("--region", help="this host's region (link suite)")
@click.option("--nnodes", type=click.IntRange(min=1), default=1, show_default=True,
              help="hosts taking part in the link suite")
@click.option("--node-rank", type=click.IntRange(min=0), default=0, show_default=True, help="this host's rank")
@click.option("--rdzv", metavar="HOST:PORT", help="rendezvous endpoint (torchrun's c10d store on rank 0)")
@click.option("--rdzv-id", default="hetprof-link", show_default=True, help="rendezvous run id")
@click.option("--local-addr", help="this host's address for the other hosts (default: the one routing to --rdzv)")
@click.option("--per-region", is_flag=True, help="link suite: one representative host pair per region pair")
@click.option("--link-target-s", type=click.FloatRange(min=0.01), help="link suite: seconds the largest "
              "message should take (default 0.4, quick 0.25)")
@click.option("--max-message", metavar="SIZE", help="collectives: largest message (e.g. 256MiB; default "
              "1GiB on GPUs, 64MiB on CPU, less with --quick)")
@click.option("--list-suites", is_flag=True, help="list the available suites and exit")
def profile(suites, devices, all_gpus, quick, models, workload_file, cluster_file, task_names, layers_run, dtype, threads, host, region,
            nnodes, node_rank, rdzv, rdzv_id, local_addr, per_region, link_target_s, max_message, list_suites) -> None:
    """Measure devices, collectives, links and RL tasks into the profile database.

    \b
    Examples:
      hetprof profile --quick                                   # this machine, small sweep
      hetprof profile --quick --suite tasks --models tiny,tiny-2x
      hetprof profile --all-gpus                                # every local GPU, full sweep
      hetprof profile --suite tasks --workload W.yaml --cluster C.yaml   # + the job's own shapes
      hetprof profile --suite link --nnodes 2 --node-rank 0 --rdzv 10.0.0.1:29400 --region eu
    """
    import socket
    import time

    from rich.console import Console

    from hetprof.profiler import devices as devmod
    from hetprof.profiler import hostinfo, registry
    from hetprof.profiler.report import ProgressView, summary_table
    from hetprof.profiler.runner import ProfileOptions, run_profile

    console = Console(stderr=True)
    if list_suites:
        for name in registry.available_suites():
            cls = registry.get_suite(name)
            click.echo(f"{name:12s} {cls.scope:8s} {'default' if cls.default else 'on request':10s} {cls.help}")
        return
    names = _split(suites) or None
    if nnodes > 1 and names is None:
        names = ["link"]
    if names and "link" in names:
        if not rdzv:
            raise SpecError("command line", "--rdzv", "HOST:PORT of the rendezvous (rank 0's address)", None)
        if node_rank >= nnodes:
            raise SpecError("command line", "--node-rank", f"a rank below --nnodes ({nnodes})", node_rank)
    max_bytes = None
    if max_message:
        from hetprof.specs.units import parse_size

        try:
            max_bytes = int(parse_size(max_message))
        except ValueError as exc:
            raise SpecError("command line", "--max-message", "a size such as 64MiB", max_message) from exc
    tasks = _split(task_names)
    bad = [t for t in tasks if t not in ("prefill", "decode", "train", "generate")]
    if bad:
        raise SpecError("command line", "--tasks", "prefill, decode, train or generate", ",".join(bad))
    chosen = devmod.select_devices(devices, all_gpus)
    on_gpu = any(d != "cpu" for d in chosen)
    if not on_gpu:
        ok, why = hostinfo.nvml_status()
        cpu = hostinfo.cpu_info()
        console.print(f"[yellow]No GPU profiled ({why or 'CPU chosen'}): measuring the CPU[/] — "
                      f"{cpu['model']}, {cpu['cores']} cores, "
                      f"{(cpu['memory_bytes'] or 0) / 2**30:.1f} GiB, {threads} thread(s) per measurement",
                      soft_wrap=True)
    shapes, points = _workload(workload_file, cluster_file, chosen, models, on_gpu)
    opts = ProfileOptions(
        db_path=db_path(), suites=names, devices=devices, all_gpus=all_gpus, quick=quick,
        models=shapes, threads=threads, host=host or socket.gethostname(),
        options={"tasks": tasks, "workload_points": points, "layers_run": layers_run, "dtype": dtype, "region": region, "nnodes": nnodes,
                 "node_rank": node_rank, "rdzv": rdzv, "rdzv_id": rdzv_id, "local_addr": local_addr,
                 "per_region": per_region, "link_target_s": link_target_s,
                 "collective_max_bytes": max_bytes})
    start = time.perf_counter()
    notes: list[str] = []
    with ProgressView(console) as view:
        summary = run_profile(opts, view.add, notes.append)
    console.print(summary_table(summary, time.perf_counter() - start, opts.db_path))
    for text in notes:
        console.print(f"[yellow]note:[/] {text}", soft_wrap=True)
