"""`RunLog`: a run's `[rlvr] ...` lines and its progress-bar switch, as one small object.

Pipelines take a `RunLog` instead of a `progress: bool` and a `_say` helper of their own: the
log says a line (`log.say(...)`) or keeps quiet, and hands its switch to the progress bars of
the trainers (`progress=log.progress`). A quiet log (`RunLog(progress=False)`) is the null
object: the caller never branches on it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class RunLog:
    """Where a run's progress lines go, and whether they (and the progress bars) show."""

    progress: bool = True
    """Say the `[rlvr]` lines and show progress bars; False: neither (warnings still print)."""
    to_stderr: bool = False
    """Say the lines on stderr (a pipeline's, beside the stages' own output) instead of stdout."""
    prefix: str = "rlvr"
    """The bracketed tag in front of every line (`[rlvr compare] ...`)."""

    def say(self, message: str) -> None:
        """Print `[PREFIX] message` (flushed) unless the log is quiet."""
        if self.progress:
            stream = sys.stderr if self.to_stderr else sys.stdout
            print(f"[{self.prefix}] {message}", file=stream, flush=True)

    def only_if(self, on: bool) -> RunLog:
        """This log where `on` holds, else a quiet one (e.g. rank 0 of a torchrun speaks)."""
        return self if on else replace(self, progress=False)


QUIET = RunLog(progress=False)
"""The log that says nothing and shows no progress bars."""
