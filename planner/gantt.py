"""A Gantt chart (PNG) of one steady-state iteration: one row per group, one bar per event.

Compute bars are coloured by task, transfers and weight syncs hatched, offloads grey; work of a
neighbouring step (async overlap) is labelled with its step offset, so the overlap is visible.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

from hetprof.planner.candidate import Candidate
from hetprof.planner.schedule import Event
from hetprof.planner.simulator import Score
from hetprof.specs import FOLLOWS
from hetprof.task_colours import TASK_COLOURS
from hetprof.task_colours import task_colour as _colour


def group_label(candidate: Candidate, events: Sequence[Event], g: int) -> str:
    """"group G: tasks" naming every task with a bar in the group — the candidate's own and the ones
    the simulator places beside their leaders (actor_logprob) — wrapped, never cut, onto short lines."""
    tasks = list(candidate.groups[g])
    for e in events:
        task = e.name.split(" (step", 1)[0]
        if e.kind == "compute" and e.group == g and task not in tasks:
            leader = FOLLOWS.get(task)
            tasks.insert(tasks.index(leader) if leader in tasks else len(tasks), task)
    return "\n".join(textwrap.wrap(f"group {g}: {', '.join(tasks)}", width=44))


def save_gantt(score: Score, candidate: Candidate, path: str | Path, title: str = "") -> Path:
    """Write the chart; returns the path. Needs a feasible score (its timeline)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    path = Path(path)
    events = score.timeline
    groups = len(candidate.groups)
    # Each group gets a compute lane and, below it, a lane for what flows into it.
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.9 * groups))
    labels, ticks = [], []
    for g in range(groups):
        ticks += [2 * g, 2 * g + 0.8]
        labels += [group_label(candidate, events, g), "  transfers in"]
    for e in events:
        lane = 2 * e.group + (0.8 if e.kind in ("transfer", "weights") else 0.0)
        height = 0.7 if e.kind == "compute" else 0.5
        if e.kind == "compute":
            style = {"color": _colour(e.name), "edgecolor": "black", "linewidth": 0.3}
        elif e.kind == "offload":
            style = {"color": "#bbbbbb", "edgecolor": "black", "linewidth": 0.3}
        else:
            base = e.name.split(":", 1)[1].split("->")[0] if ":" in e.name else e.name
            style = {"color": "white", "edgecolor": _colour(base), "hatch": "///", "linewidth": 0.8}
        ax.barh(lane, e.end - e.start, left=e.start, height=height, **style)
        if e.end - e.start > 0.06 * max(score.iteration_s, 1e-9) and e.kind == "compute":
            ax.text((e.start + e.end) / 2, lane, e.name, ha="center", va="center", fontsize=7)
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds into one steady-state iteration")
    ax.set_xlim(0, max([score.iteration_s] + [e.end for e in events]))
    ax.set_title(title or f"one iteration: {score.iteration_s:.2f} s, bottleneck {score.bottleneck}", fontsize=10)
    legend = [Patch(color=c, label=t) for t, c in TASK_COLOURS.items() if any(e.name.startswith(t) for e in events)]
    legend += [Patch(facecolor="white", edgecolor="black", hatch="///", label="transfer / weight sync"),
               Patch(color="#bbbbbb", label="offload / reload")]
    ax.legend(handles=legend, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=4)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
