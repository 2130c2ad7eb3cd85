"""Turn reward functions (TRL's signature) into one reward tensor, never raising."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

RewardFn = Callable[..., Sequence[float | None]]


def total_rewards(
    reward_fns: Sequence[RewardFn],
    weights: Sequence[float],
    prompts: list[str],
    completions: list[str],
    columns: dict[str, list],
) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted sum of `reward_fns(prompts, completions, **columns)`: [N] float tensor.

    `None` (not applicable) counts as 0. A function that raises, returns the wrong number of
    values or a non-finite value scores 0 for the affected rows and is counted in
    `reward/errors`; the run goes on. Each function's mean is reported as `reward/<name>`. A
    function with a `reason_counts(reset=...)` attribute (the math verifier) also reports its
    verdicts of this call by reason as `verifier/<name>/<reason>` (timeouts among them).
    """
    n = len(completions)
    total = torch.zeros(n)
    metrics: dict[str, float] = {}
    errors = 0
    for fn, weight in zip(reward_fns, weights, strict=True):
        name = getattr(fn, "__name__", type(fn).__name__)
        counts = getattr(fn, "reason_counts", None)
        if callable(counts):
            counts(reset=True)  # forget verdicts from outside this call (e.g. evaluation)
        try:
            values = list(fn(prompts, completions, **columns))
            if len(values) != n:
                raise ValueError(f"{name} returned {len(values)} rewards for {n} completions")
        except Exception:  # a verifier must never kill the run: score 0 and count it
            values, errors = [None] * n, errors + n
        clean = []
        for v in values:
            ok = v is None or (isinstance(v, (int, float)) and math.isfinite(v))
            errors += not ok
            clean.append(float(v) if ok and v is not None else 0.0)
        scores = torch.tensor(clean)
        metrics[f"reward/{name}"] = scores.mean().item()
        if callable(counts):
            for reason, count in counts(reset=True).items():
                metrics[f"verifier/{name}/{reason}"] = float(count)
        total += weight * scores
    metrics["reward/errors"] = float(errors)
    return total, metrics


def reward_columns(rows: list[dict[str, Any]]) -> dict[str, list]:
    """The keyword columns a reward function receives for per-completion `rows`: every field
    but "prompt" that any row has (in first-seen order), None where a row lacks it."""
    names = dict.fromkeys(k for r in rows for k in r if k != "prompt")
    return {k: [r.get(k) for r in rows] for k in names}
