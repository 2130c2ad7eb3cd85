"""`rlvr compare`: the same task, base model, seed and budget for several recipes.

Each recipe runs as its own `rlvr train` process (so its peak memory is its own, read from the
kernel's accounting of that child), then one figure and one table compare them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rlvr.report.run_dir import read_jsonl


def run_recipe(recipe: str, run_name: str, args: list[str]) -> dict[str, Any]:
    """Run `rlvr train --recipe recipe` in a child process; return its peak RSS and status."""
    command = [sys.executable, "-m", "rlvr.cli", "train", "--recipe", recipe,
               "--run-name", run_name, *args]  # fmt: skip
    process = subprocess.Popen(command)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"recipe {recipe} failed (exit {process.returncode}): {command}")
    return {"peak_rss_mb": usage.ru_maxrss / 1024}  # ru_maxrss is in KiB on Linux


def summarize_run(run_dir: Path, peak_rss_mb: float, target: float = 0.8) -> dict[str, Any]:
    """One table row from a run directory's metrics.jsonl and summary.json."""
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = [m for m in metrics if "reward/mean" in m]
    evals = [m for m in metrics if "eval/greedy_acc" in m]
    reached = [m["step"] for m in evals if m["eval/greedy_acc"] >= target]
    step_times = sorted(m["time/step_s"] for m in steps)
    return {
        "final_greedy_acc": summary["final_greedy_acc"],
        "final_sampled_acc": summary["final_sampled_acc"],
        "steps_to_80pct": reached[0] if reached else None,
        "frac_zero_std_groups": _mean([m["frac_zero_std_groups"] for m in steps]),
        "completion_len_mean": _mean([m["completion/len_mean"] for m in steps]),
        "seconds_per_step": step_times[len(step_times) // 2] if step_times else None,
        "peak_rss_mb": peak_rss_mb,
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def format_table(rows: dict[str, dict[str, Any]]) -> str:
    """A Markdown table, one line per recipe."""
    header = ("| recipe | final greedy acc | final sampled acc | steps to 80% | zero-var groups "
              "| mean length | s/step | peak RSS MB |")  # fmt: skip
    lines = [header, "|" + " --- |" * 8]
    for name, r in rows.items():
        cells = [
            f"{r['final_greedy_acc']:.3f}", f"{r['final_sampled_acc']:.3f}",
            str(r["steps_to_80pct"]) if r["steps_to_80pct"] is not None else "not reached",
            f"{r['frac_zero_std_groups']:.2f}", f"{r['completion_len_mean']:.1f}",
            f"{r['seconds_per_step']:.2f}", f"{r['peak_rss_mb']:.0f}",
        ]  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_comparison(runs: dict[str, Path], path: Path) -> Path:
    """Held-out greedy accuracy, train reward and completion length against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlvr.report.plots import save_figure

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), dpi=120)
    panels = (
        ("eval/greedy_acc", "held-out accuracy (greedy)"),
        ("reward/mean", "train reward"),
        ("completion/len_mean", "completion length (tokens)"),
    )
    for name, run_dir in runs.items():
        metrics = read_jsonl(run_dir / "metrics.jsonl")
        for ax, (key, title) in zip(axes, panels):
            points = [m for m in metrics if key in m]
            ax.plot([m["step"] for m in points], [m[key] for m in points], label=name,
                    marker="o" if key.startswith("eval/") else None, ms=3)  # fmt: skip
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return save_figure(fig, path)


def compare_recipes(
    recipes: list[str], runs_dir: str, name: str, train_args: list[str], progress: bool = True
) -> dict[str, dict[str, Any]]:
    """Run each recipe with the same `train_args`; write compare.png, compare.md, compare.json
    under runs_dir/name and return the table rows."""
    out = Path(runs_dir) / name
    out.mkdir(parents=True, exist_ok=True)
    rows, run_dirs = {}, {}
    for recipe in recipes:
        run_name = f"{name}-{recipe}".replace("+", "p")
        if progress:
            print(f"[rlvr compare] {recipe} -> {runs_dir}/{run_name}", flush=True)
        usage = run_recipe(recipe, run_name, ["--runs-dir", runs_dir, *train_args])
        run_dirs[recipe] = Path(runs_dir) / run_name
        rows[recipe] = summarize_run(run_dirs[recipe], usage["peak_rss_mb"])
    plot_comparison(run_dirs, out / "compare.png")
    table = format_table(rows)
    (out / "compare.md").write_text(table + "\n")
    (out / "compare.json").write_text(json.dumps(rows, indent=2) + "\n")
    if progress:
        print(table)
    return rows
