"""The lab over seeds: what `rlvr lab` promises on any machine.

A seeded lab run is bit-identical on one machine with one lock of versions; on another CPU or
another release, rounding differs, and at the lab's size that changes the trajectory. What a
user can count on is the band over seeds. This runs `rlvr lab --seed S` (the RL run's seed:
sampling and data order, on the lab's one base model) for each seed, one after another, and
prints each held-out number's mean, min and max, and whether every seed reached greedy >= 0.95.
`--vary both` also gives each seed a base model of its own (`--base.seed S`: other initial
weights and another flawed corpus).

    python benchmarks/lab_seeds.py --seeds 5 [--vary rl|both] [--out runs/lab-seeds]
        [-- EXTRA LAB FLAGS]

Each run's directory is OUT/seed-S (summary.json there has the numbers and the environment);
OUT/seeds.json gathers them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

KEYS = ("base_greedy_acc", "final_greedy_acc", "base_sampled_acc", "final_sampled_acc")
BAR = 0.95  # the README's promise: every seed ends at held-out greedy >= this


def run_seed(seed: int, out: Path, vary: str, extra: list[str]) -> dict:
    """`rlvr lab` at `seed` (the RL run's; the base model's too when `vary` is "both") into
    OUT/seed-SEED."""
    flags = ["--seed", str(seed), "--run-name", f"seed-{seed}"]
    flags += ["--base.seed", str(seed)] if vary == "both" else []
    flags += ["--runs-dir", str(out), "--cache-dir", str(out / "cache"), "--no-progress"]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rlvr", "lab", *flags, *extra], check=True, env=env)
    summary = json.loads((out / f"seed-{seed}" / "summary.json").read_text())
    return {"seed": seed, "wall_s": time.perf_counter() - t0, **{k: summary[k] for k in KEYS}}


def table(rows: list[dict]) -> str:
    """Mean, min and max of each held-out number over the rows, as a Markdown table."""
    lines = ["| held-out accuracy | mean | min | max | per seed |", "|" + " --- |" * 5]
    for key in KEYS:
        values = [r[key] for r in rows]
        each = " ".join(f"{v:.3f}" for v in values)
        lines.append(
            f"| {key} | {statistics.mean(values):.3f} | {min(values):.3f} | "
            f"{max(values):.3f} | {each} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0 .. N-1")
    parser.add_argument("--vary", choices=("rl", "both"), default="rl")
    parser.add_argument("--out", default="runs/lab-seeds")
    parser.add_argument("extra", nargs="*", help="more `rlvr lab` flags (after --)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in range(args.seeds):
        rows.append(run_seed(seed, out, args.vary, args.extra))
        print(f"seed {seed}: " + ", ".join(f"{k} {rows[-1][k]:.3f}" for k in KEYS), flush=True)
    summary = json.loads((out / "seed-0" / "summary.json").read_text())
    (out / "seeds.json").write_text(
        json.dumps({"runs": rows, "environment": summary.get("environment")}, indent=2) + "\n"
    )
    print(table(rows))
    reached = sum(r["final_greedy_acc"] >= BAR for r in rows)
    print(f"{reached}/{len(rows)} seeds reach held-out greedy >= {BAR}")
    print(f"environment: {summary.get('environment')}")


if __name__ == "__main__":
    main()
