"""The α–β link model fitted to raw point-to-point timings: t(S) = α + S / β.

Least squares over the per-size medians of the raw samples: a shared host's occasional straggler
(a descheduled sender, a retransmit) then cannot tilt the line, while every raw sample is still
stored. The residual reported is the root-mean-square relative error of the fit over all raw
samples, a unitless figure that says how well a straight line explains the link (a shaper's
burst, a congested path or a bimodal route shows up here).
"""

from __future__ import annotations

import dataclasses
import math

from hetprof.errors import ExecutionError


@dataclasses.dataclass(frozen=True)
class LinkFit:
    alpha_s: float  # the fitted intercept, floored at 0 (a shaper's burst can pull it below)
    beta_Bps: float
    residual: float  # RMS of (fit - t) / t over the samples
    n: int
    alpha_fit: float  # the unfloored least-squares intercept


def fit_alpha_beta(sizes: list[float], seconds: list[float]) -> LinkFit:
    import numpy as np

    s = np.asarray(sizes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    levels = np.unique(s)
    if len(levels) < 2:
        raise ExecutionError("link fit needs samples at two or more message sizes")
    medians = np.array([np.median(t[s == level]) for level in levels])
    (alpha, inv_beta), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(levels), levels]), medians, rcond=None)
    design = np.column_stack([np.ones_like(s), s])
    if not inv_beta > 0:
        raise ExecutionError(f"link fit: time does not grow with message size (slope {inv_beta:.3g} s/B); "
                             "the sizes are too small to see the bandwidth")
    rel = (design @ np.array([alpha, inv_beta]) - t) / t
    return LinkFit(alpha_s=max(0.0, float(alpha)), beta_Bps=float(1.0 / inv_beta),
                   residual=float(math.sqrt(float(np.mean(rel**2)))), n=len(s), alpha_fit=float(alpha))
