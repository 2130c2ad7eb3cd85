"""Measurements behind docs/miniature.md: train one tiny model from scratch on one data mix of
the reasoning task, then report held-out accuracy, readability and (optionally) a thinking-budget
curve. Each run takes one to three minutes on two CPU cores.

    python scripts/miniature.py --data base       # the flawed, notation-mixed corpus
    python scripts/miniature.py --data think      # clean thinking solutions only
    python scripts/miniature.py --data no_think   # `/no_think` answers only
    python scripts/miniature.py --data fused --curve docs/thinking_budget.png

`--task.variable-steps` draws problems that need 1..digits steps (zero-padded prompts, see
`rlvr.tasks.reasoning`); accuracy and the budget curve are then also reported per number of
steps a problem needs.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import tyro  # noqa: E402

from rlvr.models.tiny import (  # noqa: E402
    TinyModelConfig,
    build_char_tokenizer,
    build_tiny_model,
    load_model,
    save_model,
)
from rlvr.report.plots import format_table, plot_thinking_budget  # noqa: E402
from rlvr.rollout.sampler import sample_completions  # noqa: E402
from rlvr.tasks import reasoning  # noqa: E402
from rlvr.train.evaluate import think_mode_check, thinking_budget_curve  # noqa: E402
from rlvr.train.sft import train_next_token  # noqa: E402

DATA = ("base", "think", "no_think", "fused", "fused_budget")


@dataclass
class Args:
    data: str = "base"
    """Training mix: base (flawed, mixed notation), think, no_think, fused (half and half), or
    fused_budget (fused plus thinking cut short by a budget: 50/20/30 think/no-think/cut)."""
    task: reasoning.ReasoningTaskConfig = field(default_factory=reasoning.ReasoningTaskConfig)
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    flaw_prob: float = 0.65
    """Base corpus: chance that each carry is dropped (the lab's default)."""
    steps: int = 800
    batch_size: int = 16
    lr: float = 2e-3
    seed: int = 0
    threads: int = 2
    eval_samples: int = 4
    """Sampled (temperature 1) completions per held-out problem."""
    init: str | None = None
    """Fine-tune this saved model instead of a fresh one (e.g. cold-start SFT of a base)."""
    pool: int = 0
    """Cycle over this many distinct training pairs (0: a fresh problem every time), e.g. 200
    readable solutions for a cold start."""
    save: str | None = None
    """Save the trained model here; if it already holds a model, load it instead of training."""
    curve: str | None = None
    """Also compute a thinking-budget curve and save its figure here."""
    budgets: tuple[int, ...] = (0, 4, 8, 13, 17, 22, 26, -1)
    """Budgets of the curve; -1 means no budget."""


def training_pairs(args: Args):
    """An endless stream of (prompt, completion) for `args.data`."""
    if args.data == "base":
        yield from reasoning.task_spec(args.task).corpus(args.seed, args.flaw_prob)
        return
    rng = random.Random(args.seed + 1)
    modes = {
        "think": ["default"],
        "no_think": ["no_think"],
        "fused": ["default", "think", "no_think", "no_think"],
        "fused_budget": ["default"] * 3 + ["think"] * 2 + ["no_think"] * 2 + ["cut"] * 3,
    }[args.data]
    for problem in reasoning.train_problems(args.task, args.seed):
        mode = rng.choice(modes)
        if mode == "cut":
            yield problem.prompt, reasoning.cut_solution(problem, rng)
        elif mode == "no_think":
            yield (
                reasoning.mode_prompt(problem.prompt, mode),
                reasoning.think_completion([], problem.answer),
            )
        else:
            yield (
                reasoning.mode_prompt(problem.prompt, mode),
                reasoning.flawed_solution(problem, 0.0, 0.0),
            )


def evaluate(model, tokenizer, rows, budget, samples, steps=None) -> dict[str, float]:
    """Greedy and sampled accuracy, readability and tokens; with `steps` (the steps each row
    needs) also greedy accuracy per number of steps."""
    out = {}
    for name, temperature, n in (("greedy", 0.0, 1), ("sampled", 1.0, samples)):
        batch = sample_completions(
            model,
            tokenizer,
            [r["prompt"] for r in rows],
            n,
            budget,
            temperature,
            torch.Generator().manual_seed(1),
        )
        repeated = [r for r in rows for _ in range(n)]
        scores = [reasoning.score(c, r["answer"]) for c, r in zip(batch.completions, repeated)]
        out[f"{name}_acc"] = sum(scores) / len(scores)
        out[f"{name}_readability"] = sum(map(reasoning.readability, batch.completions)) / len(
            scores
        )
        out[f"{name}_tokens"] = batch.lengths.mean().item()
        if name == "greedy":
            out["greedy_examples"] = batch.completions[:3]
            if steps is not None:
                out["greedy_acc_by_steps"] = {
                    k: round(sum(s for s, j in zip(scores, steps) if j == k) / steps.count(k), 3)
                    for k in sorted(set(steps))
                }
    return out


def budget_curve(model, tokenizer, rows, spec, budgets, digits, steps=None):
    """The greedy thinking-budget curve; with `steps`, computed per number of needed steps
    (returned as {k: curve}) and combined by weight into the overall curve."""
    groups = (
        {None: rows}
        if steps is None
        else {k: [r for r, j in zip(rows, steps) if j == k] for k in sorted(set(steps))}
    )
    curves = {
        k: thinking_budget_curve(
            model, tokenizer, group, spec.score, budgets, max_answer_tokens=digits + 2
        )
        for k, group in groups.items()
    }
    if steps is None:
        return curves[None], {}
    overall = []
    for i, budget in enumerate(budgets):
        point = {"budget": budget}
        for key in ("accuracy", "thinking_tokens", "total_tokens", "forced_frac"):
            point[key] = sum(curves[k][i][key] * len(groups[k]) for k in groups) / len(rows)
        overall.append(point)
    return overall, curves


def main(args: Args) -> None:
    if args.data not in DATA:
        raise SystemExit(f"--data must be one of {DATA}")
    torch.set_num_threads(args.threads)
    spec = reasoning.task_spec(args.task)
    start = time.perf_counter()
    if args.save and (Path(args.save) / "config.json").exists():
        model, tokenizer = load_model(args.save)
    else:
        if args.init:
            model, tokenizer = load_model(args.init)
        else:
            tokenizer = build_char_tokenizer()
            model = build_tiny_model(args.tiny, tokenizer, seed=args.seed)
        pairs = training_pairs(args)
        if args.pool:
            pairs = itertools.cycle(list(itertools.islice(pairs, args.pool)))
        train_next_token(model, tokenizer, pairs, args.steps, args.batch_size, args.lr)
        if args.save:
            save_model(model, tokenizer, args.save)
    train_s = time.perf_counter() - start
    torch.set_num_threads(1)  # small-batch decoding is faster on one thread
    problems = reasoning.held_out_problems(args.task)
    report: dict = {"data": args.data, "digits": args.task.digits, "train_s": round(train_s)}
    modes = ["no_think"] if args.data == "no_think" else ["default"]
    if args.data == "fused":
        modes = ["default", "no_think"]
    steps = [reasoning.thinking_steps(p) for p in problems] if args.task.variable_steps else None
    if steps:
        report["held_out_by_steps"] = {k: steps.count(k) for k in sorted(set(steps))}
    for mode in modes:
        rows = reasoning.rows(problems, mode)
        report[mode] = evaluate(
            model, tokenizer, rows, spec.max_new_tokens, args.eval_samples, steps
        )
    if args.data == "fused":
        report["mode_check"] = think_mode_check(
            model,
            tokenizer,
            reasoning.rows(problems),
            spec.score,
            spec.max_new_tokens,
            modes=("default", "think", "no_think"),
        )
    print(json.dumps(report, indent=1))
    if args.curve:
        budgets = [None if b < 0 else b for b in args.budgets]
        curve, by_steps = budget_curve(
            model, tokenizer, reasoning.rows(problems), spec, budgets, args.task.digits, steps
        )
        for k, part in by_steps.items():
            print(f"problems needing {k} step(s) ({steps.count(k)}):")
            print(format_table(part))
        print("all held-out problems:")
        print(format_table(curve))
        title = f"{args.data} model, {spec.describe}, greedy, {len(problems)} held-out problems"
        plot_thinking_budget(curve, args.curve, title=title)
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main(tyro.cli(Args))
