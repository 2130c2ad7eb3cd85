"""Rejection sampling: sample N completions per prompt, keep those the verifier accepts.

The kept rows (`{"prompt", "completion", "reward", ...row columns}`) are `rlvr sft` input: the
R1 recipe's rejection-sampling SFT stage, or self-distillation of a model's own correct answers.

Each completion goes through these stages in order, and the summary counts where it stopped:

1. `rejected`: reward below `threshold` (the verifier said no; a verifier that raises, or
   returns None or a non-finite value, scores 0; raised and non-finite are `reward_errors`).
2. `truncated`: accepted, but the completion hit `max_new_tokens` without EOS (dropped unless
   `keep_truncated`: SFT appends EOS, which would teach stopping where the model did not stop).
3. `filtered`: the optional `accept(row, completion)` hook said no (e.g. a readability filter).
4. `duplicates`: the same text as a completion already kept for this prompt, after whitespace
   normalisation (runs of whitespace become one space, ends stripped).
5. `capped`: the prompt already has `max_per_prompt` completions kept.
6. `kept`.

So `sampled = rejected + truncated + filtered + duplicates + capped + kept`, and
`acceptance_rate = accepted / sampled` with `accepted = sampled - rejected` (the verifier's rate).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rlvr.models.chat import row_formatter
from rlvr.rollout.sampler import sample_completions
from rlvr.tasks.rewards import reward_columns, total_rewards

Row = dict[str, Any]
STAGES = ("rejected", "truncated", "filtered", "duplicates", "capped", "kept")


@dataclass(frozen=True)
class RejectionConfig:
    """How many completions to sample per prompt and which to keep."""

    num_samples: int = 8
    """Completions sampled per prompt."""
    temperature: float = 1.0
    """Sampling temperature (0: greedy, which makes all N samples the same)."""
    max_new_tokens: int | None = None
    """Completion budget in tokens. None: the task's budget (`rlvr sample`; 512 for a FILE.jsonl);
    `rejection_sample` itself needs a number."""
    threshold: float = 1.0
    """Keep completions whose reward is at least this."""
    max_per_prompt: int | None = None
    """Keep at most this many distinct completions per prompt (None: all)."""
    keep_truncated: bool = False
    """Keep accepted completions that hit max_new_tokens without EOS."""
    prompts_per_call: int = 16
    """Prompts per sampling call (each call decodes prompts_per_call x num_samples rows)."""
    seed: int = 0
    """Seed of the sampling generator."""
    chat_template: bool = True
    """Wrap each prompt as a user turn when the tokenizer has a chat template, as `rlvr sft`
    does with the same flag; the written `prompt` stays the raw one."""
    progress: bool = True
    """Show a progress bar over prompt batches."""


def normalize_whitespace(text: str) -> str:
    """Deduplication key: runs of whitespace as one space, ends stripped."""
    return " ".join(text.split())


def rejection_sample(
    model: torch.nn.Module,
    tokenizer,
    rows: Sequence[Row],
    reward_fn: Callable[..., Sequence[float | None]],
    config: RejectionConfig,
    accept: Callable[[Row, str], bool] | None = None,
) -> tuple[list[Row], dict[str, Any]]:
    """(kept rows, summary) of `config.num_samples` completions for each of `rows`.

    `reward_fn(prompts, completions, **columns)` is TRL's form (the task's strict verifier); the
    columns are every row field other than `prompt`. Kept rows are
    `{"prompt", "completion", "reward", ...other row fields}` in row order, then sample order.
    The summary counts each stage of the module docstring, plus `prompts`, `sampled`,
    `accepted`, `prompts_with_kept`, `acceptance_rate` (accepted / sampled) and
    `reward_errors`.
    """
    if config.num_samples < 1 or config.prompts_per_call < 1:
        raise ValueError("num_samples and prompts_per_call must be >= 1")
    if config.max_new_tokens is None or config.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a number >= 1, got {config.max_new_tokens}")
    if config.max_per_prompt is not None and config.max_per_prompt < 1:
        raise ValueError("max_per_prompt must be >= 1 (or None for no cap)")
    generator = torch.Generator().manual_seed(config.seed)
    counts = dict.fromkeys(STAGES, 0)
    kept: list[Row] = []
    prompts_with_kept = errors = 0
    fmt = row_formatter(tokenizer, config.chat_template)  # chat messages keep their roles
    starts = range(0, len(rows), config.prompts_per_call)
    bar = tqdm(starts, desc="sample", unit="batch", disable=not config.progress, leave=False)
    for start in bar:
        chunk = list(rows[start : start + config.prompts_per_call])
        batch = sample_completions(
            model,
            tokenizer,
            [fmt(r) for r in chunk],
            num_samples=config.num_samples,
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            generator=generator,
        )
        repeated = [r for r in chunk for _ in range(config.num_samples)]  # group-major, as batch
        columns = reward_columns(repeated)
        rewards, metrics = total_rewards(
            [reward_fn], [1.0], [r["prompt"] for r in repeated], batch.completions, columns
        )
        errors += int(metrics["reward/errors"])
        for i, row in enumerate(chunk):
            group = range(i * config.num_samples, (i + 1) * config.num_samples)
            seen: set[str] = set()
            for j in group:
                completion, reward = batch.completions[j], float(rewards[j])
                truncated = bool(batch.truncated[j])
                stage = _stage(row, completion, reward, truncated, seen, config, accept)
                counts[stage] += 1
                if stage == "kept":
                    seen.add(normalize_whitespace(completion))
                    kept.append(
                        {
                            "prompt": row["prompt"],
                            "completion": completion,
                            "reward": reward,
                            **_columns_of(row),
                        }
                    )
            prompts_with_kept += bool(seen)
        bar.set_postfix(kept=counts["kept"])
    return kept, _summary(counts, len(rows), prompts_with_kept, errors)


def _stage(
    row: Row,
    completion: str,
    reward: float,
    truncated: bool,
    seen: set[str],
    config: RejectionConfig,
    accept: Callable[[Row, str], bool] | None,
) -> str:
    """Where one completion stops (module docstring, in order)."""
    if reward < config.threshold:
        return "rejected"
    if truncated and not config.keep_truncated:
        return "truncated"
    if accept is not None and not accept(row, completion):
        return "filtered"
    if normalize_whitespace(completion) in seen:
        return "duplicates"
    if config.max_per_prompt is not None and len(seen) >= config.max_per_prompt:
        return "capped"
    return "kept"


def _columns_of(row: Row) -> Row:
    """The row's fields other than those a kept line sets itself."""
    return {k: v for k, v in row.items() if k not in ("prompt", "completion", "reward")}


def _summary(
    counts: dict[str, int], prompts: int, prompts_with_kept: int, errors: int
) -> dict[str, Any]:
    """The summary of `rejection_sample` from its stage counts."""
    sampled = sum(counts.values())
    accepted = sampled - counts["rejected"]
    return {
        "prompts": prompts,
        "sampled": sampled,
        "accepted": accepted,
        **counts,
        "prompts_with_kept": prompts_with_kept,
        "acceptance_rate": accepted / sampled if sampled else 0.0,
        "reward_errors": errors,
    }


def write_jsonl(rows: Sequence[Row], path: str | Path) -> Path:
    """Write `rows` as JSONL (one object a line), via a temporary file renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    tmp.replace(path)
    return path
