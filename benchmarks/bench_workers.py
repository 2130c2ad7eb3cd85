"""Worker threads against intra-op threads: sampling and the update, side by side.

    python benchmarks/bench_workers.py                 # lab and long settings, 6 rounds
    python benchmarks/bench_workers.py --setting long --rounds 10
    python benchmarks/bench_workers.py --quick

On the lab's base model for each setting (3-digit and 12-digit addition, as in
`bench_trl.py`), 16 prompts x 8 samples at the task's budget. Sampling: one torch thread, two
intra-op threads, and two worker threads with one torch thread each (`sample_completions(...,
workers=2)`). Update: `grpo_step`'s forward and backward (`time/forward_s + time/backward_s`)
on one fixed sampled batch, at lr 0 so every round sees the same model: one pass on two
intra-op threads (`cpu_workers=1`) and two workers at several micro-batch budgets, with each
row running its own copy of the prompt or each group's prompt run once
(`--grpo.forward padded` or `shared-prompt`). The
modes take turns within each round, so machine load falls on all alike. The table gives the
median seconds of each mode and its speed relative to the first mode of its part.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import _common as common
import torch

from rlvr.models.tiny import load_model
from rlvr.report.timer import StepTimer
from rlvr.rollout.sampler import sample_completions
from rlvr.train.config import GRPOConfig, Monitor
from rlvr.train.grpo import build_trainer, grpo_step

SETTINGS = {"lab": 3, "long": 12}


class FixedEngine:
    """Returns one batch, whatever it is asked: the update sees the same rollouts each time."""

    def __init__(self, batch):
        self.batch = batch

    def generate(self, *args, **kwargs):
        return self.batch

    def load_weights(self, state_dict) -> None:
        pass


def sampling_modes(threads: int) -> dict[str, tuple[int, int]]:
    """Mode name -> (torch threads, workers)."""
    return {
        "1 torch thread": (1, 1),
        f"{threads} intra-op threads": (threads, 1),
        f"{threads} workers x 1 thread": (threads, threads),
    }


def update_modes(threads: int, budgets: list[int]) -> dict[str, dict]:
    """Mode name -> GRPOConfig switches."""
    one_pass = dict(cpu_workers=1, micro_batch_tokens=0)
    modes = {
        f"one pass, {threads} intra-op threads, a prompt per row": {
            **one_pass,
            "forward": "padded",
        },
        f"one pass, {threads} intra-op threads, a prompt per group": {
            **one_pass,
            "forward": "shared-prompt",
        },
        f"{threads} workers, 2048-token micro-batches, a prompt per row": dict(
            cpu_workers=threads, micro_batch_tokens=2048, forward="padded"
        ),
    }
    for b in budgets:
        modes[f"{threads} workers, {b}-token micro-batches, a prompt per group"] = dict(
            cpu_workers=threads, micro_batch_tokens=b
        )
    return modes


def run_setting(name: str, args) -> list[list[str]]:
    config, task = common.lab_setup(SETTINGS[name])
    base_dir, _ = common.base_model_dir(config, task)
    model, tokenizer = load_model(base_dir)
    stream = task.train_rows(0)
    rows = [next(stream) for _ in range(args.prompts)]
    prompts = [r["prompt"] for r in rows]
    budget = task.max_new_tokens
    sampling = sampling_modes(args.threads)
    updating = update_modes(args.threads, args.budgets)
    seconds = {m: [] for m in [*sampling, *updating]}
    torch.set_num_threads(args.threads)
    fixed = sample_completions(
        model, tokenizer, prompts, 8, budget, 1.0, torch.Generator().manual_seed(0)
    )
    tokens = int(fixed.lengths.sum())

    def reward(prompts, completions, **_):  # all different: no row has advantage 0
        return [(i * 0.618) % 1 for i in range(len(completions))]

    for r in range(args.rounds):
        for mode, (threads, workers) in sampling.items():
            torch.set_num_threads(threads)
            t0 = time.perf_counter()
            sample_completions(
                model,
                tokenizer,
                prompts,
                8,
                budget,
                1.0,
                torch.Generator().manual_seed(r),
                workers=workers,
            )
            seconds[mode].append(time.perf_counter() - t0)
        torch.set_num_threads(args.threads)
        for mode, switches in updating.items():
            grpo = GRPOConfig(
                prompts_per_step=args.prompts,
                group_size=8,
                max_new_tokens=budget,
                lr=0.0,
                monitor=Monitor(every=0),
                **switches,
            )
            t = build_trainer(
                model,
                tokenizer,
                itertools.cycle(rows),
                [reward],
                grpo,
                seed=0,
                engine=FixedEngine(fixed),
            )
            result = grpo_step(t.plan, t.rollout, t.learner, t.state.generator, StepTimer())
            metrics = result.metrics
            seconds[mode].append(metrics["time/forward_s"] + metrics["time/backward_s"])
        common.say(f"[bench] {name} round {r + 1}/{args.rounds}")
    out = []
    for part, modes in (("sampling", sampling), ("update", updating)):
        first = None
        for mode in modes:
            s = statistics.median(seconds[mode])
            first = first or s
            rate = f"{tokens / s:,.0f}" if part == "sampling" else ""
            out.append([name, part, mode, f"{s:.3f}", rate, f"{first / s:.2f}"])
    common.say(f"[bench] {name}: {tokens} completion tokens per call")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--setting", choices=[*SETTINGS, "both"], default="both")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="cores to use")
    parser.add_argument("--budgets", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--quick", action="store_true", help="2 rounds, 4 prompts")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.prompts = 2, 4
    names = list(SETTINGS) if args.setting == "both" else [args.setting]
    rows = [row for name in names for row in run_setting(name, args)]
    header = ["setting", "part", "mode", "median s", "completion tok/s", "x first mode"]
    print(common.markdown_table(header, rows))


if __name__ == "__main__":
    main()
