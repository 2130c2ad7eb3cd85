"""Evaluation on held-out rows: accuracy (greedy or sampled pass@1), a pipeline stage's model
per thinking mode, accuracy against a thinking budget, and the /think vs /no_think check.

`thinking_budget_curve` evaluates held-out rows once per budget with
`rlvr.rollout.thinking.generate_with_thinking_budget`; `think_mode_check` asks a model for each
mode (`/think`, `/no_think`, untagged) and reports accuracy and how often it actually thought:
what Qwen3's thinking-mode fusion is meant to make a switch. Their figure and table are
`rlvr.report.plots.plot_thinking_budget` and `format_table`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlvr.models.tiny import load_model
from rlvr.rollout.engine import HFEngine
from rlvr.rollout.episodes import EpisodeSpec, run_episodes
from rlvr.rollout.sampler import sample_completions
from rlvr.rollout.thinking import STOP_PHRASE, generate_with_thinking_budget
from rlvr.tasks import reasoning
from rlvr.tasks.spec import TaskSpec
from rlvr.verifiers.format import THINK_CLOSE, THINK_OPEN
from rlvr.workers import default_workers

Score = Callable[[str, dict], float]


def held_out_accuracy(*args: Any, **kwargs: Any) -> float:
    """Mean of `score(completion, row)` over `num_samples` completions per row: the arguments
    of `held_out_samples`, and its `accuracy`.

    `temperature == 0` is greedy decoding (then one sample per row is enough); with
    `temperature > 0` the result is pass@1 at that temperature, averaged over the samples. The
    divisor is `len(rows) * num_samples`.
    """
    return held_out_samples(*args, **kwargs).accuracy


@dataclass(frozen=True)
class HeldOutSamples:
    """`num_samples` completions of every held-out row and their scores, row by row."""

    completions: list[list[str]]
    scores: list[list[float]]
    truncated: list[list[bool]]
    """Whether each completion hit `max_new_tokens` without EOS."""

    @property
    def accuracy(self) -> float:
        """The mean score over every completion (divides by rows x samples per row)."""
        return sum(map(sum, self.scores)) / sum(map(len, self.scores))


def held_out_samples(
    model: torch.nn.Module,
    tokenizer,
    rows: list[dict[str, str]],
    score: Score,
    max_new_tokens: int,
    temperature: float = 0.0,
    num_samples: int = 1,
    seed: int = 0,
    batch_size: int = 256,
    workers: int = 0,
) -> HeldOutSamples:
    """`num_samples` completions per row (greedy at `temperature == 0`), each scored by
    `score(completion, row)`: `completions[i][j]` and `scores[i][j]` are row i's j-th.
    Seeded by `seed`; `workers` sampling threads (0: one per torch thread on a CPU,
    `rlvr.workers.default_workers`)."""
    workers = default_workers(model, workers)
    generator = torch.Generator().manual_seed(seed)
    per_call = max(1, batch_size // num_samples)
    completions: list[list[str]] = []
    scores: list[list[float]] = []
    truncated: list[list[bool]] = []
    for start in range(0, len(rows), per_call):
        chunk = rows[start : start + per_call]
        batch = sample_completions(
            model,
            tokenizer,
            [r["prompt"] for r in chunk],
            num_samples=num_samples,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            generator=generator,
            workers=workers,
        )
        for i, row in enumerate(chunk):
            texts = batch.completions[i * num_samples : (i + 1) * num_samples]
            completions.append(texts)
            scores.append([float(score(c, row)) for c in texts])
            cut = batch.truncated[i * num_samples : (i + 1) * num_samples]
            truncated.append([bool(x) for x in cut])
    return HeldOutSamples(completions, scores, truncated)


@dataclass(frozen=True)
class HeldOutEpisodes:
    """`num_samples` episodes of every held-out row, row by row: their returns, turns and
    final replies (`rlvr.rollout.episodes`)."""

    returns: list[list[float]]
    turns: list[list[int]]
    replies: list[list[str]]

    @property
    def success(self) -> float:
        """The share of episodes whose return is above 0 (divides by rows x samples)."""
        flat = [r for row in self.returns for r in row]
        return sum(r > 0 for r in flat) / max(len(flat), 1)

    @property
    def turns_mean(self) -> float:
        """Replies per episode (divides by rows x samples)."""
        flat = [t for row in self.turns for t in row]
        return sum(flat) / max(len(flat), 1)

    @property
    def turns_per_success(self) -> float:
        """Replies per successful episode (divides by the successful episodes; 0 for none)."""
        won = [t for rs, ts in zip(self.returns, self.turns) for r, t in zip(rs, ts) if r > 0]
        return sum(won) / len(won) if won else 0.0


def held_out_episodes(
    model: torch.nn.Module,
    tokenizer,
    rows: list[dict],
    spec: EpisodeSpec,
    temperature: float = 0.0,
    num_samples: int = 1,
    seed: int = 0,
    batch_size: int = 128,
) -> HeldOutEpisodes:
    """`num_samples` episodes per held-out row in its environment (greedy at
    `temperature == 0`), row i on environment seed i (the same episodes in every evaluation);
    sampling seeded by `seed`. An episode's return counts the rewards training counts: the
    environment's and/or the task's `score` on the final reply (`EpisodeSpec`)."""
    engine = HFEngine(model, tokenizer)
    generator = torch.Generator(next(model.parameters()).device).manual_seed(seed)
    per_call = max(1, batch_size // num_samples)
    returns: list[list[float]] = []
    turns: list[list[int]] = []
    replies: list[list[str]] = []
    for start in range(0, len(rows), per_call):
        chunk = rows[start : start + per_call]
        episodes = run_episodes(
            engine,
            spec.renderer,
            spec.factory,
            chunk,
            list(range(start, start + len(chunk))),
            num_samples,
            spec.limits,
            temperature,
            generator,
            tokenizer.decode,
            tokenizer.eos_token_id,
        )
        for i in range(len(chunk)):
            mine = episodes[i * num_samples : (i + 1) * num_samples]
            returns.append([_episode_reward(e, chunk[i], spec) for e in mine])
            turns.append([len(e.replies) for e in mine])
            replies.append([e.final_reply for e in mine])
    return HeldOutEpisodes(returns, turns, replies)


# --- a pipeline stage's model, per thinking mode ------------------------------------------


@torch.no_grad()
def greedy_completions(
    model: torch.nn.Module, tokenizer, rows: list[dict], max_new_tokens: int, batch: int = 256
) -> list[str]:
    """Greedy completions of `rows`' prompts."""
    out: list[str] = []
    for start in range(0, len(rows), batch):
        prompts = [r["prompt"] for r in rows[start : start + batch]]
        out += sample_completions(model, tokenizer, prompts, 1, max_new_tokens, 0.0).completions
    return out


def evaluate_stage_model(
    model_dir: str,
    task: TaskSpec,
    modes: tuple[str, ...],
    seed: int,
    sampled: int = 4,
    device: str | torch.device = "cpu",
) -> dict[str, float]:
    """Per thinking mode, on `task`'s held-out rows: greedy accuracy, sampled pass@1 at T = 1
    (`sampled` completions per problem, seeded by `seed + 1`), readability (share of
    digit-notation steps in the think block, mean over greedy completions), mean greedy
    completion length in tokens (EOS excluded) and, when `no_think` is among the modes, the
    share of completions that obey the mode (`obeys`: a well-formed empty think block for
    /no_think, a non-empty one otherwise). `default` mode carries no suffix, other modes
    `@mode` (e.g. accuracy@no_think). The model is loaded onto `device`."""
    model, tokenizer = load_model(model_dir, device=device)
    result: dict[str, float] = {}
    budget = task.max_new_tokens
    for mode in modes:
        rows = [
            {**r, "prompt": reasoning.set_mode(r["prompt"], mode)} for r in task.held_out_rows()
        ]
        completions = greedy_completions(model, tokenizer, rows, budget)
        suffix = "" if mode == "default" else f"@{mode}"
        result[f"accuracy{suffix}"] = _mean(task.score(c, r) for c, r in zip(completions, rows))
        result[f"sampled{suffix}"] = held_out_accuracy(
            model,
            tokenizer,
            rows,
            task.score,
            budget,
            temperature=1.0,
            num_samples=sampled,
            seed=seed + 1,
        )
        result[f"readability{suffix}"] = _mean(reasoning.readability(c) for c in completions)
        result[f"length{suffix}"] = _mean(
            len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in completions
        )
        if "no_think" in modes:  # obeying the mode only matters when it may not think
            result[f"obeys{suffix}"] = _mean(
                reasoning.follows_mode(r["prompt"], c) for c, r in zip(completions, rows)
            )
    return result


def _mean(values: Iterable[float]) -> float:
    """The mean of `values`, 0 when there are none."""
    values = list(values)
    return sum(values) / len(values) if values else 0.0


# --- thinking budget and thinking modes ---------------------------------------------------


def thinking_budget_curve(
    model: torch.nn.Module,
    tokenizer,
    rows: list[dict[str, Any]],
    score: Score,
    budgets: Sequence[int | None] = (0, 8, 16, 32, None),
    max_answer_tokens: int = 8,
    temperature: float = 0.0,
    num_samples: int = 1,
    seed: int = 0,
    batch_size: int = 256,
    stop_phrase: str = STOP_PHRASE,
) -> list[dict[str, Any]]:
    """One point per budget: {budget, accuracy, thinking_tokens, total_tokens, forced_frac}.

    Means are over `len(rows) * num_samples` completions; every budget samples from its own
    generator seeded by `seed`, so points do not depend on which budgets come before.
    `budget=None` is no budget. The think block is the verifiers' (`THINK_OPEN`/`THINK_CLOSE`).
    """
    per_call = max(1, batch_size // num_samples)
    curve = []
    for budget in budgets:
        generator = torch.Generator().manual_seed(seed)
        correct = thinking = total = forced = 0.0
        for start in range(0, len(rows), per_call):
            chunk = rows[start : start + per_call]
            batch = generate_with_thinking_budget(
                model,
                tokenizer,
                [r["prompt"] for r in chunk],
                budget,
                max_answer_tokens,
                temperature,
                generator,
                num_samples=num_samples,
                stop_phrase=stop_phrase,
                think_open=THINK_OPEN,
                think_close=THINK_CLOSE,
            )
            repeated = [r for r in chunk for _ in range(num_samples)]
            correct += sum(score(c, r) for c, r in zip(batch.completions, repeated, strict=True))
            thinking += sum(batch.thinking_tokens)
            total += sum(batch.total_tokens)
            forced += sum(batch.forced)
        n = len(rows) * num_samples
        curve.append(
            {
                "budget": budget,
                "accuracy": correct / n,
                "thinking_tokens": thinking / n,
                "total_tokens": total / n,
                "forced_frac": forced / n,
            }
        )
    return curve


def think_mode_check(
    model: torch.nn.Module,
    tokenizer,
    rows: list[dict[str, Any]],
    score: Score,
    max_new_tokens: int,
    modes: Sequence[str] = ("think", "no_think"),
    temperature: float = 0.0,
    num_samples: int = 1,
    seed: int = 0,
    batch_size: int = 256,
) -> dict[str, dict[str, float]]:
    """Per mode: {accuracy, thinking_frac (non-empty think block), mean_tokens}.

    Each row's prompt is re-tagged with the mode (`rlvr.tasks.reasoning.set_mode`).
    """
    per_call = max(1, batch_size // num_samples)
    result = {}
    for mode in modes:
        generator = torch.Generator().manual_seed(seed)
        correct = thought = tokens = 0.0
        for start in range(0, len(rows), per_call):
            chunk = rows[start : start + per_call]
            prompts = [reasoning.set_mode(r["prompt"], mode) for r in chunk]
            batch = sample_completions(
                model, tokenizer, prompts, num_samples, max_new_tokens, temperature, generator
            )
            repeated = [r for r in chunk for _ in range(num_samples)]
            correct += sum(score(c, r) for c, r in zip(batch.completions, repeated, strict=True))
            thought += sum(bool(reasoning.split_think(c)[1].strip()) for c in batch.completions)
            tokens += batch.lengths.sum().item()
        n = len(rows) * num_samples
        result[mode] = {
            "accuracy": correct / n,
            "thinking_frac": thought / n,
            "mean_tokens": tokens / n,
        }
    return result


def _episode_reward(episode: Any, row: dict, spec: EpisodeSpec) -> float:
    """The episode's return as training counts it (`EpisodeSpec.env_reward`, `verify`)."""
    total = episode.episode_return(spec.limits.turn_discount) if spec.env_reward else 0.0
    if spec.verify and spec.score is not None:
        total += spec.score(episode.final_reply, row)
    return total
