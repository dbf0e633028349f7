"""The group holding a mini-batch's longest sequence decides its optimizer step, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from hetprof.planner.imbalance import longest_sequence_factor


def test_one_long_sequence_outlasts_a_groups_fair_share():
    lengths = np.array([100] * 8 + [1000])
    # 9 sequences over 4 groups: priced at 3 of the mean 200 tokens = 600; the group with 1000 takes 1000
    assert longest_sequence_factor(lengths, 1, 4) == pytest.approx(1000 / 600)


def test_the_longest_sequences_spread_one_per_mini_batch():
    lengths = np.array([900] + [100] * 8)
    # steps [900, 100, 100], [100] * 3, [100] * 3 over 3 groups: one sequence each, priced at the step's
    # mean (1100/3, 100, 100); the first waits for its 900
    assert longest_sequence_factor(lengths, 3, 3) == pytest.approx((900 + 100 + 100) / (1100 / 3 + 200))


def test_nothing_waits_when_every_sequence_fits_a_groups_share():
    assert longest_sequence_factor(np.array([100] * 8 + [1000]), 1, 1) == 1.0
    assert longest_sequence_factor(np.full(64, 50.0), 4, 8) == pytest.approx(1.0)
    assert longest_sequence_factor(np.array([300] * 30 + [400]), 1, 4) == pytest.approx(1.0)  # 400 < 8 × 303
