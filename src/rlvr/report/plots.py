"""Figures (and the tables beside them) of a run: reward curves, the SFT loss curve, the
reward-hacking comparison, a pipeline's stages and the thinking-budget curve."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402

from rlvr.report.run_dir import read_jsonl  # noqa: E402


def save_figure(fig, path: str | Path) -> Path:
    """Lay out `fig`, write it to `path` (the format from the suffix) and free it."""
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_reward_curve(metrics: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Train reward and held-out accuracy (greedy and sampled) against step, as a PNG."""
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    train = [m for m in metrics if "reward/mean" in m]
    if train:
        ax.plot(
            [m["step"] for m in train],
            [m["reward/mean"] for m in train],
            color="#9ca3af",
            lw=1,
            label="train reward (sampled, T=1)",
        )
    for key, label, color in (
        ("eval/greedy_acc", "held-out accuracy, greedy", "#0f766e"),
        ("eval/sampled_acc", "held-out accuracy, sampled (pass@1)", "#d97706"),
    ):
        points = [m for m in metrics if key in m]
        if points:
            ax.plot(
                [m["step"] for m in points],
                [m[key] for m in points],
                marker="o",
                ms=3,
                lw=2,
                color=color,
                label=label,
            )
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("fraction correct")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    if title:  # wrapped: a long task or environment name must not run off the figure
        ax.set_title(textwrap.fill(title, 80), fontsize=10)
    return save_figure(fig, path)


def plot_reward_hacking(strict_run: str | Path, weak_run: str | Path, path: str | Path) -> Path:
    """Side by side: training on the strict verifier vs on a weak one, same base model.

    Each panel shows the training reward, held-out accuracy (always graded strictly) and the
    hacking monitor's gap between the training reward and strict accuracy.
    """
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), dpi=120, sharey=True)
    for ax, run, title in (
        (axes[0], strict_run, "strict verifier"),
        (axes[1], weak_run, "weak verifier (substring match)"),
    ):
        metrics = read_jsonl(Path(run) / "metrics.jsonl")
        train = [m for m in metrics if "reward/mean" in m]
        ax.plot(
            [m["step"] for m in train],
            [m["reward/mean"] for m in train],
            color="#9ca3af",
            lw=1,
            label="training reward",
        )
        for key, label, color in (
            ("eval/sampled_acc", "held-out accuracy, sampled (strict)", "#d97706"),
            ("eval/greedy_acc", "held-out accuracy, greedy (strict)", "#0f766e"),
            ("monitor/gap", "monitor: reward minus strict accuracy", "#dc2626"),
        ):
            points = [m for m in metrics if key in m]
            ax.plot(
                [m["step"] for m in points],
                [m[key] for m in points],
                marker="o",
                ms=3,
                lw=1.5,
                color=color,
                label=label,
            )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction")
    axes[0].set_ylim(-0.02, 1.02)
    axes[1].legend(loc="lower left", fontsize=8)
    return save_figure(fig, path)


def plot_pipeline(
    report: list[dict[str, Any]], measures: list[str], path: str | Path, title: str = ""
) -> Path:
    """One bar panel per measure (accuracy, readability, length, ...) across a pipeline's
    stages, in stage order; stages without a model (sampling) are left blank."""
    stages = [r for r in report if any(m in r for m in measures)]
    families = sorted({_family(m) for m in measures}, key=_family_order)
    fig, axes = plt.subplots(1, len(families), figsize=(3.6 * len(families), 3.8), dpi=120)
    axes = [axes] if len(families) == 1 else list(axes)
    labels = [
        f"{r['stage']}\n" + ("cached" if r.get("cached") else f"{r['seconds']:.0f} s")
        for r in stages
    ]
    colors = ("#0f766e", "#d97706", "#6366f1", "#db2777")
    for ax, family in zip(axes, families):
        variants = [m for m in measures if _family(m) == family]
        width = 0.8 / len(variants)
        for j, measure in enumerate(variants):
            xs = [i + (j - (len(variants) - 1) / 2) * width for i in range(len(stages))]
            label = measure.replace("accuracy", "greedy").replace("@", " /")
            heights = [r.get(measure, 0.0) for r in stages]
            ax.bar(xs, heights, width, color=colors[j % 4], label=label)
        ax.set_xticks(range(len(stages)), labels, rotation=35, ha="right", fontsize=7)
        ax.set_title(family, fontsize=10)
        if family != "length":
            ax.set_ylim(0, 1.02)
        ax.grid(axis="y", alpha=0.3)
        if len(variants) > 1:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=11)
    return save_figure(fig, path)


def _family(measure: str) -> str:
    """The panel of a measure: greedy and sampled accuracy share one, in every mode."""
    name = measure.split("@")[0]
    return "accuracy" if name == "sampled" else name


def _family_order(family: str) -> int:
    """Panel order: accuracy, readability, obeys, length, then any other measure."""
    order = ("accuracy", "readability", "obeys", "length")
    return order.index(family) if family in order else len(order)


def plot_loss_curve(records: list[dict[str, Any]], path: str | Path) -> Path:
    """SFT training loss per step (and eval/loss where logged) as a PNG."""
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    train = [r for r in records if "loss" in r]
    ax.plot(
        [r["step"] for r in train],
        [r["loss"] for r in train],
        color="#2563eb",
        lw=1,
        label="train loss (per completion token)",
    )
    held = [r for r in records if "eval/loss" in r]
    if held:
        ax.plot(
            [r["step"] for r in held],
            [r["eval/loss"] for r in held],
            color="#d97706",
            marker="o",
            ms=3,
            lw=2,
            label="held-out loss",
        )
    ax.set_xlabel("SFT step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    return save_figure(fig, path)


def plot_thinking_budget(curve: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Accuracy (left) and mean tokens (right) against thinking budget, as a PNG, from the
    points of `rlvr.train.evaluate.thinking_budget_curve`. Budgets are evenly spaced
    categories, `none` (no budget) last."""
    labels = ["none" if p["budget"] is None else str(p["budget"]) for p in curve]
    x = list(range(len(curve)))
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8), dpi=120)
    left.plot(x, [p["accuracy"] for p in curve], marker="o", lw=2, color="#0f766e")
    left.set_ylabel("held-out accuracy")
    left.set_ylim(-0.02, 1.02)
    thinking = [p["thinking_tokens"] for p in curve]
    total = [p["total_tokens"] for p in curve]
    right.plot(x, thinking, marker="o", lw=2, color="#d97706", label="thinking tokens")
    right.plot(x, total, marker="s", lw=2, color="#6b7280", label="total tokens")
    right.set_ylabel("mean tokens per completion")
    right.legend(loc="upper left", fontsize=8)
    for ax in (left, right):
        ax.set_xticks(x, labels)
        ax.set_xlabel("thinking budget (tokens)")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def format_table(curve: list[dict[str, Any]]) -> str:
    """The thinking-budget curve (`rlvr.train.evaluate.thinking_budget_curve`) as a Markdown
    table."""
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


def plot_environments(runs: dict[str, tuple[str | Path, int]], path: str | Path) -> Path:
    """Multi-turn lab runs side by side: held-out success (sampled, with its 95% Wilson band
    over the held-out rows) and replies per episode, against step. `runs` maps a label to
    (run directory, held-out rows)."""
    from rlvr.report.stats import wilson_interval

    fig, (success, turns) = plt.subplots(1, 2, figsize=(12, 4.2), dpi=120)
    colors = ["#0f766e", "#d97706", "#7c3aed", "#dc2626"]
    for (label, (run, n)), color in zip(runs.items(), colors):
        points = [m for m in read_jsonl(Path(run) / "metrics.jsonl") if "eval/sampled_acc" in m]
        steps = [m["step"] for m in points]
        acc = [m["eval/sampled_acc"] for m in points]
        bands = [wilson_interval(a, n) for a in acc]
        success.plot(steps, acc, marker="o", ms=3, lw=2, color=color, label=label)
        success.fill_between(
            steps, [b[0] for b in bands], [b[1] for b in bands], color=color, alpha=0.15
        )
        turns.plot(
            steps,
            [m["eval/sampled_turns"] for m in points],
            marker="o",
            ms=3,
            lw=2,
            color=color,
            label=label,
        )
    success.set_ylabel("held-out success, sampled (T=1)")
    success.set_ylim(-0.02, 1.02)
    turns.set_ylabel("replies per held-out episode, sampled")
    for ax in (success, turns):
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path)
