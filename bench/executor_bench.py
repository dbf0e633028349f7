"""Executor benchmark: how close a real run comes to its plan, what the runtime adds, how fast sync is.

Three ratios, each measured side by side in this one run:
- measured / predicted iteration time of a CPU plan, after `hetprof profile` (the task and
  data-parallel training suites in full at the job's shapes, the collectives quick; tiny model) and
  `hetprof fit` have fed the fitted cost model the planner predicts with (goal 0.85–1.15) — and again after that run's own records went back into `hetprof fit` and the
  job was re-planned and run a second time (the loop `hetprof run --db` exists for);
  The run's own prefill, decode and training shapes (profiled exactly, thanks to --workload),
  re-timed right around each run, also give the ratio with the machine's drift since profiling taken out;
  and the refit's plan over the very run it learned from (same layouts) checks that a run's records
  and the plan's pricing describe the same work, with no drift between runs in it;
- executor overhead = measured iteration / sum of the measured stage times (goal ≤ 1.10), i.e. what
  message passing, batching and bookkeeping add to generation, inference, training and sync;
- weight-sync effective bandwidth / a plain gloo broadcast of the same bytes over the same group
  (goal ≥ 0.8): what bucketing, flattening and unflattening cost.

    .venv/bin/python bench/executor_bench.py            # 12 iterations, 64 MB sync model
    .venv/bin/python bench/executor_bench.py --quick    # 6 iterations, 16 MB
    .venv/bin/python bench/executor_bench.py --tensorboard-ab   # the overhead with TensorBoard on vs off
    .venv/bin/python bench/executor_bench.py --vllm     # only the vLLM rows (needs make install-vllm)
    .venv/bin/python bench/executor_bench.py --max-tokens 512   # packed micro-batches of ≤ 512 tokens

The vLLM rows (`--vllm`): measured / predicted iteration of the demo's GRPO job on tiny-2x run with
`--backend vllm` (and of its generation stage and weight sync, which includes the engine's reload), after `hetprof profile --workload` (tasks, dptrain, and vLLM's own calls: vllmgen)
and `hetprof fit`; the run's generation stage over the same call made alone on one engine just
after; and vLLM's generation tokens/s over `hf`'s on that job's per-replica batch, the two engines'
calls alternated in this one process. The planned job is run `--vllm-runs` times (default 3): each
row is the median over the runs, with their range beside it, since one run swings by more than the
goal's width.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rich.console import Console
from rich.table import Table
from torch import nn

from hetprof.distributed import file_init_method, leave_process_group
from hetprof.executor.records import read_log
from hetprof.executor.weightsync import DEFAULT_BUCKET_MB, WeightSync, copy_into, flatten_params

ROOT = Path(__file__).resolve().parents[1]
HETPROF = str(Path(sys.executable).with_name("hetprof"))
WORKLOAD = ROOT / "examples" / "workloads" / "grpo-tiny.yaml"
console = Console()


def hetprof(*args: str, db: Path, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([HETPROF, "--db", str(db), *args], capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        console.print(f"[red]hetprof {' '.join(args)} failed:[/red]\n{done.stderr[-2000:]}")
        sys.exit(done.returncode)
    return done


# ---- 1 and 2: a planned CPU run ---------------------------------------------------------------
def truthful_workload(work: Path, slots: int, spec_file: Path = WORKLOAD, max_tokens: int | None = None) -> Path:
    """The example GRPO workload with the lengths the run will really see.

    A plan is predicted for the workload's lengths, so they should be the data's: the built-in
    arithmetic prompts' lengths (their mean, spread and longest, as a normal distribution), and the
    response cap as the mean, because a random tiny model rarely stops before it. The executor pads
    each generator replica's prompts to its longest and each step's batch to its longest sequence;
    the planner prices those widths from the distribution. Comparing a prediction for other lengths
    with the run would measure the spec, not the model.
    """
    import yaml

    from hetprof.executor.data import PromptSource
    from hetprof.executor.tokenizer import CharTokenizer

    spec = yaml.safe_load(spec_file.read_text())
    tok = CharTokenizer()
    source = PromptSource.builtin(spec["prompts_per_step"], seed=0)
    lengths = [len(tok.encode(p.text)) for step in range(64) for p in source.batch(step)]
    spec["prompt_len"] = {"mean": round(statistics.mean(lengths), 2), "max": max(lengths), "dist": "normal",
                          "std": round(statistics.pstdev(lengths), 2)}
    cap = spec["response_len"].get("max") or 2 * spec["response_len"]["mean"]
    spec["response_len"] = {"mean": cap, "max": cap}
    if max_tokens:  # packed token-budget micro-batches in training and inference
        spec["training"]["max_tokens_per_microbatch"] = max_tokens
    path = work / f"workload-{spec_file.stem}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def probe_points(workload: Path, slots: int) -> list[tuple[str, int, int]]:
    """(task, batch, length) points the run's phases are: profiled exactly, thanks to --workload."""
    import numpy as np

    from hetprof.profiler.workloadgrid import LENGTH_SEED, workload_points
    from hetprof.specs import WorkloadSpec
    from hetprof.tokenbudget import packed_shape, step_prompts

    spec = WorkloadSpec.load(workload)
    pts = workload_points(spec, slots)
    batch = -(-spec.sequences_per_step // slots)
    # the padded widths the run computes (and the planner prices): a replica's longest prompt, and
    # the step's longest prompt plus its longest response
    prompt = round(spec.prompt_len.expected_longest(-(-batch // spec.responses_per_prompt)))
    whole = round(spec.prompt_len.expected_longest(spec.prompts_per_step)
                  + spec.response_len.expected_longest(spec.sequences_per_step))
    train = -(-batch // spec.mini_batches)
    budget = spec.training.max_tokens_per_microbatch
    if budget is not None:  # packed: as many sequences per micro-batch as the planner prices, at the means
        responses = np.sort(spec.response_len.sample(spec.sequences_per_step, np.random.default_rng(LENGTH_SEED)))
        train = packed_shape(step_prompts(spec.prompt_len, spec.prompts_per_step), responses, train, budget)[1]
        whole = round(spec.prompt_len.mean + spec.response_len.mean)
    out = [("prefill", batch, prompt), ("decode", batch, prompt + 1), ("train", train, whole)]
    assert all((b, n) in pts[k] for k, b, n in out), "probe points must be profiled points"
    return out


def probe_drift(db: Path, points: list[tuple[str, int, int]]) -> float:
    """How much slower the profiled kernels run now than when they were profiled (geometric mean).

    A shared machine's speed drifts over minutes (other tenants share the host's caches and memory
    bandwidth), and measured / predicted compares a run with rows profiled a minute or two
    earlier. Re-timing a few of those very rows, by the profiler's own method in a fresh process,
    right around the run tells the drift apart from the cost model's error.
    """
    import math

    from hetprof.profiles import ProfileDB

    code = (
        "import json, statistics, torch\n"
        "torch.set_num_threads(1)\n"
        "from hetprof.hostmemory import keep_freed_memory\n"
        "keep_freed_memory()\n"
        "from hetprof.cpuslots import bind_to_slot\n"
        "bind_to_slot(0, 1)\n"
        "from hetprof.models import PRESETS\n"
        "from hetprof.profiler import taskmodels\n"
        "from hetprof.profiler.context import ProfileContext\n"
        "from hetprof.profiler.suites.tasks import TIMERS, grid, time_sweep\n"
        "from hetprof.profiler.timing import Flusher\n"
        "tm = taskmodels.plan_model(PRESETS['tiny'], 'fp32', None)\n"
        "model = taskmodels.build(tm, 'cpu')\n"
        "ctx = ProfileContext(db=None, host='probe', device='cpu', device_id=None, quick=False, threads=1)\n"
        "cpu = torch.device('cpu')\n"
        f"points = {points!r}\n"
        # a point is timed as the profile timed it: in turns with its task's grid, where the task takes turns
        "def probe(k, b, n):\n"
        "    turns = TIMERS[k].in_turns(ctx, b, n)\n"
        "    rest = [p for p in grid('cpu', False, k, tm.shape.max_position) if p != (b, n)] if turns else []\n"
        "    return statistics.median(time_sweep(ctx, TIMERS[k], model, tm, {}, [(b, n), *rest], cpu,"
        " Flusher(cpu, cpu_caches=True), torch.Generator().manual_seed(0))[0])\n"
        "print(json.dumps([probe(k, b, n) for k, b, n in points]))\n")
    now = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                    check=True).stdout.strip().splitlines()[-1])
    with ProfileDB(db) as pdb:
        rows = pdb.samples("task.")
    ratios = []
    for (kind, batch, length), seconds in zip(points, now, strict=True):
        key = "context_len" if kind == "decode" else "seq_len"
        sel = rows[(rows["benchmark"] == f"task.{kind}") & (rows["batch"] == batch) & (rows[key] == length)]
        if "recompute" in sel:
            sel = sel[~sel["recompute"].fillna(False).astype(bool)]
        if len(sel):
            ratios.append(seconds / float(sel["seconds"].median()))
    return math.exp(statistics.mean(math.log(r) for r in ratios)) if ratios else 1.0


def planned_run(work: Path, iterations: int, slots: int, max_tokens: int | None = None) -> list[dict]:
    """Profile → fit → plan → run; then fit on that run's records → plan → run again."""
    db = work / "profiles.db"
    cluster = work / "cluster.yaml"
    cluster.write_text(f"name: bench-cpu\nhosts:\n  - name: localhost\n    gpus: {{type: cpu, count: {slots}}}\n"
                       f"    region: local\n")
    workload = truthful_workload(work, slots, max_tokens=max_tokens)
    t0 = time.perf_counter()
    # The task rows and the data-parallel training steps in full, with the job's own shapes
    # (`--workload`): the quick grid fits worse, CPU kernel times are not smooth in shape, and what
    # a replica's step adds grows with the step (docs/DESIGN.md §10). Collectives quick.
    job = ("--workload", str(workload), "--cluster", str(cluster))
    hetprof("profile", "--suite", "tasks", "--suite", "dptrain", "--models", "tiny", *job, db=db, cwd=work)
    hetprof("profile", "--quick", "--suite", "collectives", "--models", "tiny", db=db, cwd=work)
    prep = time.perf_counter() - t0
    out = []
    for name in ("profile", "profile + run 1"):
        t0 = time.perf_counter()
        # The run's figure is a median iteration, so the model learns each shape's median repeat (the
        # default, the fastest repeat, is the noise-robust choice for ranking plans; a median sits
        # above the fastest repeat on a shared machine).
        hetprof("fit", "--stat", "median", db=db, cwd=work)
        # A data-parallel plan: a 2-layer model gains nothing from TP or PP on CPU slots.
        hetprof("plan", "--cluster", str(cluster), "--workload", str(workload), "--cost-model", "fitted",
                "--search", "hetrl", "--seed", "0", "--max-tp", "1", "--max-pp", "1",
                "--out", str(work / "plan.json"), db=db, cwd=work)
        prep += time.perf_counter() - t0
        points = probe_points(workload, slots)
        before = probe_drift(db, points)
        run = _run(work, db, iterations, name, prep)
        run["drift"] = (before + probe_drift(db, points)) / 2  # > 1: the kernels ran slower than when profiled
        out.append(run)
    return out


def _run(work: Path, db: Path, iterations: int, name: str, prep: float) -> dict:
    log = work / f"run-{len(list(work.glob('run-*.jsonl')))}.jsonl"
    t0 = time.perf_counter()
    hetprof("run", str(work / "plan.json"), "--iterations", str(iterations), "--log", str(log),
            "--seed", "0", "--quiet", db=db, cwd=work)
    wall = time.perf_counter() - t0
    records = read_log(log)
    steady = records[2:] if len(records) > 4 else records[1:]
    measured = statistics.median(r["iteration_s"] for r in steady)
    predicted = steady[0].get("predicted_iteration_s")
    overhead = statistics.median(r["iteration_s"] / sum(r["stages"].values()) for r in steady)
    plan = json.loads((work / "plan.json").read_text())
    log.with_suffix(".plan.json").write_text(json.dumps(plan))  # each run's plan, for --keep
    return {"fitted_on": name, "measured": measured, "predicted": predicted, "overhead": overhead, "prep_s": prep,
            "run_s": wall,
            "iterations": len(records), "layouts": {t["task"]: t["layout"] for t in plan["tasks"]},
            "per_task": {task: (statistics.median(r["stages"][task] for r in steady if task in r["stages"]),
                                steady[0]["predicted"].get(task)) for task in steady[0]["stages"]},
            "replicas": replica_medians(steady),
            "reward_first": records[0]["reward_mean"], "reward_last": records[-1]["reward_mean"]}


def replica_medians(steady: list[dict]) -> dict[str, tuple[list[float], int]]:
    """Per task of several replicas: each replica's median seconds, and in how many steps replica 0
    was the slowest (a stage waits for its slowest; a replica slower in most steps is a rank's own
    work, not chance)."""
    out = {}
    for task in steady[0].get("replicas", {}):
        rows = [r["replicas"][task] for r in steady if len(r["replicas"].get(task, [])) > 1]
        if rows:
            out[task] = ([statistics.median(x[i] for x in rows) for i in range(len(rows[0]))],
                         sum(x[0] > max(x[1:]) for x in rows))
    return out


# ---- 2b: the same overhead with TensorBoard on and off ----------------------------------------
def tensorboard_ab(work: Path, iterations: int, slots: int, pairs: int) -> dict[str, dict[str, float]]:
    """Overhead and iteration time of one data-parallel plan run with TensorBoard on, then off, `pairs`
    times in alternating order (a shared machine's drift falls on both arms alike)."""
    from hetprof.executor.handwritten_plan import handwritten_plan
    from hetprof.specs import ClusterSpec, WorkloadSpec

    cluster = ClusterSpec.from_dict({"name": "bench-cpu", "hosts": [{"name": "localhost",
                                                                     "gpus": {"type": "cpu", "count": slots}}]})
    devices = [f"localhost:{i}" for i in range(slots)]
    workload = WorkloadSpec.load(truthful_workload(work, slots)).to_dict()
    plan = work / "ab-plan.json"
    handwritten_plan(cluster, workload, {"actor_gen": devices, "ref_infer": devices, "actor_train": devices}).save(plan)
    arms: dict[str, list[dict]] = {"on": [], "off": []}
    for i in range(2 * pairs):
        arm = ("on", "off")[(i + i // 2) % 2]  # on off off on on off ...
        log = work / f"ab-{i}-{arm}.jsonl"
        hetprof("run", str(plan), "--iterations", str(iterations), "--log", str(log), "--seed", "0", "--quiet",
                *(() if arm == "on" else ("--no-tensorboard",)), db=work / "ab.db", cwd=work)
        if arm == "on" and not any((work / "tensorboard").rglob("events.out.tfevents.*")):
            raise SystemExit("the TensorBoard arm wrote no event file")
        records = read_log(log)
        arms[arm] += records[2:] if len(records) > 4 else records[1:]
    return {arm: {"overhead": statistics.median(r["iteration_s"] / sum(r["stages"].values()) for r in recs),
                  "iteration_s": statistics.median(r["iteration_s"] for r in recs), "n": len(recs)}
            for arm, recs in arms.items()}


def print_tensorboard_ab(ab: dict[str, dict[str, float]], iterations: int, pairs: int) -> None:
    table = Table(title=f"executor overhead with TensorBoard on vs off ({pairs} pairs of {iterations}-iteration "
                        f"runs, alternated; {os.cpu_count()} cores)")
    for col in ("ratio", "value", "goal", "measured from"):
        table.add_column(col, justify="left" if col in ("ratio", "measured from") else "right")
    for arm in ("on", "off"):
        table.add_row(f"executor overhead, TensorBoard {arm}", f"{ab[arm]['overhead']:.3f}", "≤ 1.10",
                      f"iteration / sum of stage times, median of {ab[arm]['n']} steady iterations")
    table.add_row("iteration time, on / off", f"{ab['on']['iteration_s'] / ab['off']['iteration_s']:.3f}", "≈ 1",
                  f"medians {ab['on']['iteration_s'] * 1e3:.1f} vs {ab['off']['iteration_s'] * 1e3:.1f} ms")
    console.print(table)


# ---- 3: weight sync vs plain broadcast ------------------------------------------------------
def sync_model(total_mb: float) -> nn.Module:
    """Transformer-like parameter shapes: big matrices and many small norm vectors."""
    hidden = 512
    per_layer = 4 * hidden * hidden * 4 + 2 * hidden * 4  # bytes of 4 matrices + 2 norms
    layers = max(1, int(total_mb * 1e6 // per_layer))
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(hidden, hidden, bias=False) for _ in range(4)]
        blocks += [nn.LayerNorm(hidden, bias=False), nn.LayerNorm(hidden, bias=False)]
    return nn.Sequential(*blocks)


def _sync_worker(rank: int, world: int, init: str, total_mb: float, repeats: int, out: str,
                 bucket_mb: float) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    _sync_rounds(rank, world, total_mb, repeats, out, bucket_mb)
    leave_process_group()


def _sync_rounds(rank: int, world: int, total_mb: float, repeats: int, out: str, bucket_mb: float) -> None:
    torch.manual_seed(rank)
    model = sync_model(total_mb)
    flatten_params(model, bucket_mb)  # as the runtime lays out trainer and generator models
    group = dist.new_group(list(range(world)))
    sync = WeightSync(group, 0, model.named_parameters(), bucket_mb=bucket_mb)
    # The baseline sends the same bytes from memory as real as the weights': a buffer never written
    # is the kernel's shared zero page on the sender, read from cache, and would make the plain
    # broadcast look faster than any broadcast of real data.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    apply = copy_into(model)
    times: dict[str, list[float]] = {"sync": [], "plain": []}
    for i in range(repeats + 1):  # the first round warms up connections and allocations
        for kind in (("sync", "plain") if i % 2 == 0 else ("plain", "sync")):  # alternate the order
            dist.barrier(group)
            t0 = time.perf_counter()
            if kind == "plain":
                dist.broadcast(flat, 0, group=group)
            elif rank == 0:
                sync.send(model.named_parameters(), i)
            else:
                sync.receive(apply, target=model)
            dist.barrier(group)  # done when the slowest receiver is done
            if i:
                times[kind].append(time.perf_counter() - t0)
    if rank == 0:
        Path(out).write_text(json.dumps({"bytes": sync.total_bytes, "buckets": len(sync.buckets), **times}))


SYNC_WORLD = 3  # one sender, two receivers


def sync_bandwidth(total_mb: float, repeats: int, work: Path, bucket_mb: float = DEFAULT_BUCKET_MB,
                   world: int | None = None) -> dict:
    out = work / "sync.json"
    world = world or SYNC_WORLD
    mp.spawn(_sync_worker, args=(world, file_init_method(work), total_mb, repeats, str(out), bucket_mb), nprocs=world, join=True)
    data = json.loads(out.read_text())
    sync_bw = data["bytes"] / statistics.median(data["sync"])
    plain_bw = data["bytes"] / statistics.median(data["plain"])
    return {"bytes": data["bytes"], "buckets": data["buckets"], "sync_Bps": sync_bw, "plain_Bps": plain_bw,
            "world": world}


# ---- the vLLM rows ----------------------------------------------------------------------------
VLLM_WORKLOAD = ROOT / "examples" / "workloads" / "grpo-tiny-vllm.yaml"


# Runs of the vLLM plan the rows take the median of: one run's median iteration swings between runs
# (each starts its own engines) by more than the goal's width on a shared 2-core machine.
VLLM_RUNS = 3


def vllm_run(work: Path, iterations: int, slots: int, quick: bool, runs: int = VLLM_RUNS) -> list[dict]:
    """Profile (with vLLM's own calls) → fit → plan for `--backend vllm` → run it `runs` times."""
    db, cluster = work / "profiles.db", work / "cluster.yaml"
    cluster.write_text(f"name: bench-cpu\nhosts:\n  - name: localhost\n    gpus: {{type: cpu, count: {slots}}}\n")
    workload = truthful_workload(work, slots, VLLM_WORKLOAD)
    job = ("--workload", str(workload), "--cluster", str(cluster))
    t0 = time.perf_counter()
    grid = ("--quick",) if quick else ()
    hetprof("profile", "--suite", "tasks", "--suite", "dptrain", "--suite", "vllmgen", "--models", "tiny-2x", *grid,
            *job, db=db, cwd=work)
    hetprof("profile", "--quick", "--suite", "collectives", "--models", "tiny-2x", db=db, cwd=work)
    hetprof("fit", "--stat", "median", db=db, cwd=work)
    hetprof("plan", "--cluster", str(cluster), "--workload", str(workload), "--cost-model", "fitted", "--backend",
            "vllm", "--search", "hetrl", "--seed", "0", "--max-tp", "1", "--max-pp", "1",
            "--out", str(work / "plan.json"), db=db, cwd=work)
    prep = time.perf_counter() - t0
    return [_run(work, db, iterations, "profile (vLLM calls included)", prep) for _ in range(runs)]


def generation_rates(workload: Path, slots: int, rounds: int) -> dict[str, float]:
    """Generated tokens/s of each engine on the job's per-replica batch (its prompts, its response
    cap), calls alternated so both see the same machine; vLLM's engine core in its own process, as
    in a run. Also `vllm_call_s`: vLLM's median call, the run's generation call made alone."""
    from hetprof.executor.backends import get_backend
    from hetprof.executor.data import PromptSource
    from hetprof.executor.modeling import build_causal_lm
    from hetprof.executor.tokenizer import CharTokenizer
    from hetprof.specs import WorkloadSpec

    spec = WorkloadSpec.load(workload)
    tok = CharTokenizer()
    batch = -(-spec.sequences_per_step // slots)
    prompts = [tok.encode(p.text) for p in PromptSource.builtin(-(-batch // spec.responses_per_prompt)).batch(0)]
    prompts = [p for p in prompts for _ in range(spec.responses_per_prompt)][:batch]
    model = build_causal_lm(spec.models.actor, seed=0)
    torch.set_num_threads(1)  # a cpu slot is one core; the engine binds its threads to one
    engines = {"hf": get_backend("hf")(model, tok), "vllm": get_backend("vllm")(model, tok, device="cpu", own_process=True)}
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    tokens: dict[str, int] = dict.fromkeys(engines, 0)
    for i in range(rounds + 1):  # the first round warms up
        for name in (list(engines) if i % 2 else list(engines)[::-1]):
            t0 = time.perf_counter()
            out = engines[name].generate(prompts, spec.response_len.cap, generator=torch.Generator().manual_seed(i))
            if i:
                seconds[name].append(time.perf_counter() - t0)
                tokens[name] += int(out.lengths.sum())
    engines["vllm"].close()
    return {**{name: tokens[name] / sum(seconds[name]) for name in engines},
            "vllm_call_s": statistics.median(seconds["vllm"])}


def median_and_spread(values: list[float]) -> tuple[float, str]:
    """The median of per-run ratios, and their range as text ("—" for a single run)."""
    return statistics.median(values), (f"{min(values):.2f}–{max(values):.2f}" if len(values) > 1 else "—")


def vllm_rows(args: argparse.Namespace, work: Path, iterations: int) -> None:
    console.print(f"vLLM: profile → fit → plan --backend vllm → run ({args.vllm_runs} × {iterations} iterations)…")
    runs = vllm_run(work, iterations, args.slots, args.quick, args.vllm_runs)
    rates = generation_rates(work / f"workload-{VLLM_WORKLOAD.stem}.yaml", args.slots, 5 if args.quick else 15)
    table = Table(title=f"executor benchmark, vLLM rows ({'quick' if args.quick else 'full'}; {os.cpu_count()} cores; "
                        f"median of {len(runs)} runs, their range in brackets)")
    for col in ("ratio", "value", "goal", "measured from"):
        table.add_column(col, justify="left" if col in ("ratio", "measured from") else "right")
    pred = runs[0]["predicted"]
    value, spread = median_and_spread([r["measured"] / pred for r in runs] if pred else [math.nan])
    table.add_row("measured / predicted iteration, --backend vllm", f"{value:.2f} ({spread})", "0.85–1.15",
                  f"median {statistics.median(r['measured'] for r in runs) * 1e3:.1f} ms vs plan "
                  f"{pred * 1e3 if pred else math.nan:.1f} ms")
    for task, label in (("actor_gen", "generation stage"), ("weight_sync", "weight sync (with vLLM's reload)")):
        measured = [r["per_task"][task][0] for r in runs if task in r["per_task"]]
        predicted = runs[0]["per_task"].get(task, (None, None))[1]
        if not measured or not predicted:
            table.add_row(f"  its {label}, measured / predicted", "—", "0.85–1.15", "not in the run's records")
            continue
        value, spread = median_and_spread([m / predicted for m in measured])
        table.add_row(f"  its {label}, measured / predicted", f"{value:.2f} ({spread})", "0.85–1.15",
                      f"{statistics.median(measured) * 1e3:.1f} vs {predicted * 1e3:.1f} ms")
    gen = [r["per_task"]["actor_gen"][0] for r in runs if "actor_gen" in r["per_task"]]
    if gen:  # the run's generation against the same call made alone minutes later: no pricing in it
        value, spread = median_and_spread([g / rates["vllm_call_s"] for g in gen])
        table.add_row("  its generation stage / the same call alone", f"{value:.2f} ({spread})", "≈ 1",
                      f"{statistics.median(gen) * 1e3:.1f} vs {rates['vllm_call_s'] * 1e3:.1f} ms, the job's batch "
                      "on one engine after the runs")
    table.add_row("vLLM / hf generation tokens/s", f"{rates['vllm'] / rates['hf']:.2f}", "—",
                  f"{rates['vllm']:.0f} vs {rates['hf']:.0f} tokens/s, one replica's batch, alternated")
    console.print(table)
    walls = " + ".join(f"{r['run_s']:.0f}" for r in runs)
    console.print(f"reward {runs[0]['reward_first']:.3f} → {runs[0]['reward_last']:.3f}; profile+fit+plan "
                  f"{runs[0]['prep_s']:.0f} s, runs {walls} s")


def _task_ratio(runs: list[dict], task: str) -> str:
    """One task's time in the refit plan over its measured time in the run the refit learned from."""
    measured, _ = runs[0]["per_task"].get(task, (None, None))
    _, predicted = runs[1]["per_task"].get(task, (None, None))
    return f"{predicted / measured:.2f}" if measured and predicted else "—"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations and a smaller sync model")
    parser.add_argument("--slots", type=int, default=2, help="CPU worker slots of the planned cluster")
    parser.add_argument("--sync-mb", type=float, help="size of the weight-sync model (default 64, quick 16)")
    parser.add_argument("--bucket-mb", type=float, default=DEFAULT_BUCKET_MB, help="weight-sync bucket size")
    parser.add_argument("--sync-only", action="store_true", help="only the weight-sync ratio")
    parser.add_argument("--sync-world", type=int, help=f"processes in the sync group (default {SYNC_WORLD})")
    parser.add_argument("--tensorboard-ab", action="store_true",
                        help="only the executor overhead with TensorBoard on vs off (no profiling)")
    parser.add_argument("--ab-pairs", type=int, default=2, help="on/off run pairs of --tensorboard-ab")
    parser.add_argument("--vllm", action="store_true", help="only the vLLM rows (needs make install-vllm)")
    parser.add_argument("--vllm-runs", type=int, default=VLLM_RUNS,
                        help=f"runs of the vLLM plan its rows take the median of (default {VLLM_RUNS})")
    parser.add_argument("--max-tokens", type=int, help="run packed: the workload's training.max_tokens_per_microbatch")
    parser.add_argument("--keep", type=Path, help="work in this new or empty folder and keep it (database, plans, run logs)")
    args = parser.parse_args()
    iterations, mb, repeats = (6, 16.0, 5) if args.quick else (12, 64.0, 15)
    mb = args.sync_mb or mb
    with tempfile.TemporaryDirectory(prefix="hetprof-executor-bench-") as tmp:
        work = Path(tmp)
        if args.keep:
            work = args.keep.resolve()
            if work.exists() and any(work.iterdir()):
                # an old profiles.db would be fitted together with this run's profile
                parser.error(f"--keep {work}: the folder is not empty; give a new or empty one")
            work.mkdir(parents=True, exist_ok=True)
        if args.tensorboard_ab:
            print_tensorboard_ab(tensorboard_ab(work, iterations, args.slots, args.ab_pairs), iterations,
                                 args.ab_pairs)
            return
        if args.vllm:
            return vllm_rows(args, work, iterations)
        world = args.sync_world or SYNC_WORLD
        console.print(f"weight sync vs plain broadcast ({mb:.0f} MB, 1 sender → {world - 1} receiver(s), gloo)…")
        bw = sync_bandwidth(mb, repeats, work, args.bucket_mb, world)
        if args.sync_only:
            console.print(f"sync {bw['sync_Bps'] / 1e9:.2f} GB/s, plain {bw['plain_Bps'] / 1e9:.2f} GB/s, ratio "
                          f"{bw['sync_Bps'] / bw['plain_Bps']:.2f} ({bw['buckets']} buckets)")
            return
        console.print(f"profile → fit → plan → run ({iterations} iterations, {args.slots} CPU slots)…")
        runs = planned_run(work, iterations, args.slots, args.max_tokens)

    packed = f"; packed ≤ {args.max_tokens} tokens" if args.max_tokens else ""
    table = Table(title=f"executor benchmark ({'quick' if args.quick else 'full'}; {os.cpu_count()} cores{packed})")
    for col in ("ratio", "value", "goal", "measured from"):
        table.add_column(col, justify="left" if col in ("ratio", "measured from") else "right")
    for run in runs:
        pred = run["predicted"]
        table.add_row(f"measured / predicted iteration (fitted on {run['fitted_on']})",
                      f"{run['measured'] / pred:.2f}" if pred else "—", "0.85–1.15",
                      f"median {run['measured'] * 1e3:.1f} ms vs plan {pred * 1e3 if pred else float('nan'):.1f} ms")
        table.add_row("  the same, machine drift taken out", f"{run['measured'] / pred / run['drift']:.2f}" if pred else "—",
                      "0.85–1.15", f"profiled kernels re-timed around the run: {run['drift']:.2f}× "
                      f"their rows")
    if len(runs) == 2 and runs[0]["layouts"] == runs[1]["layouts"] and runs[1]["predicted"]:
        # the refit learned from run 1 and planned the same layouts: pricing run 1 back is a check of
        # recording against pricing that no drift between runs enters
        table.add_row("refit plan / run 1 it learned from", f"{runs[1]['predicted'] / runs[0]['measured']:.2f}",
                      "0.85–1.15", f"{runs[1]['predicted'] * 1e3:.1f} vs {runs[0]['measured'] * 1e3:.1f} ms; "
                      "training " + _task_ratio(runs, "actor_train"))
    table.add_row("executor overhead", f"{runs[0]['overhead']:.3f}", "≤ 1.10",
                  "iteration / sum of stage times (median, run 1)")
    table.add_row("weight-sync / plain broadcast bandwidth", f"{bw['sync_Bps'] / bw['plain_Bps']:.2f}", "≥ 0.8",
                  f"{bw['sync_Bps'] / 1e9:.2f} vs {bw['plain_Bps'] / 1e9:.2f} GB/s, {bw['bytes'] / 1e6:.0f} MB "
                  f"in {bw['buckets']} buckets, 1 → {bw['world'] - 1}")
    console.print(table)
    tasks = Table(title="per task: measured (median) vs predicted, each run")
    for col in ("task", *(f"{c} (fit: {r['fitted_on']})" for r in runs for c in ("measured ms", "predicted ms",
                                                                                 "ratio"))):
        tasks.add_column(col, justify="right")
    for task in runs[0]["per_task"]:
        cells = []
        for run in runs:
            measured, predicted = run["per_task"].get(task, (None, None))
            cells += [f"{measured * 1e3:.1f}" if measured is not None else "—",
                      f"{predicted * 1e3:.1f}" if predicted else "—",
                      f"{measured / predicted:.2f}" if predicted and measured is not None else "—"]
        tasks.add_row(task, *cells)
    console.print(tasks)
    for run in runs:
        console.print(f"fit on {run['fitted_on']}: layouts {run['layouts']}; reward {run['reward_first']:.3f} → "
                      f"{run['reward_last']:.3f}; profile+fit+plan {run['prep_s']:.0f} s, run {run['run_s']:.0f} s")
        steps = run["iterations"] - (2 if run["iterations"] > 4 else 1)
        console.print("  per replica, median ms (replica 0 the slowest in k of the steady steps): " + "; ".join(
            f"{task} {' / '.join(f'{m * 1e3:.1f}' for m in medians)} ({k}/{steps})"
            for task, (medians, k) in run["replicas"].items()))


if __name__ == "__main__":
    main()
