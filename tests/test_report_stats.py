"""The accuracy intervals, against values worked out by hand."""

import math

import pytest

from rlvr.report.stats import (
    bootstrap_interval,
    format_interval,
    pass_at_k,
    sample_metrics,
    wilson_interval,
)


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


def test_pass_at_k_is_the_unbiased_estimator_worked_by_hand():
    # n = 5, c = 2, k = 2: 1 - C(3, 2) / C(5, 2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # n = 10, c = 3, k = 4: 1 - C(7, 4) / C(10, 4) = 1 - 35/210
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - 35 / 210)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 is c / n
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(6, 5, 2) == 1.0  # fewer wrong completions than k: every draw passes
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)  # k > n
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_pass_at_k_agrees_with_brute_force_over_all_draws():
    from itertools import combinations

    outcomes = [1, 0, 0, 1, 0, 1, 0]  # n = 7, c = 3
    for k in range(1, 8):
        draws = list(combinations(outcomes, k))
        expected = sum(any(d) for d in draws) / len(draws)
        assert pass_at_k(7, 3, k) == pytest.approx(expected)


def test_sample_metrics_by_hand_with_partial_scores():
    scores = [[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.5, 0.0], [1.0, 1.0, 1.0, 1.0]]
    result = sample_metrics(scores, ks=[2, 4, 9])  # 9 > n is dropped
    assert result["n"] == 4 and result["problems"] == 3
    # mean@4 = (0.5 + 0.125 + 1) / 3; a 0.5 is not "correct" for pass@k
    assert result["mean@4"] == pytest.approx((0.5 + 0.125 + 1.0) / 3)
    assert sorted(result["pass@k"]) == [1, 2, 4]
    assert result["pass@k"][1] == pytest.approx((0.5 + 0 + 1) / 3)
    assert result["pass@k"][2] == pytest.approx((5 / 6 + 0 + 1) / 3)
    assert result["pass@k"][4] == pytest.approx(2 / 3)
    for name in ("mean@4", "pass@1", "pass@2", "pass@4"):
        low, high = result["ci95"][name]
        value = result["mean@4"] if name == "mean@4" else result["pass@k"][int(name[5:])]
        assert 0.0 <= low <= value <= high <= 1.0
    with pytest.raises(ValueError):
        sample_metrics([[1.0, 0.0], [1.0]])


def test_one_greedy_sample_per_problem_gets_the_wilson_interval():
    scores = [[1.0]] * 30 + [[0.0]] * 70
    result = sample_metrics(scores)
    assert result["pass@k"][1] == pytest.approx(0.3)
    assert result["ci95"]["pass@1"] == pytest.approx(wilson_interval(0.3, 100))


def test_bootstrap_interval_is_seeded_covers_the_mean_and_narrows_with_problems():
    values = [1.0, 0.0] * 50
    low, high = bootstrap_interval(values)
    assert bootstrap_interval(values) == (low, high)  # seeded
    assert low < 0.5 < high
    # close to the normal interval 0.5 +- 1.96 * sqrt(0.25 / 100) = +- 0.098
    assert high - low == pytest.approx(2 * 0.098, abs=0.03)
    wide = bootstrap_interval([1.0, 0.0] * 5)
    assert wide[1] - wide[0] > high - low
    assert bootstrap_interval([0.4]) == (0.4, 0.4)
    with pytest.raises(ValueError):
        bootstrap_interval([])
