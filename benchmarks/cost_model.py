"""How rlvr's GRPO step time grows with group size, prompts per step, completion length and
model size on this machine, split into generate / update / other.

    python benchmarks/cost_model.py                       # about 5 minutes on 2 cores
    python benchmarks/cost_model.py --quick               # smoke test, under a minute
    python benchmarks/cost_model.py --out docs/cost_model.png --json cost.json

One variable moves at a time from the lab's point (G = 8 completions per prompt, B = 16
prompts, 3-digit addition, the lab's 1.25 M-parameter shape: 3 layers of width 160). Each point
runs `rlvr.train.grpo.train_grpo` for a warm-up step plus `--steps` measured steps, once per
pass; the passes go round all points in turn (`--passes`, default 3), so that load from other
jobs, which comes and goes on a shared machine, falls on every point alike. A point's figure is
the median over its measured steps of each part of `time/step_s`: `time/generate_s`
(sampling), `time/update_s` (loss, backward, optimizer) and the rest (verifying, advantages).

What is held fixed, and why:
- the model is freshly initialised (seed 0) at every shape, so that every point costs no base
  training; weights do not change arithmetic cost, completion length does, and a fresh model
  rarely emits EOS, so its completions run close to the task's budget (the mean length is
  measured and reported). The length axis is the task's budget: `ArithmeticTaskConfig(digits)`.
- the reward is a seeded coin flip per completion (a fresh model solves nothing): groups then
  have reward variance as in a learning run, so no step is a no-op update.
- threads are rlvr's defaults: two worker threads with one torch thread each
  (`GRPOConfig.cpu_workers`); OMP_WAIT_POLICY=PASSIVE.

The achieved arithmetic rate of the update is 6 x parameters x the tokens it runs (B x G x
mean completion length, plus B x prompt length: rlvr runs each group's prompt once and trims
padding, so neither earns credit) per second of `time/update_s`, plus attention (counted as
for sequences of that mean length: an undercount),
as a fraction of the machine's 2048^2 fp32 matmul rate on 2 threads, measured in the same run;
generation's is 2 x parameters x completion tokens per second of `time/generate_s`, plus
attention (conventions in `benchmarks/_common.py`).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import _common as common

LAB = {"group": 8, "prompts": 16, "digits": 3, "size": "3x160"}
SIZES = {  # layers x hidden: (layers, hidden, heads); MLP width 4 x hidden
    "2x128": (2, 128, 4),
    "3x160": (3, 160, 4),
    "4x256": (4, 256, 4),
    "6x320": (6, 320, 5),
}
AXES = {
    "group": ("completions per prompt G", [4, 8, 16]),
    "prompts": ("prompts per step B", [8, 16, 32]),
    "digits": ("task digits (completion budget)", [3, 6, 12]),
    "size": ("model (layers x hidden)", list(SIZES)),
}
QUICK_AXES = {
    "group": [4, 8],
    "prompts": [4, 8],
    "digits": [3, 6],
    "size": ["2x128", "3x160"],
}


def coin_flip_reward(seed: int):
    """A TRL-signature reward: 0 or 1 per completion, seeded."""
    rng = random.Random(seed)

    def reward(prompts, completions, **columns):
        return [float(rng.random() < 0.5) for _ in completions]

    return reward


def measure(point: dict, steps: int) -> list[dict]:
    """Run one point: a warm-up step plus `steps` steps; each measured step's parts, tokens
    and arithmetic rates."""
    import torch

    from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
    from rlvr.report.run_dir import RunDirectory
    from rlvr.train.config import GRPOConfig, Monitor
    from rlvr.train.grpo import train_grpo

    layers, hidden, heads = SIZES[point["size"]]
    tiny = TinyModelConfig(
        num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=4 * hidden
    )
    _, task = common.lab_setup(point["digits"])
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tiny, tokenizer, seed=0)
    config = GRPOConfig(
        steps=steps + 1,
        prompts_per_step=point["prompts"],
        group_size=point["group"],
        max_new_tokens=task.max_new_tokens,
        checkpoint_every=0,
        monitor=Monitor(every=0),
    )
    torch.set_num_threads(2)
    run = RunDirectory(tempfile.mkdtemp(prefix="rlvr-cost-"), "run")
    records = train_grpo(
        model,
        tokenizer,
        task.train_rows(10_000),
        [coin_flip_reward(0)],
        config,
        run,
        evaluate=lambda m: {},
        seed=0,
        progress=False,
    )
    records = [r for r in records if "time/step_s" in r][1:]  # drop the warm-up step
    shape = common.model_shape(model)
    n = point["prompts"] * point["group"]
    prompt_len = len(task.held_out_rows()[0]["prompt"])
    out = []
    for r in records:
        tokens = prompt_len / point["group"] + r["completion/len_mean"]  # per row, run
        update = common.update_flops(shape, n, tokens) / r["time/update_s"] / 1e9
        gen = common.generation_flops(shape, n, prompt_len, r["completion/len_mean"])
        gen = gen / r["time/generate_s"] / 1e9
        out.append(
            {
                "params": shape["params"],
                "completions": n,
                "budget": task.max_new_tokens,
                "completion_len": r["completion/len_mean"],
                "step_s": r["time/step_s"],
                "generate_s": r["time/generate_s"],
                "update_s": r["time/update_s"],
                "tokens_per_s": r["completion/len_mean"] * n / r["time/step_s"],
                "update_gflops": update,
                "generate_gflops": gen,
            }
        )
    return out


def run(axes: dict[str, list], steps: int, passes: int) -> dict:
    """Every point (the lab's point is shared by the axes) once per pass, in turn, so that
    load from other jobs that comes and goes falls on all points alike. The matmul rate is
    measured between points; a point's ceiling is the median of the measurements just before
    and just after each of its runs. A point's figures are medians over the steps of all
    passes."""
    points = {}
    for axis, values in axes.items():
        for value in values:
            point = {**LAB, axis: value}
            points.setdefault(tuple(sorted(point.items())), point)
    steps_of: dict[tuple, list[dict]] = {key: [] for key in points}
    adjacent: dict[tuple, list[float]] = {key: [] for key in points}
    ceiling = []
    for i in range(passes):
        t0 = time.perf_counter()
        ceiling.append(common.matmul_gflops())
        for key, point in points.items():
            steps_of[key].extend(measure(point, steps))
            ceiling.append(common.matmul_gflops())
            adjacent[key] += ceiling[-2:]
        common.say(f"[cost] pass {i + 1}/{passes}: {time.perf_counter() - t0:.0f} s")
    summary = {}
    for key, point in points.items():
        measured = steps_of[key]
        p = summary[key] = {**point, "steps": measured}
        for field in measured[0]:
            p[field] = common.median(m[field] for m in measured)
        p["other_s"] = max(0.0, p["step_s"] - p["generate_s"] - p["update_s"])
        p["matmul_gflops"] = common.median(adjacent[key])
        p["update_fraction"] = p["update_gflops"] / p["matmul_gflops"]
        p["generate_fraction"] = p["generate_gflops"] / p["matmul_gflops"]
    results = {
        axis: [summary[tuple(sorted({**LAB, axis: v}.items()))] for v in values]
        for axis, values in axes.items()
    }
    return {
        "matmul_gflops": ceiling,
        "matmul_median": common.median(ceiling),
        "steps": steps,
        "passes": passes,
        "axes": results,
    }


def table(result: dict) -> str:
    header = [
        "varied",
        "value",
        "params",
        "B x G",
        "mean completion tokens",
        "s/step",
        "generate s",
        "update s",
        "other s",
        "generate share",
        "completion tok/s",
        "matmul GFLOP/s",
        "update GFLOP/s (of matmul)",
        "generation GFLOP/s (of matmul)",
    ]
    rows = []
    for axis, points in result["axes"].items():
        for p in points:
            rows.append(
                [
                    AXES[axis][0],
                    p[axis],
                    f"{p['params'] / 1e6:.2f} M",
                    f"{p['prompts']} x {p['group']}",
                    f"{p['completion_len']:.0f}",
                    f"{p['step_s']:.2f}",
                    f"{p['generate_s']:.2f}",
                    f"{p['update_s']:.2f}",
                    f"{p['other_s']:.2f}",
                    f"{p['generate_s'] / p['step_s']:.0%}",
                    f"{p['tokens_per_s']:,.0f}",
                    f"{p['matmul_gflops']:.0f}",
                    f"{p['update_gflops']:.1f} ({p['update_fraction']:.0%})",
                    f"{p['generate_gflops']:.1f} ({p['generate_fraction']:.0%})",
                ]
            )
    return common.markdown_table(header, rows)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(1, 4, figsize=(16, 4.2))
    parts = [
        ("generate_s", "generate", "#4c72b0"),
        ("update_s", "update", "#dd8452"),
        ("other_s", "other", "#8c8c8c"),
    ]
    for ax, (axis, points) in zip(axs, result["axes"].items()):
        labels = [_tick(axis, p) for p in points]
        bottom = [0.0] * len(points)
        for key, name, color in parts:
            values = [p[key] for p in points]
            ax.bar(labels, values, bottom=bottom, color=color, label=name)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_title(AXES[axis][0], fontsize=10)
        ax.set_ylabel("seconds per step")
        ax.tick_params(axis="x", labelsize=8)
        for x, p in enumerate(points):
            label = f"upd {p['update_fraction']:.0%}\ngen {p['generate_fraction']:.0%}"
            ax.annotate(label, (x, bottom[x]), ha="center", va="bottom", fontsize=7)
        ax.set_ylim(0, max(bottom) * 1.25)
    axs[0].legend(loc="upper left", fontsize=8)
    fig.suptitle(
        "rlvr GRPO step time on 2 CPU cores (annotations: update's and generation's achieved "
        f"fraction of the 2048² matmul rate, median {result['matmul_median']:.0f} GFLOP/s)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _tick(axis: str, p: dict) -> str:
    if axis == "digits":
        return f"{p['digits']} digits\n~{p['completion_len']:.0f} tok"
    if axis == "size":
        return f"{p['size']}\n{p['params'] / 1e6:.1f} M"
    return str(p[axis])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2, help="measured steps per point and pass")
    parser.add_argument("--passes", type=int, default=3, help="passes over all points")
    parser.add_argument("--quick", action="store_true", help="smoke test: 2 points per axis")
    parser.add_argument("--out", type=Path, default=Path("cost_model.png"), help="the figure")
    parser.add_argument("--json", type=Path, help="write the measurements as JSON here")
    args = parser.parse_args()
    axes = {k: v for k, (_, v) in AXES.items()}
    if args.quick:
        axes, args.steps, args.passes = QUICK_AXES, 1, 1
        LAB.update(prompts=4, group=4)
    start = time.perf_counter()
    result = run(axes, args.steps, args.passes)
    print(table(result))
    print()
    rates = ", ".join(f"{g:.0f}" for g in result["matmul_gflops"])
    print(f"matmul 2048² fp32, 2 threads, between points, in order: {rates} GFLOP/s")
    plot(result, args.out)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    common.say(f"[cost] {time.perf_counter() - start:.0f} s in all; figure: {args.out}")


if __name__ == "__main__":
    main()
