"""Readable reports of plans: one plan in detail, several searches side by side as ratios.

What an engineer asks of a plan first: which tasks share which GPUs, each task's layout and time,
what bounds the iteration, and how close each GPU type runs to its memory limit. The comparison
table answers "how much better is the search than the baselines" as ratios, the form the
published results use.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from hetprof.costmodels import moe
from hetprof.display import Col, escaped, fitted_table, shown
from hetprof.planner.candidate import Candidate
from hetprof.planner.provenance import fitted_warnings, provenance_lines
from hetprof.planner.simulator import Score, Simulator
from hetprof.specs.units import fmt_bytes, fmt_seconds


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One search's answer, for the side-by-side table."""

    search: str
    candidate: Candidate | None
    score: Score | None
    seconds: float = 0.0
    error: str = ""
    trace: tuple[dict, ...] = ()
    extra: dict = dataclasses.field(default_factory=dict, compare=False)


def _types(sim: Simulator, devices: Sequence[str]) -> str:
    counts = Counter(sim.devices[d].type for d in devices)
    return " + ".join(f"{n}×{t}" for t, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _regions(sim: Simulator, devices: Sequence[str]) -> str:
    return ", ".join(sorted({sim.devices[d].region for d in devices}))


def _secs(x: float) -> str:
    return fmt_seconds(x) if math.isfinite(x) else "∞"


def _dollars(x: float) -> str:
    return f"${x:.2f}" if x >= 1 else f"${x:.3g}"


def _shares(shares: Sequence[float]) -> str:
    if max(shares) - min(shares) < 1e-9:
        return f"equal ({len(shares)}×{shares[0]:.3f})"
    if len(shares) <= 4:
        return ", ".join(f"{s:.3f}" for s in shares)
    return f"{min(shares):.3f} … {max(shares):.3f}"


# Dropped first when the terminal is narrow: batch shares, then each task's GPUs (the groups table lists them).
TASK_COLUMNS = (Col("task"), Col("group", "right", drop=2), Col("layout"), Col("GPUs", drop=3),
                Col("batch shares", drop=4), Col("seconds", "right"), Col("offload", "right", drop=1))


def print_plan(console: Console, sim: Simulator, cand: Candidate, score: Score, title: str = "plan") -> None:
    """Groups, GPUs, layouts, per-task times, bottleneck, memory headroom per GPU type."""
    wl = sim.workload
    head = (f"[bold]{title}[/bold]: {escaped(wl.name)} ({wl.algorithm}, {wl.mode}"
            + (f", staleness {wl.staleness}" if wl.mode == "async" else "") + f") on {escaped(sim.cluster.name)} — "
            f"cost model {getattr(sim.cost_model, 'name', type(sim.cost_model).__name__)}, "
            f"generation backend {sim.backend}")
    console.print(head)
    if not score.feasible:
        console.print("[red]infeasible:[/red]")
        for v in score.violations:
            console.print(f"  • {v}")
        return
    groups = Table(title="groups (tasks in a group time-share its GPUs)")
    for col in ("group", "tasks", "GPUs", "regions"):
        groups.add_column(col)
    layouts, grouped = sim.with_followers(cand)  # the log-prob pass shown beside its trainer
    for i, (tasks, devs) in enumerate(zip(grouped, cand.group_devices, strict=True)):
        groups.add_row(str(i), ", ".join(tasks), _types(sim, devs), _regions(sim, devs))
    console.print(groups)
    rows = []
    group_of = {t: i for i, g in enumerate(grouped) for t in g}
    for t in sim.graph.tasks:
        lay = layouts[t]
        off = score.offload_s.get(t, 0.0)
        rows.append([t, str(group_of[t]), lay.describe(), _types(sim, lay.devices()), _shares(lay.shares),
                     _secs(score.task_seconds.get(t, math.inf)), _secs(off) if off else ""])
    tasks = fitted_table(console, TASK_COLUMNS, rows, title="tasks", hint="a wider terminal shows them")
    console.print(tasks)
    chosen = micro_batch_choices(sim, layouts)
    if chosen:
        console.print("micro-batches the planner chose (training.max_tokens_per_microbatch unset: padded, the "
                      "largest that fits each GPU): " + "; ".join(chosen), highlight=False)
    load = expert_load_line(sim, layouts)
    if load:
        console.print(load, highlight=False)
    crit = Table(title="critical path of one steady-state iteration")
    crit.add_column("what")
    crit.add_column("seconds", justify="right")
    crit.add_column("share", justify="right")
    total = sum(score.breakdown.values()) or 1.0
    for name, secs in sorted(score.breakdown.items(), key=lambda kv: -kv[1]):
        crit.add_row(name, _secs(secs), f"{100 * secs / total:.0f}%")
    console.print(crit)
    mem = Table(title="memory headroom at the peak phase (least free GPU of each type)")
    mem.add_column("GPU type")
    mem.add_column("free", justify="right")
    for t, free in sorted(score.memory_headroom.items()):
        mem.add_row(t, fmt_bytes(free))
    console.print(mem)
    console.print(f"iteration [bold]{_secs(score.iteration_s)}[/bold] · throughput {score.throughput:.1f} seq/s · "
                  f"bottleneck [bold]{score.bottleneck}[/bold] · {_dollars(score.cost_per_iteration)} per iteration "
                  f"({_dollars(score.price_per_hour)}/h for {len(set(cand.devices()))} GPUs)")
    print_provenance(console, sim)


def expert_load_line(sim: Simulator, layouts: dict) -> str | None:
    """What the plan assumes of an MoE router's load, where a layout spreads experts (ep > 1, or whole
    experts folded over TP ranks): every rank waits for the busiest, so the figure multiplies the
    expert GEMMs and all-to-alls."""
    spread = {model.name: (model, lay.expert_ranks) for t, lay in layouts.items()
              if lay.expert_ranks > 1 and (model := sim.graph.model_of(t)).moe is not None}
    if not spread:
        return None
    stated = sim.workload.expert_imbalance
    parts = [f"{name} {moe.imbalance(model, ep, stated):.2f}× the mean ({moe.imbalance_source(model, stated)})"
             for name, (model, ep) in sorted(spread.items())]
    return "expert load: the busiest expert-parallel rank carries " + "; ".join(parts)


def micro_batch_choices(sim: Simulator, layouts: dict) -> list[str]:
    """'task: N tokens per GPU' (with the GPU types where a task's budgets differ) for every pass the
    planner chose a padded micro-batch for; empty when the workload fixes its own token budget."""
    out = []
    for t, lay in layouts.items():
        per_type: dict[str, set[int]] = {}
        for r, share in enumerate(lay.shares):
            batch = max(1, round(share * sim.workload.sequences_per_step))
            for s in range(lay.pp):
                dev = sim.devices[lay.stage_devices(r, s)[0]]
                budget = sim.planning.micro_tokens(t, dev.type, lay.tp_of(r), lay.layer_splits[r][s], batch, lay.dp,
                                                   lay.sharding, lay.sp if lay.sp > 1 else None, lay.cp)
                if budget is not None:
                    per_type.setdefault(dev.type, set()).add(budget)
        budgets = sorted(set().union(*per_type.values())) if per_type else []
        if len(budgets) == 1:
            out.append(f"{t} {budgets[0]:,} tokens")
        elif budgets:
            out.append(f"{t} " + ", ".join(f"{min(b):,}–{max(b):,} tokens on {k}" if len(b) > 1 else f"{min(b):,} on {k}"
                                           for k, b in sorted(per_type.items())))
    return out


def print_provenance(console: Console, sim: Simulator) -> None:
    """Per GPU type, whether its numbers are measured, reference or datasheet; fitted-model gaps as warnings."""
    console.print("numbers per GPU type (measured > reference > datasheet):")
    for line in provenance_lines(sim):
        console.print(f"  {line}", highlight=False)
    for warning in fitted_warnings(sim):
        console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)


def print_comparison(console: Console, outcomes: Sequence[Outcome], reference: str | None = None,
                     title: str = "searches side by side") -> None:
    """Throughput and cost of each search, as ratios to `reference` (default: the best). A narrow terminal
    loses the effort columns first; the ratio, the price and why a search failed always stay."""
    feasible = [o for o in outcomes if o.score is not None and o.score.feasible]
    ref = next((o for o in feasible if o.search == reference), None)
    if ref is None and feasible:
        ref = min(feasible, key=lambda o: o.score.iteration_s)
    searched = any(o.extra.get("evaluations") is not None for o in outcomes)
    cols = [Col("search"), Col("iteration", "right"), Col("seq/s", "right", drop=1),
            Col(f"throughput ×{ref.search}" if ref else "throughput ratio", "right"), Col("$ / iteration", "right"),
            Col("search time", "right", drop=2), Col("note"), *([Col("evaluations", "right", drop=3)] if searched else [])]
    rows = []
    for o in outcomes:
        evals = [f"{o.extra['evaluations']:,}" if o.extra.get("evaluations") is not None else "—"] if searched else []
        if o.score is None or not o.score.feasible:
            why = o.error or ("; ".join(o.score.violations[:1]) if o.score else "no plan")
            if "cheapest_per_hour" in o.extra:  # over the budget: the figure, not the search's whole sentence
                why = f"none within budget; cheapest feasible ${o.extra['cheapest_per_hour']:.2f}/h"
            rows.append([o.search, "—", "—", "—", "—", f"{o.seconds:.1f} s", shown(why, "red"), *evals])
            continue
        ratio = ref.score.iteration_s / o.score.iteration_s if ref else 1.0
        rows.append([o.search, _secs(o.score.iteration_s), f"{o.score.throughput:.1f}", f"{ratio:.2f}",
                     _dollars(o.score.cost_per_iteration), f"{o.seconds:.1f} s", o.score.bottleneck, *evals])
    title = title + (f" (ratios against {ref.search})" if ref else "")
    console.print(fitted_table(console, cols, rows, title=title, hint="a wider terminal shows them"))
