"""`rlvr sample`: rejection sampling from a model on a task's (or a file's) prompts; writes the
verified completions as JSONL that `rlvr sft --data` reads as it is.

The sampling and its stages are `rlvr.train.rejection`; this module picks the prompts and the
verifier (a named task's training rows and strict verifier, or a FILE.jsonl graded by
`--verifier`), loads the model and writes the file.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

import torch
import tyro

from rlvr.config import ConfigError, RunExistsError, RunPlace, flat_layout_moves
from rlvr.devices import on_device, resolve_precision
from rlvr.models.tiny import load_model
from rlvr.pipelines.common import model_flag, user_task
from rlvr.tasks.dataset_files import is_rlvr_jsonl
from rlvr.tasks.jsonl import load_rows
from rlvr.tasks.registry import TaskChoice
from rlvr.train.rejection import RejectionConfig, rejection_sample, write_jsonl
from rlvr.verifiers.adapters import VERIFIERS, trl_reward
from rlvr.verifiers.files import REFERENCE_FIELD

FILE_BUDGET = 512  # completion tokens for a FILE.jsonl's prompts, which state no budget


@dataclass(frozen=True)
class SamplePlace(RunPlace):
    """`RunPlace` for `rlvr sample`: its seed and progress bars are the sampling's (`--seed`,
    `--progress` set `sampling`), so these two are hidden and unused."""

    seed: Annotated[int, tyro.conf.Suppress] = 0
    """Unused: the sampling seed is `sampling.seed` (--seed)."""
    progress: Annotated[bool, tyro.conf.Suppress] = True
    """Unused: the progress bar is `sampling.progress` (--progress)."""


@dataclass(frozen=True)
class SampleConfig:
    """`rlvr sample`: rejection sampling; writes the verified completions as `rlvr sft` input."""

    model: str
    """A local Hugging Face model directory."""
    output: str
    """The JSONL file to write: {"prompt", "completion", "reward", ...row columns} per line."""
    task: Annotated[TaskChoice, tyro.conf.arg(name="")] = field(default_factory=TaskChoice)
    """Prompts and verifier (flags without a prefix): a named task (its training rows and
    strict verifier), a FILE.jsonl of rows with "prompt" and the verifier's column ("answer"),
    or any dataset file `rlvr train --task` reads (its layout's verifier)."""
    num_prompts: int | None = 256
    """Prompts to sample for: the first N training rows of a task, or of FILE.jsonl (None: all
    of the file's rows)."""
    verifier: str = "math"
    """For a FILE.jsonl: math, tool, format or weak_math (a named task uses its own)."""
    place: Annotated[SamplePlace, tyro.conf.arg(name="")] = field(default_factory=SamplePlace)
    """Device, precision, CPU threads and --overwrite (of the output file), without a prefix."""
    sampling: Annotated[RejectionConfig, tyro.conf.OmitArgPrefixes] = field(
        default_factory=RejectionConfig
    )

    MOVED_KEYS: ClassVar[dict[str, str]] = flat_layout_moves(
        ("device", "dtype", "threads", "overwrite"), ("columns", "arithmetic")
    )
    """Keys of the flat layout and where they live now (`from_dict` moves them)."""


def run_sample(config: SampleConfig) -> dict[str, Any]:
    """Sample, keep the verified completions, write them to `config.output`; returns the
    rejection summary with the output path first."""
    place = config.place
    if Path(config.output).exists() and not place.overwrite:
        raise RunExistsError(f"{config.output} exists; pass --overwrite to replace it")
    if config.num_prompts is not None and config.num_prompts < 1:
        raise ConfigError(f"--num-prompts must be >= 1 (or none: all), got {config.num_prompts}")
    if place.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {place.threads}")
    precision = resolve_precision(place.device, place.dtype)
    rows, reward_fn, budget = prompts_and_verifier(config)
    model_flag(config.model)
    sampling = config.sampling
    if sampling.max_new_tokens is None:
        sampling = dataclasses.replace(sampling, max_new_tokens=budget)
    if precision.is_cpu:
        torch.set_num_threads(place.threads)
    model, tokenizer = load_model(config.model, device=precision.device)
    with on_device(precision):
        kept, summary = rejection_sample(model, tokenizer, rows, reward_fn, sampling)
    write_jsonl(kept, config.output)
    return {"output": config.output, **summary}


def prompts_and_verifier(
    config: SampleConfig,
) -> tuple[list[dict[str, Any]], Callable[..., Sequence[float | None]], int]:
    """(rows to sample for, reward function, completion budget) of `config.task`: the first
    `num_prompts` rows of a FILE.jsonl with `--verifier`'s reward, or of a named task's
    training stream (seeded by the sampling seed) with the task's strict verifier."""
    name = config.task.name
    if name.endswith(".jsonl") and config.task.columns is None and is_rlvr_jsonl(Path(name)):
        if config.verifier not in VERIFIERS:
            raise ConfigError(
                f"--verifier {config.verifier!r}: a FILE.jsonl is graded by one of "
                f"{', '.join(VERIFIERS)}"
            )
        reward_fn = trl_reward(config.verifier)
        column = REFERENCE_FIELD.get(config.verifier)
        rows = load_rows(name, ("prompt", column) if column else ("prompt",))
        return rows[: config.num_prompts], reward_fn, FILE_BUDGET
    task = user_task(config.task)
    rows = list(itertools.islice(task.train_rows(config.sampling.seed), config.num_prompts))
    return rows, task.reward_fn, task.max_new_tokens
