"""Intervals for the accuracies a run reports."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

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


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k for one problem (Chen et al. 2021, "Evaluating Large
    Language Models Trained on Code"): the chance that at least one of k completions drawn
    without replacement from the n sampled, c of them correct, is correct:
    1 - C(n - c, k) / C(n, k), computed as a running product to stay exact for large n.

    Needs 1 <= k <= n and 0 <= c <= n. pass@1 is c / n."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"correct count c must be in [0, n={n}], got {c}")
    if n - c < k:  # every draw of k holds a correct completion
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):  # prod_{i=n-c+1}^{n} (1 - k / i) = C(n-c, k) / C(n, k)
        miss *= 1.0 - k / i
    return 1.0 - miss


def bootstrap_interval(
    values: Sequence[float], resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` (one value per problem: the
    problem is the independent unit): resample the problems with replacement `resamples`
    times, take each resample's mean (dividing by len(values)), and return the
    (1 - level) / 2 and (1 + level) / 2 quantiles of those means. Seeded, so a report is
    reproducible. One value gives a zero-width interval."""
    if not values:
        raise ValueError("bootstrap_interval needs at least one value")
    n = len(values)
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    low_index = int(math.floor((1 - level) / 2 * (resamples - 1)))
    high_index = int(math.ceil((1 + level) / 2 * (resamples - 1)))
    return means[low_index], means[high_index]


def sample_metrics(scores: Sequence[Sequence[float]], ks: Sequence[int] = ()) -> dict[str, Any]:
    """Accuracy of n sampled completions per problem (`scores[problem][sample]`, each in
    [0, 1]; every problem the same n), each with its 95% interval:

    - `mean@n`: the mean score over all n x problems completions (sampled pass@1 when the
      scores are 0/1), interval by bootstrap over problems of the per-problem means;
    - `pass@k` for each k in `ks` with 1 <= k <= n (k = 1 always included): the unbiased
      estimator per problem, counting a completion correct only at a score of exactly 1.0,
      averaged over problems (divides by the number of problems); bootstrap intervals over
      problems. With n = 1 and 0/1 scores, pass@1 is a proportion and gets a Wilson interval.

    Returns {"n": n, "problems": P, "mean@n": x, "pass@k": {k: x}, "ci95": {name: (lo, hi)}}.
    """
    if not scores:
        raise ValueError("sample_metrics needs at least one problem")
    n = len(scores[0])
    if n == 0 or any(len(row) != n for row in scores):
        raise ValueError("every problem needs the same number (>= 1) of sampled scores")
    ks = sorted({1, *(k for k in ks if 1 <= k <= n)})
    per_problem_mean = [sum(row) / n for row in scores]
    correct = [sum(1 for s in row if s == 1.0) for row in scores]
    problems = len(scores)
    result: dict[str, Any] = {"n": n, "problems": problems, "pass@k": {}, "ci95": {}}
    result[f"mean@{n}"] = sum(per_problem_mean) / problems
    result["ci95"][f"mean@{n}"] = bootstrap_interval(per_problem_mean)
    binary = all(s in (0.0, 1.0) for row in scores for s in row)
    for k in ks:
        per_problem = [pass_at_k(n, c, k) for c in correct]
        value = sum(per_problem) / problems
        result["pass@k"][k] = value
        if n == 1 and binary:
            result["ci95"][f"pass@{k}"] = wilson_interval(value, problems)
        else:
            result["ci95"][f"pass@{k}"] = bootstrap_interval(per_problem)
    return result
