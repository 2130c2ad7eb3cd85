"""What every pipeline entry point shares: the user-input boundary and the seed offsets.

Errors a user can fix by changing a flag or a file leave here as `rlvr.config.UserError`
(the CLI prints them on one line and exits 2): an unknown task or an unusable task file. (A
run directory's refusals are user errors where `RunDirectory` raises them.)
"""

from __future__ import annotations

from typing import Any

from rlvr.config import UserError
from rlvr.tasks.registry import build_task
from rlvr.tasks.spec import TaskSpec

TRAIN_ROWS_SEED_OFFSET = 10_000
"""Added to a run's seed to seed its stream of training rows (RL), so the rows differ from
those any other seeded use of the same seed draws (the base corpus, evaluation)."""

SAMPLE_ROWS_SEED_OFFSET = 20_000
"""Added to a pipeline's seed to seed the prompts of a `sample` stage: other rows than the RL
stages train on."""


FEW_SHOT_SEED = 30_000
"""Seeds the draw of few-shot examples: the same examples in every run of a task."""


def few_shot_examples(task: TaskSpec, count: int) -> list[tuple[str, str]]:
    """`count` (prompt, correct worked solution) pairs from the task's training distribution
    (its corpus with no flaws, so never a held-out problem), the same for every run."""
    if count <= 0:
        return []
    corpus = task.corpus(FEW_SHOT_SEED, 0.0)
    return [next(corpus) for _ in range(count)]


class TaskError(UserError, ValueError):
    """A task name or task file that cannot be used (unknown task, too few distinct rows)."""


def user_task(name: str, *args: Any, **kwargs: Any) -> TaskSpec:
    """`build_task(name, ...)`, with its refusals (an unknown task, an unusable task file) as
    `TaskError`; a malformed JSONL file is a `JSONLError`, a user error already."""
    try:
        return build_task(name, *args, **kwargs)
    except UserError:
        raise
    except ValueError as exc:
        raise TaskError(str(exc)) from exc
