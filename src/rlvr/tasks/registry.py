"""The task registry: a task name (or a dataset file, or reasoning_gym:NAME) to its `TaskSpec`,
and `--verifier` to the training reward.

Every entry point that takes `--task` (lab/train, sft, sample, eval) builds its task here from
flat arguments, so none of them needs another's config class.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rlvr.tasks import arithmetic as arithmetic_task
from rlvr.tasks import code_task, dataset_files, tool_task
from rlvr.tasks import reasoning as reasoning_task
from rlvr.tasks.arithmetic import ArithmeticTaskConfig
from rlvr.tasks.reasoning import ReasoningTaskConfig
from rlvr.tasks.spec import TaskSpec
from rlvr.verifiers.weak import weak_math_reward

TASKS = ("arithmetic", "reasoning", "code", "tool")
"""The named tasks. Besides them: a dataset file (`dataset_files.FILE_SUFFIXES` or a saved
dataset directory) and reasoning_gym:NAME."""
FILE_KINDS = "a FILE.jsonl/.json/.parquet, a directory saved by datasets"


def build_task(
    name: str,
    arithmetic: ArithmeticTaskConfig | None = None,
    reasoning: ReasoningTaskConfig | None = None,
    *,
    hedge_prob: float = 0.0,
    seed: int = 0,
    columns: str | None = None,
) -> TaskSpec:
    """The TaskSpec of task `name`: arithmetic, reasoning, code, tool, reasoning_gym:NAME, or a
    dataset file (.jsonl, .json, .parquet, or a directory saved by `datasets`).

    `arithmetic` / `reasoning` shape those two tasks (None: their defaults) and
    are ignored by the others; `hedge_prob` is the arithmetic corpus's chance of a hedged answer;
    `seed` is the held-out split of a file (and reasoning-gym's draw); `columns` (`--columns
    prompt=COL,answer=COL`) maps a file's columns, and is refused for any other task.
    """
    if columns is not None and (name in TASKS or not dataset_files.is_data_file(name)):
        message = f"--columns {columns!r} maps a dataset file's columns; {name!r} is not one"
        raise ValueError(message)
    if name == "arithmetic":
        return arithmetic_task.task_spec(arithmetic or ArithmeticTaskConfig(), hedge_prob)
    if name == "reasoning":
        return reasoning_task.task_spec(reasoning or ReasoningTaskConfig())
    if name == "code":
        return code_task.task_spec()
    if name == "tool":
        return tool_task.task_spec()
    if name.startswith("reasoning_gym:"):
        from rlvr.tasks import reasoning_gym

        return reasoning_gym.task_spec(name.removeprefix("reasoning_gym:"), seed=seed)
    if dataset_files.is_data_file(name):
        return dataset_files.task_spec(name, seed=seed, columns=columns)
    raise ValueError(
        f"unknown task {name!r}; choose {', '.join(TASKS)}, {FILE_KINDS} or reasoning_gym:NAME"
    )


def training_reward(name: str, task: TaskSpec) -> Callable[..., Sequence[float | None]]:
    """The training reward function of `--verifier NAME` for `task`: strict (the task's own
    verifier) or, on arithmetic only, weak (substring match, gameable)."""
    if name == "strict":
        return task.reward_fn
    if name == "weak" and task.name == "arithmetic":
        return weak_math_reward
    raise ValueError(f"unknown verifier {name!r} for task {task.name}; choose strict or weak")
