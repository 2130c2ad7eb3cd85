"""The GPU check's measurements, as one table: a 20-step lab on `--device cuda` and, when the
real checkpoint is prepared, one SmolLM2-135M GRPO step in bf16 (and with vLLM when it is
installed). Run by scripts/gpu_check.sh; prints a markdown table of step times and memory.

    python scripts/gpu_check.py [--out DIR] [--model SMOLLM2_DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch


def run(name: str, argv: list[str], out: Path) -> dict:
    """Run `rlvr ARGV` in a subprocess; its summary.json, wall seconds and peak GPU memory."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", *argv], capture_output=True, text=True, timeout=300
    )
    seconds = time.perf_counter() - start
    (out / f"{name}.log").write_text(proc.stdout + proc.stderr)
    summary_path = out / name / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    metrics_path = out / name / "metrics.jsonl"
    steps = []
    if metrics_path.exists():
        steps = [json.loads(line) for line in metrics_path.read_text().splitlines()]
        steps = [s for s in steps if "reward/mean" in s]
    return {
        "check": name,
        "ok": proc.returncode == 0,
        "wall_s": seconds,
        "median_step_s": summary.get("median_step_seconds"),
        "peak_gpu_gb": max((s.get("memory/peak_gpu_gb", 0.0) for s in steps), default=None),
        "greedy": f"{summary.get('base_greedy_acc', float('nan')):.3f} -> "
        f"{summary.get('final_greedy_acc', float('nan')):.3f}",
        "error": "" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or [""])[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/gpu-check")
    parser.add_argument("--model", default=None, help="the prepared SmolLM2 directory")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device here")
    common = ["--runs-dir", str(out), "--overwrite", "--no-progress", "--device", "cuda"]
    rows = [
        run(
            "lab-cuda",
            [
                "train",
                "grpo",
                *common,
                "--run-name",
                "lab-cuda",
                "--grpo.steps",
                "20",
                "--grpo.eval-every",
                "20",
            ],
            out,
        )
    ]
    model = args.model or _prepared_model()
    if model:
        real = [
            "--model",
            model,
            "--arithmetic.digits",
            "2",
            "--arithmetic.style",
            "question",
            "--arithmetic.held-out-size",
            "50",
            "--few-shot",
            "2",
            "--eval-samples",
            "1",
            "--grpo.max-new-tokens",
            "64",
            "--grpo.prompts-per-step",
            "8",
            "--grpo.group-size",
            "4",
            "--grpo.lr",
            "2e-6",
            "--grpo.steps",
            "3",
            "--grpo.eval-every",
            "3",
        ]
        for dtype in ("bfloat16", "float32"):
            name = f"smollm2-{dtype}"
            rows.append(
                run(
                    name,
                    ["train", "grpo", *common, *real, "--dtype", dtype, "--run-name", name],
                    out,
                )
            )
    else:
        print(
            "gpu_check: no prepared SmolLM2 (rlvr models prepare smollm2-135m-instruct): "
            "the real-checkpoint rows are skipped",
            file=sys.stderr,
        )
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(_cell(row[k]) for k in keys) + " |")
    (out / "table.json").write_text(json.dumps(rows, indent=2))


def _prepared_model() -> str | None:
    """The prepared SmolLM2 directory when `rlvr models prepare` has made it, else None."""
    from rlvr.pipelines.base_model import prepared_model_dir

    path = prepared_model_dir("smollm2-135m-instruct")
    return str(path) if (path / "config.json").is_file() else None


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return "" if value is None else str(value)


if __name__ == "__main__":
    main()
