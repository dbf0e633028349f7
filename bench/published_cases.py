"""Published RL runs as cases the simulator prices: loading `bench/published/<case>/` and pricing it.

A case folder holds the run's `cluster.yaml` and `workload.yaml` (the usual spec files) and a
`case.yaml` with the citation, the figure as published and the layout the source ran (a pinned
layout, `hetprof.planner.pinned`). Pricing takes one cost model for every case — nothing here is
fitted per case — and reads the simulator's step time and per-phase task times.

Published frameworks hand a whole step's batch from generation to training (no streaming in
chunks), so cases are priced without streaming.

A case may list in `needs` what hetprof must express before it can price the run as published (FP8
precision, a GPU type the catalog lacks, the micro-batch a recipe ran): such a case is written in
the syntax it will have, and while its files do not load it is skipped with that reason instead of
failing the bench. Once they load it is priced like any other case; a layout the model still
refuses is reported with the reason, as for any case.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

from hetprof.errors import InfeasibleError, SpecError
from hetprof.planner.pinned import PinnedLayout, pinned_candidate
from hetprof.planner.simulator import Simulator
from hetprof.specs import GENERATION_BACKENDS, ClusterSpec, WorkloadSpec
from hetprof.specs.loader import field, from_data, positive, read_file

CASES_DIR = Path(__file__).resolve().parent / "published"
# A run's wall clock as sources print it: "3d 17h 5m", "21h 40m", "17h 22m".
DURATION = re.compile(r"^\s*(?:(\d+)\s*d)?\s*(?:(\d+)\s*h)?\s*(?:(\d+)\s*m)?\s*$")
# Phases a source may publish, each the task kinds the simulator times for it.
PHASES = {"generation": ("generation",), "logprob": ("inference",), "training": ("training",)}


@dataclasses.dataclass
class Source:
    """Where the figure was published."""

    id: str = field(help="the source's short name; leave-one-source-out holds out every case of it")
    title: str = field(help="title of the page, paper or README section")
    url: str = field(help="where to read it")
    date: str = field(help="publication date (or the commit date of the page)")
    where: str = field(help="table, figure or section, and the row or column")
    recipe: str | None = field(None, help="the configuration the run used, where published apart")


@dataclasses.dataclass
class Published:
    """The published figure: seconds per step, or a run's hours over its steps."""

    figure: str = field(help="the figure as published, quoted")
    step_s: float | None = field(None, help="seconds per RL step", check=positive, expect="a positive number")
    run_hours: float | None = field(None, help="hours of a whole run (with run_steps)", check=positive,
                                    expect="a positive number")
    run_steps: int | None = field(None, help="steps of that run", check=positive, expect="a positive integer")
    phases: dict[str, float] = field(default_factory=dict, help="seconds per phase: " + ", ".join(PHASES))
    run_totals: dict[int, str] = field(default_factory=dict,
                                       help="the run's wall clock after each published step count, quoted "
                                            "('100: 13h 44m'): the step's mean over each window between them")

    def seconds(self) -> float:
        if self.step_s is not None:
            return float(self.step_s)
        return float(self.run_hours) * 3600.0 / float(self.run_steps)

    def validate(self) -> None:
        done = 0.0
        for steps in sorted(self.run_totals):
            seconds = duration_s(self.run_totals[steps])
            if steps <= 0 or seconds is None or seconds <= done:
                raise SpecError(None, f"run_totals.{steps}", "a positive step count mapped to the run's time "
                                "then, such as '1d 3h 43m', growing with the steps", self.run_totals[steps])
            done = seconds

    def windows(self) -> list[tuple[int, int, float]]:
        """(first step, last step, wall seconds per step) between consecutive published run totals: a
        source's step column is a mean over the whole run, and these show whether its steps changed
        as it went (the run clock also holds what the step column leaves out, such as validation)."""
        out, before, before_s = [], 0, 0.0
        for steps in sorted(self.run_totals):
            seconds = duration_s(self.run_totals[steps]) or 0.0
            out.append((before + 1, steps, (seconds - before_s) / (steps - before)))
            before, before_s = steps, seconds
        return out


def duration_s(text: str) -> float | None:
    """Seconds of a run time printed as days, hours and minutes ('1d 3h 43m'); None if it is not one."""
    match = DURATION.match(str(text))
    if not match or not any(match.groups()):
        return None
    days, hours, minutes = (int(g or 0) for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60.0


@dataclasses.dataclass
class CaseSpec:
    name: str = field(help="case name (its folder's name)")
    source: Source = field(help="the citation")
    published: Published = field(help="the published figure")
    layout: PinnedLayout = field(help="the layout the source ran, pinned (hetprof.planner.pinned)")
    assumptions: list[str] = field(default_factory=list, help="what the source leaves out and the case assumes")
    backend: str = field("vllm", help="generation engine the source ran, as priced (planner.engines)",
                         check=lambda b: b in GENERATION_BACKENDS, expect="one of " + ", ".join(GENERATION_BACKENDS))
    needs: list[str] = field(default_factory=list,
                             help="what hetprof must express to price the run as published: while the case's "
                                  "files do not load, it is skipped with this reason")


@dataclasses.dataclass(frozen=True)
class Case:
    """One published run, loaded: its specs, its pinned layout and what it is compared with."""

    name: str
    folder: Path
    spec: CaseSpec
    cluster: ClusterSpec
    workload: WorkloadSpec
    layout: PinnedLayout

    @property
    def backend(self) -> str:
        return self.spec.backend

    @property
    def source(self) -> Source:
        return self.spec.source

    @property
    def published_s(self) -> float:
        return self.spec.published.seconds()


@dataclasses.dataclass(frozen=True)
class Priced:
    """The simulator's answer for one case."""

    case: Case
    predicted_s: float
    phases: dict[str, float]
    problems: tuple[str, ...] = ()

    @property
    def feasible(self) -> bool:
        return not self.problems and math.isfinite(self.predicted_s)

    @property
    def ratio(self) -> float:
        return self.predicted_s / self.case.published_s if self.feasible else math.inf


def load_case(folder: str | Path) -> Case:
    """A case folder; a mistake is a SpecError naming the file and the field."""
    folder = Path(folder)
    case_file = folder / "case.yaml"
    data = read_file(case_file)
    if isinstance(data, dict) and isinstance(data.get("source"), dict):
        data = {**data, "source": {k: str(v) for k, v in data["source"].items()}}  # YAML reads dates as dates
    spec = from_data(CaseSpec, data, file=str(case_file))
    pub = spec.published
    if pub.step_s is None and (pub.run_hours is None or pub.run_steps is None):
        raise SpecError(str(case_file), "published", "step_s, or run_hours with run_steps", None)
    for phase in pub.phases:
        if phase not in PHASES:
            raise SpecError(str(case_file), f"published.phases.{phase}", "one of " + ", ".join(PHASES), phase)
    return Case(spec.name, folder, spec, ClusterSpec.load(folder / "cluster.yaml"),
                WorkloadSpec.load(folder / "workload.yaml"), spec.layout)


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A case whose files use what hetprof does not express yet (its `needs`), and why it did not load."""

    name: str
    folder: Path
    needs: tuple[str, ...]
    reason: str


def scan_cases(root: str | Path = CASES_DIR) -> tuple[list[Case], list[Skipped]]:
    """Every case under `root` (folders with a case.yaml), in name order: those that load, and those
    that declare `needs` and do not load yet. A case without `needs` that does not load is an error."""
    cases, skipped = [], []
    for path in sorted(Path(root).glob("*/case.yaml")):
        try:
            cases.append(load_case(path.parent))
        except SpecError as exc:
            needs = _declared_needs(path)
            if not needs:
                raise
            reason = str(exc).splitlines()[0].replace(f"{path.parent}/", "")  # the file by its name in the case
            skipped.append(Skipped(path.parent.name, path.parent, needs, reason))
    return cases, skipped


def load_cases(root: str | Path = CASES_DIR) -> list[Case]:
    """Every case under `root` that loads, in name order (see `scan_cases` for those that wait on `needs`)."""
    return scan_cases(root)[0]


def _declared_needs(case_file: Path) -> tuple[str, ...]:
    """The case file's `needs` list as written (read apart, so a case that fails to load still says it)."""
    data = read_file(case_file)
    needs = data.get("needs") if isinstance(data, dict) else None
    return tuple(str(n) for n in needs) if isinstance(needs, list) else ()


def simulator(case: Case, cost_model) -> Simulator:
    """The simulator for a case: any layout the models allow (a published run need not be one
    `hetprof run` carries out), whole-batch hand-offs. The cluster's links are priced over the cost
    model's catalog too, so a calibrating catalog reaches them (not only the built-in one)."""
    cluster = case.cluster.using(cost_model.catalog)
    return Simulator(cluster, case.workload, cost_model, seed=0, streaming=False, executable=False,
                     backend=case.backend)


def price(case: Case, cost_model) -> Priced:
    """The case's step time and per-phase task seconds at its published layout."""
    sim = simulator(case, cost_model)
    candidate = pinned_candidate(sim, case.layout, file=str(case.folder / "case.yaml"))
    try:
        score = sim.evaluate(candidate)
    except InfeasibleError as exc:
        return Priced(case, math.inf, {}, (str(exc),))
    if not score.feasible:
        return Priced(case, math.inf, {}, tuple(score.violations) or ("infeasible",))
    phases = {}
    for phase, kinds in PHASES.items():
        tasks = [t for t in sim.graph.tasks if sim.graph.kind_of(t) in kinds]  # followers too
        phases[phase] = sum(score.task_seconds.get(t, 0.0) for t in tasks)
    return Priced(case, score.iteration_s, phases)
