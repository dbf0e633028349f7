"""The executor bench's planned CPU runs: profile → fit → plan → run, the drift probe around each
run, and what each run's records say per task and per replica (`executor_bench.py` prints them)."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from hetprof.executor.records.run_log import read_log

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

    from hetprof.executor.models.tokenizer import CharTokenizer
    from hetprof.executor.prompts.data import PromptSource

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
    from hetprof.runtime.tokenbudget import packed_shape, step_prompts
    from hetprof.specs import WorkloadSpec

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

    from hetprof.profiles import ProfileDB

    code = (
        "import json, statistics, torch\n"
        "torch.set_num_threads(1)\n"
        "from hetprof.runtime.hostmemory import keep_freed_memory\n"
        "keep_freed_memory()\n"
        "from hetprof.runtime.cpuslots import bind_to_slot\n"
        "bind_to_slot(0, 1)\n"
        "from hetprof.specs.models import PRESETS\n"
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
        run = run_and_read(work, db, iterations, name, prep)
        run["drift"] = (before + probe_drift(db, points)) / 2  # > 1: the kernels ran slower than when profiled
        out.append(run)
    return out


def run_and_read(work: Path, db: Path, iterations: int, name: str, prep: float) -> dict:
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
