"""Accuracy against thinking budget, and the /think vs /no_think check of a fused model.

`thinking_budget_curve` evaluates held-out rows once per budget with
`rlvr.rollout.thinking.generate_with_thinking_budget`; `plot_thinking_budget` draws accuracy and
tokens against budget; `format_table` prints the curve. `think_mode_check` asks a model for each
mode (`/think`, `/no_think`, untagged) and reports accuracy and how often it actually thought:
what Qwen3's thinking-mode fusion is meant to make a switch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from rlvr.report.plots import save_figure  # noqa: E402
from rlvr.rollout.sampler import sample_completions  # noqa: E402
from rlvr.rollout.thinking import STOP_PHRASE, generate_with_thinking_budget  # noqa: E402
from rlvr.tasks.reasoning import set_mode, split_think  # noqa: E402

Score = Callable[[str, dict], float]


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
    `budget=None` is no budget.
    """
    per_call = max(1, batch_size // num_samples)
    curve = []
    for budget in budgets:
        generator = torch.Generator().manual_seed(seed)
        correct = thinking = total = forced = 0.0
        for start in range(0, len(rows), per_call):
            chunk = rows[start : start + per_call]
            batch = generate_with_thinking_budget(
                model, tokenizer, [r["prompt"] for r in chunk], budget, max_answer_tokens,
                temperature, generator, num_samples=num_samples, stop_phrase=stop_phrase,
            )  # fmt: skip
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


def format_table(curve: list[dict[str, Any]]) -> str:
    """The curve as a Markdown table."""
    lines = [
        "| budget | accuracy | thinking tokens | total tokens | forced |",
        "| --- | --- | --- | --- | --- |",
    ]
    for p in curve:
        budget = "none" if p["budget"] is None else str(p["budget"])
        lines.append(
            f"| {budget} | {p['accuracy']:.3f} | {p['thinking_tokens']:.1f} | "
            f"{p['total_tokens']:.1f} | {p['forced_frac']:.2f} |"
        )
    return "\n".join(lines)


def plot_thinking_budget(curve: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Accuracy (left) and mean tokens (right) against budget, as a PNG. Budgets are evenly
    spaced categories, `none` (no budget) last."""
    labels = ["none" if p["budget"] is None else str(p["budget"]) for p in curve]
    x = list(range(len(curve)))
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8), dpi=120)
    left.plot(x, [p["accuracy"] for p in curve], marker="o", lw=2, color="#0f766e")
    left.set_ylabel("held-out accuracy")
    left.set_ylim(-0.02, 1.02)
    right.plot(x, [p["thinking_tokens"] for p in curve], marker="o", lw=2, color="#d97706",
               label="thinking tokens")  # fmt: skip
    right.plot(x, [p["total_tokens"] for p in curve], marker="s", lw=2, color="#6b7280",
               label="total tokens")  # fmt: skip
    right.set_ylabel("mean tokens per completion")
    right.legend(loc="upper left", fontsize=8)
    for ax in (left, right):
        ax.set_xticks(x, labels)
        ax.set_xlabel("thinking budget (tokens)")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


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
            batch = sample_completions(
                model, tokenizer, [set_mode(r["prompt"], mode) for r in chunk], num_samples,
                max_new_tokens, temperature, generator,
            )  # fmt: skip
            repeated = [r for r in chunk for _ in range(num_samples)]
            correct += sum(score(c, r) for c, r in zip(batch.completions, repeated, strict=True))
            thought += sum(bool(split_think(c)[1].strip()) for c in batch.completions)
            tokens += batch.lengths.sum().item()
        n = len(rows) * num_samples
        result[mode] = {
            "accuracy": correct / n,
            "thinking_frac": thought / n,
            "mean_tokens": tokens / n,
        }
    return result
