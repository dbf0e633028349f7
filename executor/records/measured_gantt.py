"""`hetprof validate RUN --gantt OUT.png`: one iteration as measured, above the plan's prediction.

The measured panel draws the record's `timeline`: every rank's span of each task (its compute,
the leader's reward/advantage, each sync edge as its rank timed it, and `wait_rollouts`, the
leader waiting for generation), one row per device, in seconds since the iteration's first span
began. Ranks on one host share its wall clock; across hosts the rows are as far off as the clocks.

The predicted panel lays the plan's per-task seconds (the record's `predicted`) on the same
devices in the RL iteration's dataflow order: generation, then the inference passes, training,
and the weight syncs, each starting once its inputs are done and its devices are free. The plan
file holds per-task predictions, not the simulator's event times: `hetprof plan --gantt` draws
those, with async overlap.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from hetprof.errors import HetprofError
from hetprof.specs.vocabulary import SYNC_EDGES, Task
from hetprof.task_colours import OTHER, task_colour

INFERENCE = (Task.REF_INFER, Task.REWARD_INFER, Task.CRITIC_INFER, Task.ACTOR_LOGPROB)
# what each task waits for within one synchronous iteration
DEPENDS = {Task.ACTOR_GEN: (), **{t: (Task.ACTOR_GEN,) for t in INFERENCE},
           Task.ACTOR_TRAIN: (Task.ACTOR_GEN, *INFERENCE), Task.CRITIC_TRAIN: (Task.ACTOR_GEN, *INFERENCE)}
WAITS = ("wait_rollouts",)
# the leader's own phases, which are no planned task: told apart from each other and from the tasks
PHASE_COLOURS = {"reward": "#937860", "advantage": "#DA8BC3", "checkpoint": "#8C8C8C"}


def pick_iteration(records: list[dict[str, Any]], skip: int, iteration: int | None) -> dict[str, Any]:
    """The record drawn: `iteration` if given, else the steady iteration of median time that has a timeline."""
    timed = [r for r in records if r.get("timeline")]
    if not timed:
        raise HetprofError("the run's records have no task timeline (recorded by hetprof run from this "
                             "version on): nothing to draw")
    if iteration is not None:
        found = [r for r in timed if r["iteration"] == iteration]
        if not found:
            raise HetprofError(f"--iteration {iteration}: no timeline recorded for it "
                                 f"(iterations with one: {timed[0]['iteration']}..{timed[-1]['iteration']})")
        return found[0]
    steady = timed[skip:] or timed
    median = statistics.median_low(r["iteration_s"] for r in steady)
    return next(r for r in steady if r["iteration_s"] == median)


def predicted_bars(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's per-task seconds scheduled on the record's devices in dataflow order."""
    predicted, devices = record.get("predicted", {}), record.get("devices", {})
    free: dict[str, float] = {}
    done: dict[str, float] = {}
    bars: list[dict[str, Any]] = []

    def place(name: str, seconds: float, on: list[str], after: tuple[str, ...]) -> None:
        start = max([done.get(d, 0.0) for d in after] + [free.get(d, 0.0) for d in on] + [0.0])
        done[name] = start + seconds
        for device in on:
            free[device] = done[name]
            bars.append({"device": device, "task": name, "start": start, "end": done[name]})

    for task, after in DEPENDS.items():
        if predicted.get(task) and devices.get(task):
            place(task, float(predicted[task]), devices[task], after)
    for edge, (_, sender, receiver) in SYNC_EDGES.items():
        if predicted.get(str(edge)) and devices.get(str(receiver)):
            place(str(edge), float(predicted[str(edge)]), devices[str(receiver)], (str(sender),))
    return bars


def measured_bars(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(span) for span in record.get("timeline", [])]


MAX_ROWS = 256  # device rows one picture holds legibly (and within matplotlib's image size)


def check_gantt_path(path: str | Path) -> None:
    """Refuse `validate --gantt` into a folder that does not exist before anything is drawn: a typo in
    the folder must not make a new one nor read as success."""
    folder = Path(path).parent
    if not folder.is_dir():
        raise HetprofError(f"--gantt {path}: the folder {folder} does not exist")


def save_measured_gantt(records: list[dict[str, Any]], path: str | Path, skip: int = 1,
                        iteration: int | None = None) -> Path:
    """Draw one iteration's measured timeline above its predicted one; returns the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    record = pick_iteration(records, skip, iteration)
    measured, predicted = measured_bars(record), predicted_bars(record)
    rows = sorted({b["device"] for b in measured + predicted})
    if len(rows) > MAX_ROWS:
        raise HetprofError(f"--gantt: iteration {record['iteration']} spans {len(rows):,} devices, more than the "
                           f"{MAX_ROWS} one picture draws")
    end = max([b["end"] for b in measured + predicted] + [1e-9])
    fig, axes = plt.subplots(2, 1, figsize=(11, 2.0 + 0.9 * len(rows)), sharex=True)
    pred_s = record.get("predicted_iteration_s")
    _panel(axes[0], measured, rows, end, f"run {record.get('run', '?')}, iteration {record['iteration']}: "
                                         f"measured {record['iteration_s']:.2f} s")
    _panel(axes[1], predicted, rows, end, "predicted: the plan's per-task seconds in dataflow order"
           + (f" (plan's iteration {pred_s:.2f} s)" if pred_s else ""))
    axes[1].set_xlabel("seconds since the iteration's first task began")
    handles = legend_handles(measured + predicted)
    axes[1].legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.5),
                   ncol=min(len(handles), 6) or 1)
    fig.tight_layout()
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # the CLI refused a missing folder already
        fig.savefig(path, dpi=120, bbox_inches="tight")
    except (OSError, ValueError) as exc:  # an unwritable folder, or a suffix matplotlib has no format for
        raise HetprofError(f"--gantt {path}: cannot write the picture ({exc})") from None
    finally:
        plt.close(fig)
    return path


def bar_style(name: str) -> dict[str, Any]:
    """How a span is drawn: a task in its colour, a sync edge hatched in its sender's, a wait pale."""
    if name in WAITS:
        return {"facecolor": "#dddddd", "edgecolor": "#888888", "linewidth": 0.3}
    if name in {str(e) for e in SYNC_EDGES}:
        return {"facecolor": "white", "edgecolor": task_colour(SYNC_EDGES[name][1]), "hatch": "///", "linewidth": 0.8}
    colour = PHASE_COLOURS.get(name) or task_colour(name)
    return {"facecolor": colour if colour != OTHER else "#bbbbbb", "edgecolor": "black", "linewidth": 0.3}


def legend_handles(bars: list[dict[str, Any]]) -> list[Any]:
    """One legend entry per span name drawn, in order of first appearance (short spans carry no label)."""
    from matplotlib.patches import Patch

    names = list(dict.fromkeys(b["task"] for b in bars))
    return [Patch(label=name, **bar_style(name)) for name in names]


def _panel(ax: Any, bars: list[dict[str, Any]], rows: list[str], end: float, title: str) -> None:
    for bar in bars:
        name, lane, width = bar["task"], rows.index(bar["device"]), bar["end"] - bar["start"]
        ax.barh(lane, width, left=bar["start"], height=0.6, **bar_style(name))
        if width > 0.06 * end:
            ax.text(bar["start"] + width / 2, lane, name, ha="center", va="center", fontsize=7)
    if not bars:
        ax.text(0.5, 0.5, "nothing to draw: no per-task seconds in the record", transform=ax.transAxes,
                ha="center", va="center", fontsize=8, color="#666666")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows, fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, end * 1.02)
    ax.set_title(title, fontsize=9)
