"""The task registry: a task name (or a FILE.jsonl) to its `TaskSpec`, and `--verifier` to the
training reward.

Every entry point that takes `--task` (lab/train, sft, sample, eval) builds its task here from
flat arguments, so none of them needs another's config class.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rlvr.tasks import arithmetic as arithmetic_task
from rlvr.tasks import code_task, jsonl, tool_task
from rlvr.tasks import reasoning as reasoning_task
from rlvr.tasks.arithmetic import ArithmeticTaskConfig
from rlvr.tasks.reasoning import ReasoningTaskConfig
from rlvr.tasks.spec import TaskSpec
from rlvr.verifiers.weak import weak_math_reward

TASKS = ("arithmetic", "reasoning", "code", "tool")
"""The named tasks; any name ending in .jsonl is a file of the user's own rows."""


def build_task(
    name: str,
    arithmetic: ArithmeticTaskConfig | None = None,
    reasoning: ReasoningTaskConfig | None = None,
    *,
    hedge_prob: float = 0.0,
    seed: int = 0,
) -> TaskSpec:
    """The TaskSpec of task `name`: arithmetic, reasoning, code, tool or a FILE.jsonl.

    `arithmetic` / `reasoning` shape those two tasks (None: their defaults) and
    are ignored by the others; `hedge_prob` is the arithmetic corpus's chance of a hedged answer;
    `seed` is the held-out split of a FILE.jsonl.
    """
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
    if name.endswith(".jsonl"):
        return jsonl.task_spec(name, seed=seed)
    raise ValueError(
        f"unknown task {name!r}; choose {', '.join(TASKS)}, a FILE.jsonl or reasoning_gym:NAME"
    )


def training_reward(name: str, task: TaskSpec) -> Callable[..., Sequence[float | None]]:
    """The training reward function of `--verifier NAME` for `task`: strict (the task's own
    verifier) or, on arithmetic only, weak (substring match, gameable)."""
    if name == "strict":
        return task.reward_fn
    if name == "weak" and task.name == "arithmetic":
        return weak_math_reward
    raise ValueError(f"unknown verifier {name!r} for task {task.name}; choose strict or weak")
