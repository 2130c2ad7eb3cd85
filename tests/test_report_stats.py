"""The accuracy intervals, against values worked out by hand."""

import math

import pytest

from rlvr.report.stats import format_interval, wilson_interval


def test_wilson_interval_matches_the_formula_worked_by_hand():
    # p = 0.5, n = 100, z = 1.96: centre 0.5; half = 1.96 * sqrt(0.0025 + 0.000096) / 1.038416
    low, high = wilson_interval(0.5, 100, z=1.96)
    half = 1.96 * math.sqrt(0.25 / 100 + 1.96**2 / 40_000) / (1 + 1.96**2 / 100)
    assert low == pytest.approx(0.5 - half) and high == pytest.approx(0.5 + half)
    assert (low, high) == pytest.approx((0.4038, 0.5962), abs=1e-4)


def test_wilson_interval_stays_inside_0_1_and_is_not_empty_at_the_ends():
    low, high = wilson_interval(0.0, 20)
    assert low == 0.0 and high == pytest.approx(0.1611, abs=1e-4)  # 3.84/(20+3.84)
    low, high = wilson_interval(1.0, 20)
    assert high == 1.0 and low == pytest.approx(1 - 0.1611, abs=1e-4)


def test_wilson_interval_narrows_with_more_trials_and_refuses_nonsense():
    widths = [wilson_interval(0.3, n)[1] - wilson_interval(0.3, n)[0] for n in (50, 200, 800)]
    assert widths[0] > widths[1] > widths[2]
    with pytest.raises(ValueError):
        wilson_interval(0.5, 0)
    with pytest.raises(ValueError):
        wilson_interval(1.5, 10)
    assert format_interval(0.5, 100) == "0.500 [0.404, 0.596]"
