"""Intervals for the accuracies a run reports."""

from __future__ import annotations

import math

Z95 = 1.959963984540054
"""The standard normal's 97.5th percentile: a two-sided 95% interval."""


def wilson_interval(accuracy: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion `accuracy` observed over `n` independent trials
    (95% by default): (low, high), inside [0, 1] and sensible at 0 and 1, unlike the normal
    approximation's p +- z sqrt(p(1-p)/n).

    For a sampled accuracy averaged over k completions per problem, pass `n` = problems, not
    problems x k: the problem is the independent unit, and the variance of a per-problem mean
    is at most p(1-p), so the interval is conservative."""
    if n <= 0:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"accuracy must be in [0, 1], got {accuracy}")
    denominator = 1 + z * z / n
    centre = (accuracy + z * z / (2 * n)) / denominator
    half = z * math.sqrt(accuracy * (1 - accuracy) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def format_interval(accuracy: float, n: int) -> str:
    """`0.430 [0.363, 0.500]`: an accuracy and its 95% Wilson interval."""
    low, high = wilson_interval(accuracy, n)
    return f"{accuracy:.3f} [{low:.3f}, {high:.3f}]"
