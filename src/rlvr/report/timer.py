"""Where a step's seconds go: `with timer("generate"): ...` around each part of the step."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator

STEP_PARTS = (  # time/<part>_s of every training step; time/other_s is the rest of the step
    "generate",
    "verify",
    "ref_logprobs",
    "teacher_logprobs",
    "old_logprobs",
    "advantage",
    "forward",
    "backward",
    "optimizer",
    "critic",
)


class StepTimer:
    """Seconds per named part of one step, from its creation to `metrics()`.

    Parts are summed when timed more than once (dynamic sampling's rounds, the mu passes).
    Parts outside `STEP_PARTS` (e.g. "update", which spans forward, backward and optimizer) are
    reported too but are not subtracted from the step when `time/other_s` is worked out."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, part: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[part] += time.perf_counter() - t0

    def add(self, part: str, seconds: float) -> None:
        """Count `seconds` toward `part` (a split measured elsewhere, e.g. by worker threads)."""
        self.seconds[part] += seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def metrics(self) -> dict[str, float]:
        """`time/<part>_s` of every part timed, `time/step_s` since creation, and `time/other_s`:
        the step less its named parts (never negative)."""
        step = self.elapsed()
        out = {f"time/{part}_s": s for part, s in self.seconds.items()}
        named = sum(s for part, s in self.seconds.items() if part in STEP_PARTS)
        out["time/step_s"] = step
        out["time/other_s"] = max(0.0, step - named)
        return out
