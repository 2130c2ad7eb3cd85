"""The GRPO family's failure modes on a long-chain task, from an `rlvr compare` run's metrics.

    python benchmarks/patches_figure.py --runs runs --name patches
    python benchmarks/patches_figure.py --runs runs --name patches --out /tmp/patches.png

Reads `RUNS/NAME-RECIPE/metrics.jsonl` (and its config.yaml for the prompts per step) of the
recipes grpo, dr_grpo, dapo and gspo, writes one PNG of four panels (default
docs/images/patches.png) and prints a table: each metric's mean over the first and the last
`--window` steps of each recipe.

- (a) length bias: `completion/len_correct_mean` (solid) and `completion/len_wrong_mean`
  (dashed) per recipe;
- (b) entropy collapse: `policy/entropy` per recipe;
- (c) zero-variance groups: `frac_zero_std_groups` of the batch trained on; for a run with
  dynamic sampling (its batch holds only kept groups), the share of the sampled groups it
  dropped, 1 - sampling/kept_groups / (sampling/tries x prompts per step);
- (d) GSPO: the RMS deviation from 1 of the token and sequence ratios (the square roots of
  `policy/ratio_token_sq_dev`, `policy/ratio_seq_sq_dev`) and `policy/clip_frac` of grpo and
  gspo.

The table adds `zero_std/seconds`: the step's generate + verify seconds times the
zero-variance groups' token share (`zero_std/token_frac`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RECIPES = ("grpo", "dr_grpo", "dapo", "gspo")
COLORS = {"grpo": "tab:blue", "dr_grpo": "tab:orange", "dapo": "tab:green", "gspo": "tab:red"}
TABLE = (
    "completion/len_correct_mean",
    "completion/len_wrong_mean",
    "policy/entropy",
    "frac_zero_std_groups",
    "zero_std/dropped_frac",
    "zero_std/seconds",
    "policy/ratio_token_sq_dev",
    "policy/ratio_seq_sq_dev",
    "policy/clip_frac",
    "reward/mean",
)


def read_steps(run_dir: Path) -> list[dict[str, float]]:
    """The training steps of a run (rows of metrics.jsonl with `reward/mean`, step >= 1), each
    with the derived `zero_std/seconds` and, under dynamic sampling, `zero_std/dropped_frac`."""
    prompts = _prompts_per_step(run_dir)
    steps = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "reward/mean" not in row or row.get("step", 0) < 1:
            continue
        seconds = row.get("time/generate_s", 0.0) + row.get("time/verify_s", 0.0)
        if "zero_std/token_frac" in row:
            row["zero_std/seconds"] = row["zero_std/token_frac"] * seconds
        if "sampling/tries" in row and prompts:
            sampled = row["sampling/tries"] * prompts
            row["zero_std/dropped_frac"] = 1.0 - min(row["sampling/kept_groups"], sampled) / sampled
        steps.append(row)
    return steps


def _prompts_per_step(run_dir: Path) -> int | None:
    """`prompts_per_step` from the run's config.yaml (a line `prompts_per_step: N`), or None."""
    path = run_dir / "config.yaml"
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        key, _, value = line.strip().partition(":")
        if key == "prompts_per_step" and value.strip().isdigit():
            return int(value)
    return None


def series(steps: list[dict[str, float]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that have `key`."""
    rows = [s for s in steps if key in s]
    return [s["step"] for s in rows], [s[key] for s in rows]


def window_means(steps: list[dict[str, float]], key: str, window: int) -> tuple[str, str]:
    """The mean of `key` over the first and over the last `window` steps that log it (divided
    by the steps present), formatted; n/a when none do."""
    _, values = series(steps, key)
    if not values:
        return "n/a", "n/a"
    first, last = values[:window], values[-window:]
    return f"{sum(first) / len(first):.4g}", f"{sum(last) / len(last):.4g}"


def plot(runs: dict[str, list[dict[str, float]]], out: Path) -> Path:
    """The four panels (module docstring) into `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlvr.report.plots import save_figure

    fig, axes = plt.subplots(2, 2, figsize=(12, 8), dpi=110)
    (a, b), (c, d) = axes
    for name, steps in runs.items():
        color = COLORS.get(name)
        a.plot(*series(steps, "completion/len_correct_mean"), color=color, label=f"{name} right")
        a.plot(*series(steps, "completion/len_wrong_mean"), color=color, ls="--", label="wrong")
        b.plot(*series(steps, "policy/entropy"), color=color, label=name)
        c.plot(*series(steps, "frac_zero_std_groups"), color=color, label=f"{name} (trained on)")
        if series(steps, "zero_std/dropped_frac")[0]:
            c.plot(
                *series(steps, "zero_std/dropped_frac"),
                color=color,
                ls=":",
                label=f"{name} (dropped by dynamic sampling)",
            )
        if name in ("grpo", "gspo"):
            token_steps, token_dev = series(steps, "policy/ratio_token_sq_dev")
            seq_steps, seq_dev = series(steps, "policy/ratio_seq_sq_dev")
            d.plot(token_steps, [v**0.5 for v in token_dev], color=color, label=f"{name} token")
            d.plot(seq_steps, [v**0.5 for v in seq_dev], color=color, ls="--", label="sequence")
            d.plot(*series(steps, "policy/clip_frac"), color=color, ls=":", label="clip frac")
    titles = (
        (a, "(a) completion tokens: right (solid), wrong (dashed)"),
        (b, "(b) policy token entropy (nats)"),
        (c, "(c) zero-variance groups (share)"),
        (d, "(d) ratio RMS deviation from 1: token (solid), sequence (dashed); clip frac (dotted)"),
    )
    for ax, title in titles:
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    d.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    return save_figure(fig, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default="runs", help="the compare's --train.runs-dir")
    parser.add_argument("--name", default="patches", help="the compare's --name")
    parser.add_argument("--out", default="docs/images/patches.png")
    parser.add_argument("--window", type=int, default=10, help="steps averaged in the table")
    args = parser.parse_args()
    runs = {}
    for recipe in RECIPES:
        run_dir = Path(args.runs) / f"{args.name}-{recipe}"
        if (run_dir / "metrics.jsonl").exists():
            runs[recipe] = read_steps(run_dir)
    if not runs:
        raise SystemExit(f"no {args.name}-RECIPE/metrics.jsonl under {args.runs}")
    print(f"| metric | {' | '.join(f'{r} first / last {args.window}' for r in runs)} |")
    print("|" + " --- |" * (len(runs) + 1))
    for key in TABLE:
        cells = [" / ".join(window_means(steps, key, args.window)) for steps in runs.values()]
        print(f"| {key} | {' | '.join(cells)} |")
    print(f"wrote {plot(runs, Path(args.out))}")


if __name__ == "__main__":
    main()
