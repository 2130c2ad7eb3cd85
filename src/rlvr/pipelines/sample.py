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
from typing import Annotated, Any

import torch
import tyro

from rlvr.config import ConfigError, RunExistsError
from rlvr.devices import on_device, resolve_precision
from rlvr.models.tiny import load_model
from rlvr.pipelines.common import model_flag, user_task
from rlvr.tasks.arithmetic import ArithmeticTaskConfig
from rlvr.tasks.dataset_files import is_rlvr_jsonl
from rlvr.tasks.jsonl import load_rows
from rlvr.train.rejection import RejectionConfig, rejection_sample, write_jsonl
from rlvr.verifiers.adapters import VERIFIERS, trl_reward
from rlvr.verifiers.files import REFERENCE_FIELD

FILE_BUDGET = 512  # completion tokens for a FILE.jsonl's prompts, which state no budget


@dataclass(frozen=True)
class SampleConfig:
    """`rlvr sample`: rejection sampling; writes the verified completions as `rlvr sft` input."""

    model: str
    """A local Hugging Face model directory."""
    output: str
    """The JSONL file to write: {"prompt", "completion", "reward", ...row columns} per line."""
    task: str = "arithmetic"
    """Prompts and verifier: arithmetic, code or tool (training rows, the task's strict
    verifier), a FILE.jsonl of rows with "prompt" and the verifier's column ("answer"), or
    any dataset file `rlvr train --task` reads (its layout's verifier)."""
    columns: str | None = None
    """A dataset file's columns as rlvr's fields (as `rlvr train --columns`)."""
    num_prompts: int | None = 256
    """Prompts to sample for: the first N training rows of a task, or of FILE.jsonl (None: all
    of the file's rows)."""
    verifier: str = "math"
    """For a FILE.jsonl: math, tool, format or weak_math (a named task uses its own)."""
    overwrite: bool = False
    """Replace an existing output file."""
    device: str = "auto"
    """Where the model runs: auto (CUDA when present, else the CPU), cpu, cuda or cuda:N."""
    dtype: str = "auto"
    """Compute precision: auto (bfloat16 autocast on CUDA, float32 on the CPU), float32 or
    bfloat16."""
    threads: int = 2
    """CPU threads (torch.set_num_threads; the CPU only)."""
    arithmetic: ArithmeticTaskConfig = field(default_factory=ArithmeticTaskConfig)
    sampling: Annotated[RejectionConfig, tyro.conf.OmitArgPrefixes] = field(
        default_factory=RejectionConfig
    )


def run_sample(config: SampleConfig) -> dict[str, Any]:
    """Sample, keep the verified completions, write them to `config.output`; returns the
    rejection summary with the output path first."""
    if Path(config.output).exists() and not config.overwrite:
        raise RunExistsError(f"{config.output} exists; pass --overwrite to replace it")
    if config.num_prompts is not None and config.num_prompts < 1:
        raise ConfigError(f"--num-prompts must be >= 1 (or none: all), got {config.num_prompts}")
    if config.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {config.threads}")
    precision = resolve_precision(config.device, config.dtype)
    rows, reward_fn, budget = prompts_and_verifier(config)
    model_flag(config.model)
    sampling = config.sampling
    if sampling.max_new_tokens is None:
        sampling = dataclasses.replace(sampling, max_new_tokens=budget)
    if precision.is_cpu:
        torch.set_num_threads(config.threads)
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
    if (
        config.task.endswith(".jsonl")
        and config.columns is None
        and is_rlvr_jsonl(Path(config.task))
    ):
        if config.verifier not in VERIFIERS:
            raise ConfigError(
                f"--verifier {config.verifier!r}: a FILE.jsonl is graded by one of "
                f"{', '.join(VERIFIERS)}"
            )
        reward_fn = trl_reward(config.verifier)
        column = REFERENCE_FIELD.get(config.verifier)
        rows = load_rows(config.task, ("prompt", column) if column else ("prompt",))
        return rows[: config.num_prompts], reward_fn, FILE_BUDGET
    task = user_task(config.task, config.arithmetic, columns=config.columns)
    rows = list(itertools.islice(task.train_rows(config.sampling.seed), config.num_prompts))
    return rows, task.reward_fn, task.max_new_tokens
