"""The task registry: a `TaskChoice` (a task name, a dataset file or reasoning_gym:NAME, with
the generators' options) to its `TaskSpec`, and `--verifier` to the training reward.

Every entry point that takes `--task` (lab/train, sample, eval, sft, dpo) nests one
`TaskChoice` (sft a subclass, no task by default) and builds its task here, so a new
configurable task edits one dataclass and one entry of `NAMED_TASKS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Literal

import tyro

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


@dataclass(frozen=True)
class EnvChoice:
    """The environment of a multi-turn task (`--env NAME`, `--env.max-turns`, ...). Budgets at
    0 take the environment's own."""

    name: Annotated[str | None, tyro.conf.arg(name="env", prefix_name=False)] = None
    """A multi-turn environment: tool_chain, guess_number, retry_arith, or your own as
    FILE.py:NAME or package.module:NAME (an rlvr environment class or factory, a `tool_env`,
    or a TRL-style environment class: `reset(self, **row)`, its public methods the tools,
    `get_reward(self)`); its rows come from --task FILE when one is given, else from the
    environment. None: one-turn rollouts."""
    max_turns: int = 0
    """Replies an episode may have at most (0: the environment's)."""
    max_tokens: int = 0
    """Tokens after the opening prompt across all turns, sampled and environment tokens alike
    (0: the environment's); a reply or environment message that would overflow is cut and the
    episode ends truncated."""
    step_timeout_s: float = 10.0
    """Seconds one reset/step call of the environment (its tool calls included) may take; past
    it the episode ends with status timeout."""
    episode_timeout_s: float = 120.0
    """Seconds all of one episode's environment calls may take."""
    turn_discount: float = 1.0
    """Turn k's reward counts turn_discount**k in the episode's return."""
    reward: Literal["env", "verifier", "both"] = "env"
    """The episode's reward: the environment's return, the task's verifier on the final reply,
    or both summed."""


@dataclass(frozen=True)
class TaskChoice:
    """The task an entry point trains, samples or evaluates on, with the generators' options.
    Nested without a prefix (`--task`, `--columns`, `--arithmetic.digits`, ...)."""

    name: Annotated[str, tyro.conf.arg(name="task")] = "arithmetic"
    """The task: arithmetic (math verifier), reasoning (addition with a <think> block and
    mixed notations, the pipelines' task), code (sandboxed asserts), tool (tool calls),
    reasoning_gym:NAME[?key=value&...][+NAME...] (a reasoning-gym generator, graded by rlvr's
    verifiers; `pip install 'rlvr[gym]'`), or a dataset file of your own rows: .jsonl, .json,
    .parquet or a `datasets` directory in rlvr's (prompt, answer[, solution]), TRL's (prompt,
    solution) or verl's (data_source, prompt messages, reward_model.ground_truth) layout
    (`pip install 'rlvr[data]'` for parquet and directories)."""
    columns: str | None = None
    """A dataset file's columns as rlvr's fields, instead of detecting the layout: e.g.
    prompt=question,answer=reward_model.ground_truth (dotted paths reach nested fields)."""
    arithmetic: ArithmeticTaskConfig = field(default_factory=ArithmeticTaskConfig)
    """The arithmetic task's problems (ignored by the other tasks)."""
    reasoning: ReasoningTaskConfig = field(default_factory=ReasoningTaskConfig)
    """The reasoning task's problems (ignored by the other tasks)."""

    def generator_config(self) -> object | None:
        """The options that shape this task's rows: the arithmetic or reasoning config, a
        dataset file's column mapping (None: detected), None for the other named tasks."""
        named = {"arithmetic": self.arithmetic, "reasoning": self.reasoning}
        return named.get(self.name, self.columns)  # columns: None for code and tool (refused)


NAMED_TASKS: dict[str, Callable[[TaskChoice, float], TaskSpec]] = {
    "arithmetic": lambda c, hedge_prob: arithmetic_task.task_spec(c.arithmetic, hedge_prob),
    "reasoning": lambda c, hedge_prob: reasoning_task.task_spec(c.reasoning),
    "code": lambda c, hedge_prob: code_task.task_spec(),
    "tool": lambda c, hedge_prob: tool_task.task_spec(),
}
"""Each named task's builder: (the choice, the arithmetic corpus's hedge probability) -> spec."""


def task_spec(choice: TaskChoice, *, hedge_prob: float = 0.0, seed: int = 0) -> TaskSpec:
    """The TaskSpec of `choice.name`: a named task (`NAMED_TASKS`), reasoning_gym:NAME, or a
    dataset file (.jsonl, .json, .parquet, or a directory saved by `datasets`).

    `hedge_prob` is the arithmetic corpus's chance of a hedged answer; `seed` is the held-out
    split of a file (and reasoning-gym's draw); `choice.columns` (`--columns
    prompt=COL,answer=COL`) maps a file's columns, and is refused for any other task.
    """
    name, columns = choice.name, choice.columns
    if columns is not None and (name in TASKS or not dataset_files.is_data_file(name)):
        message = f"--columns {columns!r} maps a dataset file's columns; {name!r} is not one"
        raise ValueError(message)
    if name in NAMED_TASKS:
        return NAMED_TASKS[name](choice, hedge_prob)
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


ENVIRONMENTS = {
    "tool_chain": "rlvr.tasks.tool_chain",
    "guess_number": "rlvr.tasks.guess_number",
    "retry_arith": "rlvr.tasks.retry_arith",
}
"""The built-in multi-turn environments: name -> the module whose `task_spec()` builds it."""


def env_task_spec(env: EnvChoice, task: TaskChoice, *, seed: int = 0) -> TaskSpec:
    """The TaskSpec of `--env NAME`: a built-in environment's (its rows, held-out split and
    corpus), or a user's FILE.py:NAME / package.module:NAME environment on the rows of
    `--task FILE` (when `task` names a dataset file) or of the environment itself."""
    assert env.name is not None
    if env.name in ENVIRONMENTS:
        if task.name != "arithmetic" and dataset_files.is_data_file(task.name):
            raise ValueError(
                f"--env {env.name} brings its own rows; drop --task {task.name} "
                "(a task file's rows go with an environment of your own, --env FILE.py:NAME)"
            )
        return importlib.import_module(ENVIRONMENTS[env.name]).task_spec()
    if ":" not in env.name:
        raise ValueError(
            f"unknown environment {env.name!r}; choose {', '.join(ENVIRONMENTS)}, or your own "
            "as FILE.py:NAME or package.module:NAME"
        )
    from rlvr.tasks import env_files

    rows = task_spec(task, seed=seed) if dataset_files.is_data_file(task.name) else None
    return env_files.user_env_task(env.name, rows)
