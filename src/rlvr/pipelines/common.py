"""What every pipeline entry point shares: the user-input boundary, the seed offsets, and the
state the stages of one pipeline share (`PipelineContext`, which every stage function takes).

Errors a user can fix by changing a flag or a file leave here as `rlvr.config.UserError`
(the CLI prints them on one line and exits 2): an unknown task or an unusable task file. (A
run directory's refusals are user errors where `RunDirectory` raises them.)
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlvr.config import ConfigError, UserError, to_dict
from rlvr.devices import Precision, resolve_precision
from rlvr.models.lora import LoRAConfig, apply_lora, merged
from rlvr.models.tiny import ModelDirectoryError, TinyModelConfig, check_model_dir, save_model
from rlvr.report.run_dir import RunDirectory
from rlvr.report.run_log import RunLog
from rlvr.rollout.episodes import EpisodeLimits, EpisodeSpec, turn_renderer
from rlvr.tasks.reasoning import ReasoningTaskConfig
from rlvr.tasks.registry import EnvChoice, TaskChoice, env_task_spec, task_spec
from rlvr.tasks.spec import TaskSpec
from rlvr.train.distributed import DistContext, main_first

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


def user_task(task: TaskChoice, *, hedge_prob: float = 0.0, seed: int = 0) -> TaskSpec:
    """The TaskSpec of `task` (`registry.task_spec`), with the registry's refusals (an unknown
    task, an unusable task file) as `TaskError`; a malformed JSONL file is a `JSONLError`, a
    user error already."""
    try:
        return task_spec(task, hedge_prob=hedge_prob, seed=seed)
    except UserError:
        raise
    except ValueError as exc:
        raise TaskError(str(exc)) from exc


def env_task(env: EnvChoice, task: TaskChoice, *, seed: int = 0) -> TaskSpec:
    """The TaskSpec of `--env` (`registry.env_task_spec`), its refusals as `TaskError`."""
    try:
        return env_task_spec(env, task, seed=seed)
    except UserError:
        raise
    except ValueError as exc:
        raise TaskError(str(exc)) from exc


def episode_limits(task: TaskSpec, env: EnvChoice, max_reply_tokens: int | None) -> EpisodeLimits:
    """The budgets of `task`'s episodes: `--env.*` where set (non-zero), else the task's own;
    one reply's budget is `--grpo.max-new-tokens` (default the task's)."""
    for flag, value in (
        ("--env.max-turns", env.max_turns),
        ("--env.max-tokens", env.max_tokens),
        ("--env.step-timeout-s", env.step_timeout_s),
        ("--env.episode-timeout-s", env.episode_timeout_s),
    ):
        if value < 0:
            raise ConfigError(f"{flag} must be >= 0, got {value}")
    if not 0.0 <= env.turn_discount <= 1.0:
        raise ConfigError(f"--env.turn-discount must be in [0, 1], got {env.turn_discount}")
    return EpisodeLimits(
        max_turns=env.max_turns or task.max_turns,
        max_tokens=env.max_tokens or task.episode_tokens,
        max_reply_tokens=max_reply_tokens or task.max_new_tokens,
        step_timeout_s=env.step_timeout_s,
        episode_timeout_s=env.episode_timeout_s,
        turn_discount=env.turn_discount,
    )


def episode_spec(
    task: TaskSpec, env: EnvChoice, tokenizer: Any, chat_template: bool, max_reply_tokens: int
) -> EpisodeSpec | None:
    """What the rollouts and the held-out evaluation of a multi-turn task run with (None for a
    one-turn task): its environment, budgets, this tokenizer's turn renderer (its chat
    template's, checked to preserve prefixes, when `chat_template` is on and it has one) and
    whether the verifier grades the final reply (`--env.reward verifier|both`)."""
    if task.environment is None:
        return None
    return EpisodeSpec(
        factory=task.environment,
        limits=episode_limits(task, env, max_reply_tokens),
        renderer=turn_renderer(tokenizer, chat_template),
        verify=env.reward != "env",
        env_reward=env.reward != "verifier",
        score=task.score,
    )


def field_at(config: Any, path: str) -> Any:
    """The value at the dotted field path `path` of the dataclass `config` (`place.seed`)."""
    for part in path.split("."):
        config = getattr(config, part)
    return config


def model_flag(directory: str | Path, flag: str = "--model", hint: str = "") -> Path:
    """`directory` if it holds a model (`check_model_dir`: files only, nothing loaded), else
    a `ConfigError` naming `flag` and what is missing, then `hint` (e.g. another choice)."""
    try:
        return check_model_dir(directory)
    except ModelDirectoryError as exc:
        raise ConfigError(f"{flag}: {exc}{hint}") from None


def with_lora(model: torch.nn.Module, lora: LoRAConfig, seed: int) -> torch.nn.Module:
    """`model` with LoRA adapters when `lora.rank > 0` (seeded), else as it is. A target layer
    the model lacks, or peft missing, is a one-line `ConfigError` naming the flag."""
    if not lora.enabled:
        return model
    try:
        return apply_lora(model, lora, seed=seed)
    except (ValueError, ImportError) as exc:
        raise ConfigError(f"--lora.rank {lora.rank}: {exc}") from None


def save_policy(
    model: torch.nn.Module, tokenizer: Any, directory: str | Path, lora: LoRAConfig
) -> Path:
    """Save the trained policy: with LoRA, its adapters merged into an ordinary Hugging Face
    directory, or the peft adapter directory alone with `lora.save_adapter_only`."""
    if lora.enabled and not lora.save_adapter_only:
        model = merged(model)
    return save_model(model, tokenizer, directory)


@dataclass
class PipelineContext:
    """What every stage of one pipeline shares."""

    task_config: ReasoningTaskConfig
    task: TaskSpec
    tiny: TinyModelConfig
    seed: int
    log: RunLog = field(default_factory=RunLog)  # the stages' [rlvr] lines and progress bars
    precision: Precision = field(default_factory=lambda: resolve_precision("cpu", "float32"))
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)  # stage -> its files
    seconds: dict[str, float] = field(default_factory=dict)  # stage -> wall seconds
    last_model: str | None = None  # the most recent stage's model directory
    report_to: tuple[str, ...] = ()  # trackers of every GRPO stage (`parse_report_to`)

    def model_of(self, stage: str | None) -> str:
        """The model directory of `stage` (None: the latest model-producing stage)."""
        if stage is None:
            if self.last_model is None:
                raise ConfigError("no earlier stage produced a model: start with a `base` stage")
            return self.last_model
        if "model" not in self.outputs.get(stage, {}):
            raise ConfigError(f"stage {stage!r} did not run earlier or produced no model")
        return self.outputs[stage]["model"]


def start_run_files(
    run: RunDirectory, config: Any, *, resume: bool, stale: tuple[Path, ...]
) -> None:
    """Write `config` as the run's config.yaml as a fresh run of it would be given (no
    `resume`, no `place.overwrite`: a resume of it then continues it as it is); a run that is
    not resumed first removes the `stale` files an overwritten run left (its checkpoints,
    DPO's pools.jsonl)."""
    written = dataclasses.replace(
        config, resume=None, place=dataclasses.replace(config.place, overwrite=False)
    )
    run.write_config(to_dict(written))
    for path in () if resume else stale:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def open_run_directory(
    parent: str | Path, name: str, *, overwrite: bool, resume: bool, ctx: DistContext
) -> RunDirectory:
    """The run directory `parent/name`, made (replaced with `overwrite`, reopened to `resume`) and
    claimed by rank 0 first, one live run per directory; the other ranks then open what rank 0
    made, as a resume, without claiming it (`main_first`)."""
    with main_first(ctx, "the run directory"):
        return RunDirectory(
            parent,
            name,
            overwrite=overwrite and ctx.is_main,
            resume=resume or not ctx.is_main,
            claim=ctx.is_main,  # one live run per directory
        )
