"""One command for a GPU machine: install the kit, profile the GPU, fit, plan, run GRPO, validate, report.

A lent GPU machine comes rarely, for minutes, without network (docs/guide/gpu-session.md). This
script is everything it runs, a thin driver over the `hetprof` commands a user types:

    kit        install .gpukit (`make gpu-kit`) into a private folder (without one, use this interpreter's
               packages); check versions against pyproject.toml
    inventory  `hetprof profile --suite inventory` (NVML), then this machine as a one-GPU cluster spec
    compute    `hetprof profile --suite compute`: matmul by dtype (bf16, fp16, fp8 where the GPU has it, fp32)
    memory     `hetprof profile --suite memory`: device-to-device copy
    tasks-M    `hetprof profile --suite tasks` at model M's shapes (random weights, a few blocks), the
               planned model with the workload's own shapes
    fit, plan, run, validate   the planned GRPO job on this GPU (`hf` backend, or --backend vllm), a few
               iterations
    export     `hetprof db export`, then the report: measured against the catalog and the reference
               figures, and against the plan's prediction per task and per iteration

Each step runs under its own time cap, inside an overall budget, so one slow step cannot eat the
rest; a step that fails or is cut leaves the others running (those needing its output are skipped),
and the report says which and why (the last lines of its output). At most 8 files land in --out.
The script imports only the standard library and what the device image has (pyyaml, packaging),
so it runs before the kit is installed; what needs hetprof runs in subprocesses.

    python3 bench/gpu_session.py --out $OUT                          # on the GPU machine
    .venv/bin/python bench/gpu_session.py --device cpu --quick --no-kit --out /tmp/dry   # CPU dry run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import gpu_kit
import gpu_report
import yaml

ROOT = Path(__file__).resolve().parent.parent
FIGURES = Path(__file__).resolve().parent / "gpu_figures.py"
REFERENCES = Path(__file__).resolve().parent / "gpu_references.yaml"
# hetprof's CLI as a module call: works for the kit's --target install (no console script on PATH)
# and for a virtualenv alike; -P keeps the working folder off sys.path.
HETPROF = [sys.executable, "-P", "-c", "import sys; from hetprof.cli import main; sys.argv[0] = 'hetprof'; main()"]
TAIL_LINES = 15  # lines of a failed step's output the report keeps
KILL_GRACE_S = 10.0  # after SIGTERM, before SIGKILL: `hetprof run` stops its workers on SIGTERM


@dataclasses.dataclass(frozen=True)
class Scale:
    """How much a session measures: the models profiled, the planned job, its iterations."""

    models: tuple[str, ...]  # the first is the planned job's model
    workload: Path
    iterations: int
    # the profile steps run with `hetprof profile --quick` (small grids, fewer repeats): of compute,
    # memory, planned (the planned model's task rows; its workload's own shapes are always added)
    # and models (the other models' task rows)
    quick: frozenset[str]
    skip_memory: str = ""  # why the copy suite does not run at this scale ("": it runs)


SCALES = {
    # the planned model's quick grid plus its job's shapes: what the plan needs, soon, so the run
    # starts early; the full sweeps where a cut loses least (the other models' rows come last)
    "full": Scale(("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"),
                  ROOT / "examples" / "workloads" / "qwen3-0.6b-grpo-1gpu.yaml", 5, frozenset({"planned"})),
    "quick": Scale(("tiny",), ROOT / "examples" / "workloads" / "grpo-tiny.yaml", 2,
                   frozenset({"compute", "memory", "planned", "models"}),
                   skip_memory="a CPU dry run: a CPU's copy sizes are 4x its last-level cache (GBs)"),
}


class StepError(Exception):
    """A step's command did not succeed; `tail` is the end of its output."""

    status = "failed"

    def __init__(self, message: str, tail: list[str]):
        super().__init__(message)
        self.tail = tail


class StepCut(StepError):
    """A step ran past its cap."""

    status = "timed out"


@dataclasses.dataclass
class StepResult:
    name: str
    status: str  # ok | failed | timed out | skipped (a need failed, or no time left) | not run (at this scale)
    seconds: float = 0.0
    cap_s: float = 0.0
    why: str = ""
    tail: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Step:
    """A named piece of the session: `run(session)` under a cap of `cap_s` seconds.

    `needs` names steps whose success it depends on (skipped otherwise); a `final` step runs even
    when the overall budget is spent (it has its own reserve): the export and the report. A step
    with a `skip` reason does not run at this scale, and the report says why.
    """

    name: str
    cap_s: float
    run: Callable[[Session], None]
    needs: tuple[str, ...] = ()
    final: bool = False
    skip: str = ""


@dataclasses.dataclass
class Session:
    """Where a session writes, what its commands see, and the deadline of the step running now."""

    scratch: Path  # working files: the profile database, the cluster spec, the installed kit
    out: Path
    env: dict[str, str]
    log: Path  # every command's output, in order
    deadline: float = float("inf")
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)  # what steps found (kit versions, ...)

    def command(self, cmd: list[str]) -> None:
        """Run `cmd` until it ends or the step's deadline; its output goes to the log. A cut or a
        non-zero exit raises with the output's last lines; its whole process group is stopped."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise StepCut("no time left in its cap", [])
        with self.log.open("a") as log:
            shown = ["hetprof", *cmd[len(HETPROF):]] if cmd[:len(HETPROF)] == HETPROF else cmd
            log.write(f"\n$ {' '.join(shown)}\n")
            log.flush()
            start = log.tell()
            proc = subprocess.Popen(cmd, cwd=self.scratch, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                rc = proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                _stop_group(proc)
                raise StepCut(f"cut after {left:.0f} s", _tail(self.log, start)) from None
        if rc != 0:
            raise StepError(f"exit {rc}: {' '.join(cmd[-6:])}", _tail(self.log, start))

    def hetprof(self, *args: str) -> None:
        self.command([*HETPROF, *args])

    def python(self, script: Path, *args: str) -> None:
        self.command([sys.executable, "-P", str(script), *args])


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the step's process group (hetprof stops its workers on it), SIGKILL to whatever of
    the group is left after a grace."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the whole group is gone
        pass
    proc.wait()


def _tail(log: Path, start: int) -> list[str]:
    with log.open("rb") as f:
        f.seek(start)
        return f.read().decode(errors="replace").splitlines()[-TAIL_LINES:]


def run_steps(session: Session, steps: list[Step], budget_s: float,
              report: Callable[[StepResult], None] = lambda r: None) -> list[StepResult]:
    """Every step in order within `budget_s` in all: each under min(its cap, what is left of the
    budget less the final steps' caps), the final steps under their own caps. A step whose needs did
    not succeed is skipped."""
    end = time.monotonic() + budget_s - sum(s.cap_s for s in steps if s.final)
    results: dict[str, StepResult] = {}
    for step in steps:
        missing = [n for n in step.needs if results.get(n, StepResult(n, "skipped")).status != "ok"]
        left = step.cap_s if step.final else min(step.cap_s, end - time.monotonic())
        if step.skip:
            result = StepResult(step.name, "not run", why=step.skip)
        elif missing:
            result = StepResult(step.name, "skipped", why=f"needs {', '.join(missing)}, which did not succeed")
        elif left <= 0:
            result = StepResult(step.name, "skipped", why="the session's time budget was spent")
        else:
            result = _run_one(session, step, left)
        results[step.name] = result
        report(result)
    return list(results.values())


def _run_one(session: Session, step: Step, cap: float) -> StepResult:
    start = time.monotonic()
    session.deadline = start + cap
    try:
        step.run(session)
        status, why, tail = "ok", "", []
    except StepError as exc:
        status, why, tail = exc.status, str(exc), exc.tail
    except Exception as exc:  # a step's own defect must not cost the steps after it, nor the report
        first = str(exc).splitlines()[0] if str(exc) else ""
        status, why, tail = "failed", first if isinstance(exc, gpu_kit.KitError) else f"{type(exc).__name__}: {first}", []
    finally:
        session.deadline = float("inf")
    return StepResult(step.name, status, time.monotonic() - start, cap, why, tail)


# ---- the steps --------------------------------------------------------------------------------

def kit_step(kit: Path | None) -> Callable[[Session], None]:
    """Install the kit into scratch/site (put first on the commands' PYTHONPATH), then check every
    version against pyproject.toml and the installed hetprof against the working tree. Without a
    kit (a CPU dry run, a user's own machine) only this interpreter's packages are checked."""

    def run(session: Session) -> None:
        pyproject = ROOT / "pyproject.toml"
        path = list(sys.path)
        if kit is not None:
            target = session.scratch / "site"
            session.facts["kit_install"] = gpu_kit.install(kit, target)
            session.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), session.env.get("PYTHONPATH")]))
            path = [str(target), *path]
            from importlib import metadata

            dist = next(iter(metadata.distributions(name=gpu_kit.PROJECT, path=[str(target)])))
            stale = gpu_kit.stale_sources(dist, ROOT, pyproject)
            if stale:
                raise gpu_kit.KitError(f"gpu kit: its hetprof wheel is older than the working tree ({len(stale)} "
                                       f"files differ, e.g. {stale[0]}): run `make gpu-kit` again")
        else:
            session.facts["kit_install"] = "none: this interpreter's packages"
        session.facts["versions"] = gpu_kit.check_versions(pyproject, path)

    return run


def inventory_step(device: str) -> Callable[[Session], None]:
    def run(session: Session) -> None:
        session.hetprof("profile", "--suite", "inventory", "--device", device)
        session.python(FIGURES, "cluster", str(session.env["HETPROF_DB"]), str(session.scratch / "cluster.yaml"))

    return run


def profile_step(device: str, quick: bool, *args: str) -> Callable[[Session], None]:
    return lambda session: session.hetprof("profile", "--device", device, *(["--quick"] if quick else []), *args)


def tasks_step(device: str, scale: Scale, model: str, planned: bool, backend: str = "hf") -> Callable[[Session], None]:
    """Task rows at `model`'s shapes; for the planned model also at the workload's own shapes, and
    with the vllm backend its vLLM generation calls (the vllmgen suite) too."""
    job = ["--workload", str(scale.workload), "--cluster", "cluster.yaml"] if planned else []  # in scratch
    suites = "tasks,vllmgen" if planned and backend == "vllm" else "tasks"
    quick = ("planned" if planned else "models") in scale.quick
    return profile_step(device, quick, "--suite", suites, "--models", model, *job)


def export_step(session: Session) -> None:
    """The profile database as one portable file, named after the GPU's catalog type and the date."""
    cluster = session.scratch / "cluster.yaml"
    kind = yaml.safe_load(cluster.read_text())["hosts"][0]["gpus"]["type"] if cluster.is_file() else "device"
    name = f"{kind.lower()}-{datetime.now(timezone.utc):%Y%m%d}.hetprof.gz"
    session.hetprof("db", "export", str(session.out / name))
    session.facts["export"] = name


RUN_LOG, PLAN = "run.jsonl", "plan.json"  # in --out


def job_steps(scale: Scale, iterations: int, backend: str) -> list[Step]:
    """Fit the rows, plan the job on this machine for `backend`, run it, compare."""
    fit = ["fit", "--stat", "median"]  # the report compares medians: fit each shape's median repeat
    plan = ["plan", "-c", "cluster.yaml", "-w", str(scale.workload), "--cost-model", "fitted", "--seed", "0",
            "--budget-s", "20", "--backend", backend]
    run = ["run", "--iterations", str(iterations), "--seed", "0", "--no-tensorboard"]
    return [
        Step("fit", 60, lambda x: x.hetprof(*fit), (f"tasks-{scale.models[0]}",)),
        Step("plan", 60, lambda x: x.hetprof(*plan, "--out", str(x.out / PLAN)), ("fit",)),
        Step("run", 200, lambda x: x.hetprof(*run, str(x.out / PLAN), "--log", str(x.out / RUN_LOG)), ("plan",)),
        Step("validate", 45, lambda x: x.hetprof("validate", str(x.out / RUN_LOG)), ("run",)),
    ]


def summary_step(session: Session) -> None:
    session.python(FIGURES, "summary", session.env["HETPROF_DB"], str(REFERENCES), str(session.out / RUN_LOG),
                   str(session.out / PLAN), str(session.scratch / "figures.json"))


def steps_for(args: argparse.Namespace, scale: Scale) -> list[Step]:
    """The session in order: what the report needs most comes first (the other models' rows last)."""
    d, s = args.device, scale
    return [
        Step("kit", 90, kit_step(None if args.no_kit or not args.kit.is_dir() else args.kit.resolve())),
        Step("inventory", 60, inventory_step(d), ("kit",)),
        Step("compute", 120, profile_step(d, "compute" in s.quick, "--suite", "compute"), ("kit",)),
        Step("memory", 60, profile_step(d, "memory" in s.quick, "--suite", "memory"), ("kit",),
             skip=s.skip_memory if d == "cpu" else ""),
        Step(f"tasks-{s.models[0]}", 120, tasks_step(d, s, s.models[0], True, args.backend), ("inventory",)),
        *job_steps(s, args.iterations or s.iterations, args.backend),
        *[Step(f"tasks-{m}", 90, tasks_step(d, s, m, False), ("kit",)) for m in s.models[1:]],
        Step("export", 20, export_step, ("kit",), final=True),
        Step("summary", 40, summary_step, ("inventory",), final=True),
    ]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
                        help="where the (at most 8) result files go [default: $OUT]")
    parser.add_argument("--device", default="cuda:0", help="cuda:N or cpu [default: cuda:0]")
    parser.add_argument("--quick", action="store_true", help="tiny model, small grids, 2 iterations (the dry run)")
    parser.add_argument("--kit", type=Path, default=ROOT / ".gpukit", help="the kit folder (`make gpu-kit`); "
                        "where there is none, this interpreter's packages are used [default: .gpukit]")
    parser.add_argument("--no-kit", action="store_true", help="use this interpreter's packages even where a kit "
                        "folder exists (a CPU dry run, a machine with `make install`)")
    parser.add_argument("--iterations", type=int, default=None, help="RL iterations [default: 5, quick 2]")
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf", help="generation backend of the planned "
                        "run; vllm needs `pip install -e '.[vllm]'` (not in the kit: far over what may travel)")
    parser.add_argument("--budget-s", type=float, default=470.0, help="wall seconds for the whole session; "
                        "the final export and report keep their caps out of it [default: 470, under 8 min]")
    parser.add_argument("--scratch", type=Path, default=None, help="working folder [default: a new temporary one]")
    args = parser.parse_args(argv)
    if args.out is None:
        parser.error("--out (or $OUT) is required")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    scale = SCALES["quick" if args.quick else "full"]
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    scratch = (args.scratch or Path(os.environ.get("TMPDIR", "/tmp")) / f"gpu-session-{os.getpid()}").resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HETPROF_DB": str(scratch / "profiles.db"), "PYTHONSAFEPATH": "1", "PYTHONUNBUFFERED": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # no network there: never wait on the hub
    session = Session(scratch, out, env, out / "session.log", facts={"scratch": str(scratch)})
    session.log.write_text("")
    started = datetime.now(timezone.utc)

    def show(r: StepResult) -> None:
        print(f"{r.name:18s} {r.status:9s} {r.seconds:6.1f} s  {r.why}", flush=True)

    results = run_steps(session, steps_for(args, scale), args.budget_s, report=show)
    figures = scratch / "figures.json"
    data = json.loads(figures.read_text()) if figures.is_file() else {}
    paths = gpu_report.write(out, started, {**vars(args), "argv": sys.argv[1:] if argv is None else argv}, results,
                             session.facts, data)
    print(f"report: {paths[0]}")
    return 0 if all(r.status in ("ok", "not run") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
