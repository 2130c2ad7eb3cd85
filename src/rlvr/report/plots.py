"""Figures of a run, drawn from its metrics.jsonl."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402


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
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
