"""`rlvr eval`: a local model's held-out accuracy on a task (mean@n and pass@k, each with a 95%
interval), or its thinking-budget curve (accuracy and tokens per budget, with a figure).

The sampling and the curve are `rlvr.train.evaluate` (`held_out_samples`,
`thinking_budget_curve`); this module checks the config, picks the rows (a task's held-out rows
or every row of a dataset file), loads the model and prints the result.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

import tyro

from rlvr.config import ConfigError, RunPlace, flat_layout_moves
from rlvr.devices import on_device, resolve_precision
from rlvr.models.chat import format_rows
from rlvr.models.tiny import load_model
from rlvr.pipelines.common import few_shot_examples, model_flag, user_task
from rlvr.report.plots import format_table, plot_thinking_budget
from rlvr.report.stats import sample_metrics
from rlvr.tasks.dataset_files import all_rows, is_data_file
from rlvr.tasks.reasoning import MODES, set_mode
from rlvr.tasks.registry import TaskChoice
from rlvr.tasks.spec import TaskSpec
from rlvr.train.evaluate import held_out_samples, thinking_budget_curve


@dataclass(frozen=True)
class EvalPlace(RunPlace):
    """`RunPlace` for `rlvr eval`: device, dtype and the sampling seed; it writes no run
    directory and shows no progress bars, and its threads are torch's default, so those three
    are hidden and unused."""

    threads: Annotated[int, tyro.conf.Suppress] = 2
    """Unused by `rlvr eval`."""
    progress: Annotated[bool, tyro.conf.Suppress] = True
    """Unused by `rlvr eval`."""
    overwrite: Annotated[bool, tyro.conf.Suppress] = False
    """Unused by `rlvr eval` (--thinking-budget replaces its --out figure)."""


@dataclass(frozen=True)
class EvalConfig:
    """`rlvr eval`: held-out accuracy of a local model on a task."""

    model: str
    """A local Hugging Face model directory (for example runs/lab/model)."""
    task: Annotated[TaskChoice, tyro.conf.arg(name="")] = field(default_factory=TaskChoice)
    """The task (flags without a prefix, as `rlvr train`'s): a named task or reasoning_gym:NAME
    (its held-out rows), or a dataset file (every row of it is evaluated)."""
    max_new_tokens: int | None = None
    """Completion budget in tokens (None: the task's own)."""
    temperature: float = 0.0
    """0 is greedy; > 0 samples at that temperature."""
    num_samples: int = 1
    """Completions per problem (n; needs --temperature > 0 when above 1): prints mean@n and
    pass@k (the unbiased estimator) for k = 1, 2, 4, ... up to n, each with a 95% interval
    (Wilson for one greedy sample, else bootstrap over problems)."""
    place: Annotated[EvalPlace, tyro.conf.arg(name="")] = field(default_factory=EvalPlace)
    """Device, precision and the sampling seed (flags without a prefix)."""
    chat_template: bool = True
    """Put each prompt through the model's chat template when its tokenizer has one (as
    `rlvr train` does)."""
    system_prompt: str | None = None
    """A system message in front of every templated prompt."""
    few_shot: int = 0
    """With a chat template: this many worked examples as earlier turns (as `rlvr train
    --few-shot`; the same examples, so a trained model is evaluated as it was trained)."""
    mode: str = "default"
    """reasoning task: the thinking mode of the prompts (default, think or no_think)."""
    thinking_budget: str | None = None
    """reasoning task: comma-separated budgets in thinking tokens, e.g. 0,8,16,32,none; prints
    accuracy and tokens per budget and writes the curve's figure to --out."""
    out: str = "thinking_budget.png"
    """Where --thinking-budget writes its figure (a .json of the curve goes beside it)."""

    MOVED_KEYS: ClassVar[dict[str, str]] = flat_layout_moves(
        ("device", "dtype", "seed"), ("columns", "arithmetic", "reasoning")
    )
    """Keys of the flat layout and where they live now (`from_dict` moves them)."""


def run_eval(config: EvalConfig) -> dict[str, Any] | list[dict[str, Any]]:
    """`rlvr eval`: print a model's held-out accuracy (or its thinking-budget curve); return
    the printed result (the curve's rows with --thinking-budget)."""
    budgets = check_eval_config(config)
    precision = resolve_precision(config.place.device, config.place.dtype)
    task = user_task(config.task)
    rows = eval_rows(config, task)  # a file's rows read (and checked) before the model loads
    model_flag(config.model)
    model, tokenizer = load_model(config.model, device=precision.device)
    with on_device(precision):
        if budgets is not None:
            return thinking_budget_report(config, model, tokenizer, rows, task, budgets)
        return held_out_report(config, model, tokenizer, task, rows)


def check_eval_config(config: EvalConfig) -> list[int | None] | None:
    """Refuse `rlvr eval`'s impossible settings before anything loads (a `ConfigError` naming
    the flag); returns the --thinking-budget budgets (None without one)."""
    if config.num_samples < 1:
        raise ConfigError(f"--num-samples must be at least 1, got {config.num_samples}")
    if config.temperature < 0:
        raise ConfigError(f"--temperature must be >= 0 (0 is greedy), got {config.temperature}")
    if config.num_samples > 1 and config.temperature == 0:
        raise ConfigError(
            f"--num-samples {config.num_samples} with greedy decoding repeats one completion; "
            "pass --temperature above 0 (e.g. 1.0) to sample"
        )
    if config.few_shot < 0:
        raise ConfigError(f"--few-shot must be >= 0, got {config.few_shot}")
    if config.mode not in MODES:
        raise ConfigError(f"--mode must be one of {', '.join(MODES)}, got {config.mode!r}")
    if config.thinking_budget is None:
        return None
    if config.task.name != "reasoning":
        raise ConfigError("--thinking-budget needs --task reasoning (a <think> task)")
    try:
        return [
            None if b.strip().lower() == "none" else int(b)
            for b in config.thinking_budget.split(",")
        ]
    except ValueError:
        raise ConfigError(
            f"--thinking-budget expects numbers and 'none' separated by commas, got "
            f"{config.thinking_budget!r}"
        ) from None


def eval_rows(config: EvalConfig, task: TaskSpec) -> list[dict]:
    """The rows `rlvr eval` grades: the task's held-out rows, or every row of a dataset file
    (a file given to an evaluation is a test set), in --mode for the reasoning task."""
    rows = task.held_out_rows()
    if is_data_file(config.task.name):
        rows = all_rows(config.task.name, config.task.columns)
    if config.task.name == "reasoning":
        rows = [{**r, "prompt": set_mode(r["prompt"], config.mode)} for r in rows]
    return rows


def held_out_report(
    config: EvalConfig, model, tokenizer, task: TaskSpec, rows: list[dict]
) -> dict[str, Any]:
    """`rlvr eval` once the model is loaded: accuracy, mean@n and pass@k on `rows`, printed as
    one JSON line (stdout) and one line of intervals (stderr); returns the JSON's dict."""
    examples = few_shot_examples(task, config.few_shot)
    rows = format_rows(tokenizer, rows, config.chat_template, config.system_prompt, examples)
    samples = held_out_samples(
        model,
        tokenizer,
        rows,
        task.score,
        config.max_new_tokens or task.max_new_tokens,
        temperature=config.temperature,
        num_samples=config.num_samples,
        seed=config.place.seed,
    )
    n = config.num_samples
    metrics = sample_metrics(samples.scores, ks=pass_ks(n))
    mode = "greedy" if config.temperature == 0 else f"sampled at T={config.temperature}"
    result = {
        "model": config.model,
        "task": config.task.name,
        "mode": mode,
        "problems": len(rows),
        "samples_per_problem": n,
        "accuracy": metrics[f"mean@{n}"],
        f"mean@{n}": metrics[f"mean@{n}"],
        **{f"pass@{k}": v for k, v in metrics["pass@k"].items()},
        "ci95": metrics["ci95"] | {"accuracy": metrics["ci95"][f"mean@{n}"]},
    }
    print(json.dumps(result))
    shown = [f"mean@{n}"] + [f"pass@{k}" for k in metrics["pass@k"]]
    parts = [
        f"{name} {result[name]:.3f} [{result['ci95'][name][0]:.3f}, {result['ci95'][name][1]:.3f}]"
        for name in dict.fromkeys(shown)
    ]
    print(
        f"[rlvr] {config.task.name}, {len(rows)} problems, {mode}, 95% intervals: "
        + ", ".join(parts),
        file=sys.stderr,
    )
    return result


def pass_ks(n: int) -> list[int]:
    """The k of pass@k that `rlvr eval` reports for n samples per problem: 1, the powers of
    two below n, and n."""
    return sorted({1, n, *(2**i for i in range(1, n.bit_length()) if 2**i < n)})


def thinking_budget_report(
    config: EvalConfig,
    model,
    tokenizer,
    rows: list[dict],
    task: TaskSpec,
    budgets: list[int | None],
) -> list[dict[str, Any]]:
    """`rlvr eval --thinking-budget`: print the curve's table, write its figure and json;
    returns the curve."""
    curve = thinking_budget_curve(
        model,
        tokenizer,
        rows,
        task.score,
        budgets=budgets,
        temperature=config.temperature,
        num_samples=config.num_samples,
        seed=config.place.seed,
    )
    print(format_table(curve))
    figure = plot_thinking_budget(curve, config.out, title=f"thinking budget: {config.model}")
    Path(figure).with_suffix(".json").write_text(json.dumps(curve, indent=2))
    print(f"[rlvr] figure: {figure}")
    return curve
