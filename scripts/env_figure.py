"""The README's multi-turn figure from lab runs of the built-in environments:

    rlvr lab --env tool_chain --run-name tool_chain      (and guess_number, retry_arith)
    python scripts/env_figure.py runs/tool_chain runs/guess_number runs/retry_arith

Each run's environment is read from its config.yaml; its held-out size from the environment.
Writes docs/environments.png and prints the base and final numbers with 95% intervals."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import yaml

from rlvr.report.plots import plot_environments
from rlvr.report.stats import format_interval
from rlvr.tasks.registry import ENVIRONMENTS


def main(run_dirs: list[str], out: str = "docs/environments.png") -> None:
    runs = {}
    print(
        "| environment | held-out rows | GRPO steps | sampled success, base | after | "
        "greedy success, base | after | sampled replies per episode, base | after |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for run in map(Path, run_dirs):
        name = yaml.safe_load((run / "config.yaml").read_text())["env"]["name"]
        n = len(importlib.import_module(ENVIRONMENTS[name]).task_spec().held_out_rows())
        runs[name] = (run, n)
        summary = json.loads((run / "summary.json").read_text())  # 8 samples a row
        lines = (run / "metrics.jsonl").read_text().splitlines()
        evals = [r for r in map(json.loads, lines) if "eval/sampled_turns" in r]
        print(
            f"| {name} | {n} | {summary['steps']} "
            f"| {format_interval(summary['base_sampled_acc'], n)} "
            f"| {format_interval(summary['final_sampled_acc'], n)} "
            f"| {format_interval(summary['base_greedy_acc'], n)} "
            f"| {format_interval(summary['final_greedy_acc'], n)} "
            f"| {evals[0]['eval/sampled_turns']:.2f} | {evals[-1]['eval/sampled_turns']:.2f} |"
        )
    print(plot_environments(runs, out))


if __name__ == "__main__":
    main(sys.argv[1:])
