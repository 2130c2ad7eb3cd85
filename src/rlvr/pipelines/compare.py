"""`rlvr compare`: the same task, base model, seed and budget for several recipes.

Each recipe runs `run_lab` in its own child process (multiprocessing's spawn context: a fresh
interpreter, so its peak memory is its own, `ru_maxrss` of that child), with one typed
`LabConfig` whose `recipe` is set per child; then one figure and one table compare them.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import resource
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from rlvr.config import RunPlace, UserError
from rlvr.pipelines.lab import LabConfig, resolve, run_lab
from rlvr.report.run_dir import read_jsonl
from rlvr.report.run_log import RunLog
from rlvr.report.stats import format_interval
from rlvr.train.config import GRPOConfig
from rlvr.train.recipes import apply_recipe

COMPARE_LOG = RunLog(prefix="rlvr compare")
"""`rlvr compare`'s own lines (`[rlvr compare] RECIPE -> RUN_DIR`, then the table)."""


def _compare_train_default() -> LabConfig:
    """What every recipe of `rlvr compare` trains by default: 60 steps, overwriting, quiet."""
    place = RunPlace(overwrite=True, progress=False)
    return LabConfig(place=place, grpo=GRPOConfig(steps=60))


@dataclass(frozen=True)
class CompareConfig:
    """`rlvr compare`: several recipes on the same task, base model, seed and budget."""

    recipes: str = "grpo,rloo,dr_grpo,dapo,gspo"
    """Comma-separated recipe names (see `rlvr recipes`)."""
    name: str = "compare"
    """The comparison's directory under --runs-dir (each recipe gets NAME-RECIPE beside it)."""
    train: LabConfig = field(default_factory=_compare_train_default)
    """The lab's settings for every recipe: `rlvr train`'s flags under --train. (--train.runs-dir,
    --train.seed, --train.model, --train.grpo.steps, ...). Each recipe fills the grpo fields
    left at their defaults; to set a recipe's switch back to its default, use --train.set."""


def run_compare(config: CompareConfig) -> dict[str, dict[str, Any]]:
    """`rlvr compare`: check every recipe (an unknown name or an impossible setting is refused
    before the first child starts), then `compare_recipes`; returns its table rows."""
    recipes = [r.strip() for r in config.recipes.split(",") if r.strip()]
    for recipe in recipes:  # an unknown name or impossible setting: before the first child
        resolve(recipe_train_config(config.train, recipe))
    return compare_recipes(recipes, config.train, config.name)


def recipe_train_config(train: LabConfig, recipe: str) -> LabConfig:
    """`train` for one recipe of `rlvr compare`: the recipe's switches fill the `train.grpo`
    fields left at `GRPOConfig`'s defaults (`apply_recipe`); `--train.grpo.*` flags set to
    other values win. A switch set back to its default: `--train.set`, applied after."""
    return dataclasses.replace(train, recipe=recipe, grpo=apply_recipe(recipe, train.grpo))


def run_recipe(config: LabConfig) -> dict[str, Any]:
    """`run_lab(config)` in a spawned child process; return its peak RSS. A user error in the
    child is raised here as a UserError with its message, any other failure as RuntimeError."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_run_child, args=(config, sender))
    child.start()
    sender.close()
    try:
        kind, value = receiver.recv()
    except EOFError:
        kind, value = "error", "the child process ended without a result"
    child.join()
    if kind == "user":
        raise UserError(f"recipe {config.recipe}: {value}")
    if kind != "ok" or child.exitcode != 0:
        raise RuntimeError(f"recipe {config.recipe} failed (exit {child.exitcode}): {value}")
    return {"peak_rss_mb": value / 1024}  # ru_maxrss is in KiB on Linux


def _run_child(config: LabConfig, sender: Connection) -> None:
    """The child's work: the lab, then ("ok", peak RSS in KiB) or the error, through `sender`."""
    try:
        run_lab(config)
    except UserError as exc:
        sender.send(("user", str(exc)))
        return
    except BaseException as exc:
        sender.send(("error", f"{type(exc).__name__}: {exc}"))
        raise
    sender.send(("ok", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))


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
        "held_out_problems": summary["held_out_problems"],
        "steps_to_80pct": reached[0] if reached else None,
        "frac_zero_std_groups": _mean([m.get("frac_zero_std_groups") for m in steps]),
        "completion_len_mean": _mean([m.get("completion/len_mean") for m in steps]),
        "seconds_per_step": step_times[len(step_times) // 2] if step_times else None,
        "peak_rss_mb": peak_rss_mb,
    }


def _mean(values: list[float | None]) -> float | None:
    """The mean of the values present (None when none are: a metric a recipe does not log)."""
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _number(value: float | None, spec: str) -> str:
    """`value` formatted by `spec`, or n/a."""
    return "n/a" if value is None else format(value, spec)


def format_table(rows: dict[str, dict[str, Any]]) -> str:
    """A Markdown table, one line per recipe; accuracies with their 95% Wilson intervals over
    the held-out problems (conservative for the sampled one)."""
    header = (
        "| recipe | final greedy acc | final sampled acc | steps to 80% | zero-var groups "
        "| mean length | s/step | peak RSS MB |"
    )
    lines = [header, "|" + " --- |" * 8]
    for name, r in rows.items():
        cells = [
            format_interval(r["final_greedy_acc"], r["held_out_problems"]),
            format_interval(r["final_sampled_acc"], r["held_out_problems"]),
            str(r["steps_to_80pct"]) if r["steps_to_80pct"] is not None else "not reached",
            _number(r["frac_zero_std_groups"], ".2f"),
            _number(r["completion_len_mean"], ".1f"),
            _number(r["seconds_per_step"], ".2f"),
            f"{r['peak_rss_mb']:.0f}",
        ]
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
            marker = "o" if key.startswith("eval/") else None
            steps = [m["step"] for m in points]
            ax.plot(steps, [m[key] for m in points], label=name, marker=marker, ms=3)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return save_figure(fig, path)


def compare_recipes(
    recipes: list[str], train: LabConfig, name: str, log: RunLog = COMPARE_LOG
) -> dict[str, dict[str, Any]]:
    """Run each recipe on `train` (its `recipe` and `run_name` set per recipe; the recipe fills
    the grpo fields left at their defaults, `recipe_train_config`); write compare.png, compare.md,
    compare.json under train.runs_dir/name and return the table rows."""
    out = Path(train.runs_dir) / name
    out.mkdir(parents=True, exist_ok=True)
    rows, run_dirs = {}, {}
    for recipe in recipes:
        run_name = f"{name}-{recipe}".replace("+", "p")
        log.say(f"{recipe} -> {train.runs_dir}/{run_name}")
        usage = run_recipe(
            dataclasses.replace(recipe_train_config(train, recipe), run_name=run_name)
        )
        run_dirs[recipe] = Path(train.runs_dir) / run_name
        rows[recipe] = summarize_run(run_dirs[recipe], usage["peak_rss_mb"])
    plot_comparison(run_dirs, out / "compare.png")
    table = format_table(rows)
    (out / "compare.md").write_text(table + "\n")
    (out / "compare.json").write_text(json.dumps(rows, indent=2) + "\n")
    if log.progress:
        print(table)
    return rows
