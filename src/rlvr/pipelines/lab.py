"""The lab: R1-Zero in miniature on a laptop CPU.

1. Build a base model that can *sometimes* add: a ~1 M-parameter model trained by next-token
   prediction on worked solutions, many of which drop a carry. Cached by a hash of its config
   (`rlvr.pipelines.base_model`, the cache the pipelines' `base` stage shares).
2. GRPO on the verifiable reward (the strict math verifier) from that base.
3. Report: metrics, samples, reward curve, summary, final model.

RL adds no knowledge here; it selects the correct procedure that the base shows only sometimes,
which is the module's claim about R1-Zero.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from rlvr.models.tiny import TinyModelConfig, count_parameters, load_model, save_model
from rlvr.pipelines.base_model import (
    BaseConfig,
    base_model_dir,
    cached_base_model,
    resolved_hedge_prob,
)
from rlvr.report.plots import plot_reward_curve
from rlvr.report.run_dir import RunDirectory
from rlvr.report.step_time import format_step_time, step_time_split
from rlvr.tasks.arithmetic import ArithmeticTaskConfig
from rlvr.tasks.reasoning import ReasoningTaskConfig
from rlvr.tasks.registry import build_task, training_reward
from rlvr.tasks.spec import TaskSpec
from rlvr.train.config import GRPOConfig, check_grpo_config
from rlvr.train.evaluate import held_out_accuracy
from rlvr.train.grpo import train_grpo


@dataclass(frozen=True)
class LabConfig:
    """`rlvr lab` / `rlvr train`: build (or reuse) a base model, run RL on a task, report."""

    run_name: str = "lab"
    """Name of the run directory under --runs-dir."""
    runs_dir: str = "runs"
    """Where run directories are created."""
    overwrite: bool = False
    """Replace an existing run directory of the same name."""
    resume: bool = False
    """Continue the run's newest complete checkpoint with the run's saved config.yaml:
    `rlvr lab --resume`, `rlvr train --resume runs/NAME`."""
    model: str | None = None
    """A local Hugging Face model directory to start from instead of the lab's base model."""
    seed: int = 0
    """Seed of the RL run (sampling, data order)."""
    threads: int = 2
    """CPU threads for the update (torch.set_num_threads)."""
    cache_dir: str | None = None
    """Where base models are cached (default: $RLVR_CACHE or ~/.cache/rlvr)."""
    eval_samples: int = 8
    """Sampled completions per held-out problem for the start and end pass@1."""
    progress: bool = True
    """Show progress bars."""
    verifier: str = "strict"
    """Training reward: strict (the math verifier) or weak (substring match, gameable: a
    demonstration of reward hacking). Held-out accuracy and the monitor always use strict."""
    recipe: str | None = None
    """A named recipe (grpo, rloo, dr_grpo, dapo, gspo, reinforce++, ppo) whose switches
    replace the GRPO defaults; --grpo.* flags and --set still override it."""
    set: tuple[str, ...] = ()
    """Overrides of GRPO switches as key=value (e.g. --set epsilon_high=0.28 beta=0.01)."""
    task: str = "arithmetic"
    """The task: arithmetic (math verifier), reasoning (addition with a <think> block and
    mixed notations, the pipelines' task), code (sandboxed asserts), tool (tool calls), or a
    FILE.jsonl of your own rows (prompt, answer[, solution]), graded by the math verifier."""
    arithmetic: ArithmeticTaskConfig = field(default_factory=ArithmeticTaskConfig)
    reasoning: ReasoningTaskConfig = field(default_factory=ReasoningTaskConfig)
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    base: BaseConfig = field(default_factory=BaseConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)


def lab_task(config: LabConfig) -> TaskSpec:
    """The TaskSpec of `config.task`, from the task registry."""
    return build_task(
        config.task,
        config.arithmetic,
        config.reasoning,
        hedge_prob=effective_hedge_prob(config),
        seed=config.seed,
    )


def effective_hedge_prob(config: LabConfig) -> float:
    """The base corpus's hedge probability: `--base.hedge-prob`, else by `--verifier`."""
    return resolved_hedge_prob(config.base.hedge_prob, config.verifier)


def _base_settings(config: LabConfig) -> tuple[object | None, BaseConfig]:
    """(the task's config, the base's settings with the hedge resolved): with the task name and
    the model shape, what keys the lab's base model in the cache."""
    task_config = {"arithmetic": config.arithmetic, "reasoning": config.reasoning}.get(config.task)
    return task_config, dataclasses.replace(config.base, hedge_prob=effective_hedge_prob(config))


def lab_base_dir(config: LabConfig) -> Path:
    """The cache directory of the lab's base model (present or not)."""
    task_config, base = _base_settings(config)
    return base_model_dir(config.task, task_config, config.tiny, base, config.cache_dir)


def build_base_model(config: LabConfig, task: TaskSpec) -> tuple[Path, bool]:
    """Return (directory of the base model, whether it came from the cache)."""
    task_config, base = _base_settings(config)
    return cached_base_model(
        config.task, task, task_config, config.tiny, base, config.cache_dir, config.progress
    )


def run_lab(config: LabConfig) -> dict:
    """The whole lab; returns the summary written to summary.json."""
    task = lab_task(config)
    if config.grpo.max_new_tokens is None:
        config = dataclasses.replace(
            config, grpo=dataclasses.replace(config.grpo, max_new_tokens=task.max_new_tokens)
        )
    check_grpo_config(config.grpo)
    if config.grpo.max_new_tokens < task.min_new_tokens:
        raise ValueError(
            f"grpo.max_new_tokens={config.grpo.max_new_tokens} is below the longest correct "
            f"completion of this task ({task.min_new_tokens} tokens with EOS)"
        )
    reward_fn = training_reward(config.verifier, task)
    torch.set_num_threads(config.threads)
    run = RunDirectory(
        config.runs_dir, config.run_name, overwrite=config.overwrite, resume=config.resume
    )
    if config.resume:
        check_same_config(run, config)
    run.write_config(dataclasses.replace(config, resume=False, overwrite=False))
    start = time.perf_counter()

    # --- base model ------------------------------------------------------------------------
    if config.model is None:
        base_dir, cached = build_base_model(config, task)
        _say(config, f"base model: {base_dir} ({'cached' if cached else 'trained'})")
    else:
        base_dir = Path(config.model)
    model, tokenizer = load_model(base_dir)
    base_seconds = time.perf_counter() - start
    _say(config, f"{count_parameters(model):,} parameters, base ready in {base_seconds:.0f} s")

    # --- evaluation on the held-out split -------------------------------------------------
    held_out = task.held_out_rows()
    budget = config.grpo.max_new_tokens

    def evaluate(m: torch.nn.Module, sampled_samples: int = 1) -> dict[str, float]:
        """Held-out accuracy of `m`: greedy, and sampled at the training temperature."""
        return {
            "greedy_acc": held_out_accuracy(m, tokenizer, held_out, task.score, budget),
            "sampled_acc": held_out_accuracy(
                m,
                tokenizer,
                held_out,
                task.score,
                budget,
                temperature=config.grpo.temperature,
                num_samples=sampled_samples,
                seed=1,
            ),
        }

    base_eval = evaluate(model, config.eval_samples)
    _say(
        config,
        f"base held-out accuracy: greedy {base_eval['greedy_acc']:.3f}, "
        f"sampled {base_eval['sampled_acc']:.3f}",
    )

    # --- GRPO ------------------------------------------------------------------------------
    train_rows = task.train_rows(config.seed + 10_000)
    rl_start = time.perf_counter()
    records = train_grpo(
        model,
        tokenizer,
        train_rows,
        [reward_fn],
        config.grpo,
        run,
        evaluate,
        seed=config.seed,
        progress=config.progress,
        strict_reward_fn=task.reward_fn,
        resume=config.resume,
    )
    rl_seconds = time.perf_counter() - rl_start

    # --- report ----------------------------------------------------------------------------
    final_eval = evaluate(model, config.eval_samples)
    save_model(model, tokenizer, run.model_path)
    title = _plot_title(task.describe, base_eval, final_eval)
    plot_reward_curve(records, run.path / "reward_curve.png", title=title)
    steps = [r for r in records if "reward/mean" in r]
    summary = {
        "base_model": str(base_dir),
        "base_greedy_acc": base_eval["greedy_acc"],
        "base_sampled_acc": base_eval["sampled_acc"],
        "final_greedy_acc": final_eval["greedy_acc"],
        "final_sampled_acc": final_eval["sampled_acc"],
        "sampled_acc_samples_per_problem": config.eval_samples,
        "held_out_problems": len(held_out),
        "steps": len(steps),
        "first_step_reward": steps[0]["reward/mean"] if steps else None,
        "last_step_reward": steps[-1]["reward/mean"] if steps else None,
        "base_seconds": base_seconds,
        "rl_seconds": rl_seconds,
        "wall_seconds": time.perf_counter() - start,
        "median_step_seconds": _median([r["time/step_s"] for r in steps]),
        "step_time": step_time_split(records),
        "verifier": config.verifier,
        "hacking_monitor": _monitor_summary(records),
    }
    run.write_summary(summary)
    if summary["hacking_monitor"]["warning"]:
        print(f"[rlvr] WARNING: {summary['hacking_monitor']['warning']}", file=sys.stderr)
    _say(
        config,
        f"held-out accuracy: greedy {summary['base_greedy_acc']:.3f} -> "
        f"{summary['final_greedy_acc']:.3f}, sampled {summary['base_sampled_acc']:.3f} -> "
        f"{summary['final_sampled_acc']:.3f} in {summary['wall_seconds']:.0f} s; "
        f"see {run.path}/",
    )
    _say(config, format_step_time(summary["step_time"]))
    return summary


def check_same_config(run: RunDirectory, config: LabConfig) -> None:
    """Refuse to resume a run with settings other than those it was started with."""
    saved_path = run.path / "config.yaml"
    if not saved_path.exists():
        raise FileNotFoundError(f"{run.path} has no config.yaml: nothing to resume")
    saved = yaml.safe_load(saved_path.read_text())
    current = json.loads(json.dumps(dataclasses.asdict(config)))
    ignored = {"resume", "overwrite", "progress"}
    diff = sorted(k for k in current if k not in ignored and saved.get(k) != current[k])
    if diff:
        raise ValueError(
            f"--resume: the settings differ from those {run.path} was started with, in: "
            f"{', '.join(diff)}. Resume with the same flags (see {saved_path})."
        )


def _monitor_summary(records: list[dict]) -> dict:
    """The summary's account of the hacking monitor: checks, flagged steps, largest gap."""
    checks = [r for r in records if "monitor/gap" in r]
    flagged = [r["step"] for r in checks if r["monitor/flagged"]]
    return {
        "checks": len(checks),
        "flagged_steps": flagged,
        "max_gap": max((r["monitor/gap"] for r in checks), default=None),
        "warning": (
            "training reward diverged from strict accuracy: the reward is being gamed"
            if flagged
            else None
        ),
    }


def _plot_title(describe: str, base: dict, final: dict) -> str:
    """The reward curve's title: the task and held-out accuracy before -> after."""
    return (
        f"RL on {describe}: greedy {base['greedy_acc']:.2f} -> {final['greedy_acc']:.2f}, "
        f"sampled {base['sampled_acc']:.2f} -> {final['sampled_acc']:.2f}"
    )


def _median(values: list[float]) -> float | None:
    """The upper median of `values` (None when there are none)."""
    return sorted(values)[len(values) // 2] if values else None


def _say(config: LabConfig, message: str) -> None:
    """Print `message` unless progress output is off."""
    if config.progress:
        print(f"[rlvr] {message}", flush=True)
