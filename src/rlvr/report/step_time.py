"""Where a step's seconds go: the median split over a run's steps, and its one-line form."""

from __future__ import annotations

import statistics
from typing import Any

from rlvr.report.timer import STEP_PARTS


def step_time_split(records: list[dict[str, Any]]) -> dict[str, float]:
    """Median seconds per step of each part (`time/<part>_s`), of `other` and of the whole
    step, plus median completion tokens per second end to end and while generating. Parts a
    run never timed (no critic, say) are left out."""
    steps = [r for r in records if "time/step_s" in r and "time/forward_s" in r]
    if not steps:
        return {}
    split: dict[str, float] = {}
    for part in (*STEP_PARTS, "other", "step"):
        values = [r[f"time/{part}_s"] for r in steps if f"time/{part}_s" in r]
        if values:
            split[part] = statistics.median(values)
    for key in ("completion_tokens_per_s", "generate_tokens_per_s"):
        split[key] = statistics.median(r[f"throughput/{key}"] for r in steps)
    return split


def format_step_time(split: dict[str, float]) -> str:
    """E.g. `median step 0.82 s = generate 0.37 (45%) + verify 0.00 (0%) + ...; 5,700
    completion tokens/s (13,000 while generating)`: every part the run timed."""
    if not split:
        return "no timed steps"
    step = split["step"]
    parts = [
        f"{part.replace('_', ' ')} {split[part]:.2f} ({split[part] / step:.0%})"
        for part in (*STEP_PARTS, "other")
        if part in split
    ]
    return (
        f"median step {step:.2f} s = " + " + ".join(parts) + "; "
        f"{split['completion_tokens_per_s']:,.0f} completion tokens/s "
        f"({split['generate_tokens_per_s']:,.0f} while generating)"
    )
