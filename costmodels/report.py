"""The predicted-vs-measured figure `hetprof fit --report` writes: held-out fitted and analytical."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from hetprof.costmodels.fitting import TaskFit


def plot_fits(fits: list[TaskFit], path: str | Path) -> Path:
    """One log-log panel per fitted model: held-out predictions and the roofline against measurements."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(fits))
    rows = math.ceil(len(fits) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 4.2 * rows), squeeze=False)
    for ax, fit in zip(axes.ravel(), fits, strict=False):
        y = fit.measured * 1e3
        held = fit.heldout.predicted * 1e3
        shown = ~np.isnan(held)
        ax.scatter(y[shown], held[shown], s=18, label=f"fitted, held out ({fit.heldout.mape:.1%})")
        ax.scatter(y, fit.analytical * 1e3, s=18, marker="x", alpha=0.7,
                   label=f"analytical ({fit.analytical_mape:.1%})")
        if (~shown).any():
            ax.scatter(y[~shown], fit.fitted_train[~shown] * 1e3, s=10, marker=".", color="grey",
                       label="fitted, in training only")
        values = np.concatenate([y, held[shown], fit.analytical * 1e3])
        values = values[values > 0]
        lo, hi = values.min() / 1.5, values.max() * 1.5
        line = np.geomspace(lo, hi, 50)
        ax.plot(line, line, color="black", lw=0.8)
        ax.fill_between(line, line * 0.9, line * 1.1, color="grey", alpha=0.15, label="±10%")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured (ms)",
               ylabel="predicted (ms)", title=f"{fit.task_type} · {fit.device_type} {fit.dtype} · {fit.family}")
        ax.legend(fontsize=7, loc="upper left")
    for ax in axes.ravel()[len(fits):]:
        ax.set_visible(False)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
