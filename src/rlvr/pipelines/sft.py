"""`rlvr sft`: fine-tune a model on (prompt, completion) pairs and write a run directory.

The loss and the loop are `rlvr.train.sft` (`train_next_token`); this module chooses the data
(a JSONL file, `rlvr.tasks.jsonl.load_pairs`, or a task's correct worked solutions from
`rlvr.tasks.registry`), the model (a fresh tiny one or a local checkpoint, optionally with LoRA
adapters), the held-out evaluation, and writes config.yaml, metrics.jsonl, loss_curve.png,
summary.json and model/.

- Chat template: each prompt goes through `rlvr.models.chat.prompt_formatter` (a user turn plus
  the assistant's generation prompt when the tokenizer has a template); the completion follows
  as plain text and ends with the tokenizer's EOS, which for chat checkpoints is the end-of-turn
  token. The completion is not passed through the template, so a template that rewrites
  assistant content (Qwen3 drops `<think>` blocks of earlier turns) cannot change what is
  trained.
- LoRA (`lora_rank > 0`, needs `peft`): adapters on every linear layer, merged into the weights
  before saving, so the output is a plain Hugging Face directory.
- Checkpoints (`checkpoints/step-NNNNNN/`, `rlvr.train.checkpoint`) every `checkpoint_every`
  steps, at the end and on SIGINT/SIGTERM; `rlvr sft --resume RUN` continues from the newest
  with the run's config.yaml (other settings refused), bit for bit: weights, AdamW, the LR
  schedule, RNG and the place in the data stream are restored and metrics.jsonl is cut back to
  the checkpoint's step.
- torchrun (`torchrun --nproc-per-node N -m rlvr sft ...`): every rank trains its share of each
  batch on an FSDP2-sharded policy (`rlvr.train.sft.train_next_token`); rank 0 evaluates and
  writes the run directory.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, ClassVar

import torch
import tyro

from rlvr.config import ConfigError, RunPlace, flat_layout_moves, to_dict
from rlvr.devices import Precision, on_device, resolve_precision
from rlvr.models.chat import format_rows, prompt_formatter
from rlvr.models.lora import LoRAConfig, apply_lora, merged
from rlvr.models.tiny import (
    TinyModelConfig,
    build_char_tokenizer,
    build_tiny_model,
    load_model,
    save_model,
)
from rlvr.pipelines.common import model_flag, open_run_directory, start_run_files, user_task
from rlvr.pipelines.resume import resumed_config
from rlvr.report.loggers import check_installed, open_loggers, parse_report_to
from rlvr.report.plots import plot_loss_curve
from rlvr.report.run_dir import RunDirectory, read_jsonl
from rlvr.tasks.jsonl import Pair, load_pairs
from rlvr.tasks.reasoning import ReasoningTaskConfig
from rlvr.tasks.registry import TaskChoice
from rlvr.tasks.spec import TaskSpec
from rlvr.train.checkpoint import latest_checkpoint_step
from rlvr.train.distributed import DistContext, barrier, destroy, init_distributed
from rlvr.train.evaluate import held_out_accuracy
from rlvr.train.sft import Checkpoints, completion_nll, shuffled_epochs, train_next_token

Evaluator = Callable[[torch.nn.Module], dict[str, float]]


@dataclass(frozen=True)
class SFTTask(TaskChoice):
    """`TaskChoice` for `rlvr sft`: no task by default (the pairs are --data's), and no
    reasoning options (the reasoning task trains on its defaults)."""

    name: Annotated[str | None, tyro.conf.arg(name="task")] = None
    """Instead of --data: a task (arithmetic, code, tool, or a dataset file with a "solution"
    column) whose correct worked solutions are the pairs, an endless stream (needs --steps)."""
    columns: str | None = None
    """A dataset file's columns as rlvr's fields (as `rlvr train --columns`), e.g.
    prompt=question,answer=gold,solution=worked."""
    reasoning: Annotated[ReasoningTaskConfig, tyro.conf.Suppress] = field(
        default_factory=ReasoningTaskConfig
    )
    """Not a flag of `rlvr sft`: the reasoning task's defaults."""


@dataclass(frozen=True)
class SFTConfig:
    """`rlvr sft`: fine-tune on prompt/completion pairs; writes a run directory with model/."""

    data: str | None = None
    """A JSONL file of {"prompt": ..., "completion": ...} lines (e.g. `rlvr sample` output)."""
    task: Annotated[SFTTask, tyro.conf.arg(name="")] = field(default_factory=SFTTask)
    """Instead of --data, a task whose worked solutions are the pairs (flags without a
    prefix: --task, --columns, --arithmetic.*); in Python a task name alone
    (`task="arithmetic"`) is `SFTTask("arithmetic")`."""
    model: str = "tiny"
    """A local Hugging Face model directory, or "tiny" for a fresh tiny model (--tiny.*)."""
    run_dir: str = "runs/sft"
    """The run directory to write (config.yaml, metrics.jsonl, loss_curve.png, summary.json,
    model/)."""
    resume: str | None = None
    """A run directory to continue from its newest complete checkpoint with the run's saved
    config.yaml (`rlvr sft --resume runs/NAME`); other settings are refused unless they equal
    the saved ones (--device, --dtype, --threads, --progress and --report-to may change)."""
    checkpoint_every: int = 25
    """Checkpoint every N steps (0: only at the end and when stopped by SIGINT/SIGTERM)."""
    keep_checkpoints: int = 3
    """Keep the newest N checkpoints."""
    report_to: str = "none"
    """Trackers that get metrics.jsonl's scalars and the config as well (as `rlvr train
    --report-to`): none, or comma-separated tensorboard, wandb, trackio."""
    steps: int | None = None
    """Optimizer steps. None: --epochs passes over --data."""
    epochs: int = 1
    """Passes over --data when --steps is None."""
    batch_size: int = 16
    """Pairs per step."""
    lr: float | None = None
    """Peak AdamW learning rate. None: 2e-3 for a fresh tiny model, 2e-4 with LoRA, else 1e-5."""
    warmup_steps: int = 10
    """Linear warm-up steps, then cosine decay to --final-lr-fraction of --lr."""
    final_lr_fraction: float = 0.1
    """Where the cosine decay ends, as a fraction of --lr."""
    grad_clip: float = 1.0
    """Clip the gradient's global norm to this value."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_length: int = 1024
    """Longest prompt + completion in tokens; longer ones are cut on the right and counted."""
    chat_template: bool = True
    """Wrap each prompt as a user turn when the tokenizer has a chat template (real chat
    checkpoints; the tiny tokenizer has none, so then prompt and completion are concatenated)."""
    lora_rank: int = 0
    """> 0: train LoRA adapters of this rank on every linear layer (pip install rlvr[lora]);
    they are merged into the weights before saving."""
    lora_alpha: float | None = None
    """LoRA scaling numerator. None: 2 x --lora-rank."""
    eval_data: str | None = None
    """A JSONL of held-out pairs: their completion-token loss is logged as eval/loss."""
    eval_rows: int = 64
    """With --task: held-out problems graded (greedy) as eval/greedy_acc; 0 turns it off."""
    eval_every: int = 0
    """Evaluate every N steps as well as before and after training (0: before and after)."""
    place: Annotated[RunPlace, tyro.conf.arg(name="")] = field(default_factory=RunPlace)
    """Device, precision, CPU threads, seed (of a fresh model's weights, the data order and
    LoRA's initialisation), the progress bar and --overwrite, without a prefix."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)

    MOVED_KEYS: ClassVar[dict[str, str]] = flat_layout_moves(
        ("device", "dtype", "threads", "seed", "progress", "overwrite"), ("columns", "arithmetic")
    )
    """Keys of the flat layout (config.yaml of runs before `place` and `task` were nested) and
    where they live now; `from_dict` moves them, so those runs resume."""

    def __post_init__(self) -> None:
        if self.task is None or isinstance(self.task, str):  # `SFTConfig(task="arithmetic")`
            object.__setattr__(self, "task", SFTTask(self.task))


def resolve_sft_config(config: SFTConfig, num_examples: int | None) -> SFTConfig:
    """Fill the derived fields (`steps` from epochs, the default `lr`) and check the rest."""
    if (config.data is None) == (config.task.name is None):
        raise ConfigError("rlvr sft: pass exactly one of --data FILE.jsonl and --task NAME")
    if config.steps is None and num_examples is None:
        raise ConfigError("rlvr sft --task streams endless pairs: pass --steps")
    if config.batch_size < 1 or config.max_length < 2 or config.lora_rank < 0:
        raise ConfigError("batch_size must be >= 1, max_length >= 2 and lora_rank >= 0")
    for flag, ok, bound in (
        ("--lr", config.lr is None or config.lr > 0, "> 0"),
        ("--epochs", config.epochs >= 1, ">= 1"),
        ("--warmup-steps", config.warmup_steps >= 0, ">= 0"),
        ("--final-lr-fraction", 0 <= config.final_lr_fraction <= 1, "in [0, 1]"),
        ("--grad-clip", config.grad_clip > 0, "> 0"),
        ("--weight-decay", config.weight_decay >= 0, ">= 0"),
        ("--eval-rows", config.eval_rows >= 0, ">= 0"),
        ("--eval-every", config.eval_every >= 0, ">= 0"),
        ("--threads", config.place.threads >= 1, ">= 1"),
        ("--checkpoint-every", config.checkpoint_every >= 0, ">= 0"),
        ("--keep-checkpoints", config.keep_checkpoints >= 1, ">= 1"),
    ):
        if not ok:
            owner = config.place if flag == "--threads" else config
            value = getattr(owner, flag[2:].replace("-", "_"))
            raise ConfigError(f"rlvr sft: {flag} must be {bound}, got {value}")
    steps = config.steps
    if steps is None:
        steps = math.ceil(config.epochs * num_examples / config.batch_size)
    if steps < 1:
        raise ConfigError(f"rlvr sft: {steps} steps; pass --steps or --epochs of at least 1")
    lr = config.lr
    if lr is None:
        lr = 2e-4 if config.lora_rank > 0 else 2e-3 if config.model == "tiny" else 1e-5
    return replace(config, steps=steps, lr=lr)


def add_lora(model: torch.nn.Module, rank: int, alpha: float | None) -> torch.nn.Module:
    """`model` with LoRA adapters on every linear layer (only they train); needs `peft`."""
    return apply_lora(model, LoRAConfig(rank=rank, alpha=alpha))


SFT_RESUME_FREE = (
    "resume",
    "run_dir",
    "place.overwrite",
    "place.progress",
    "place.device",
    "place.dtype",
    "place.threads",
)
"""`SFTConfig` fields (dotted paths) a resume takes from the call, not from the saved
config.yaml (and `report_to`, kept from the saved config unless the call sets it)."""
DIST_TIMEOUT_S = 600.0
"""How long a collective waits for the other torchrun ranks before failing."""


def resume_sft_config(config: SFTConfig) -> SFTConfig:
    """The saved config of the run `config.resume`, to continue it (`resumed_config`): the
    run directory is the resumed one, `report_to` the saved one unless `config` sets it."""
    assert config.resume is not None
    if config.place.overwrite:
        raise ConfigError("rlvr sft: --resume continues a run; drop --overwrite (or --resume)")
    saved = resumed_config(
        replace(config, report_to="none"), config.resume, SFT_RESUME_FREE, "rlvr sft"
    )
    report_to = config.report_to if config.report_to != "none" else saved.report_to
    return replace(saved, run_dir=str(config.resume), report_to=report_to)


def run_sft(
    config: SFTConfig,
    run_dir: str | Path | None = None,
    evaluate: Evaluator | None = None,
) -> Path:
    """Fine-tune as `config` says; write the run directory and return its `model/` directory.

    `run_dir` overrides `config.run_dir`. `evaluate(model) -> {name: value}` runs before
    training, every `eval_every` steps and after; its values are logged as `eval/<name>`.
    Without one, --eval-data gives eval/loss and --task gives eval/greedy_acc. With
    `config.resume` the run there continues (`resume_sft_config`). Under torchrun every rank
    calls this; rank 0 writes the run directory.
    """
    if config.resume is not None:
        config = resume_sft_config(config)
        run_dir = None
    precision = resolve_precision(config.place.device, config.place.dtype)  # before anything loads
    ctx = init_distributed(precision.device, DIST_TIMEOUT_S)  # torchrun's ranks, if any
    precision = replace(precision, device=ctx.device)
    try:
        with on_device(precision):
            out = _run_sft(config, precision, run_dir, evaluate, ctx)
        barrier(ctx, "the end of the run")  # the ranks leave the group together
        return out
    finally:
        if ctx.sharded:
            destroy()


def _run_sft(
    config: SFTConfig,
    precision: Precision,
    run_dir: str | Path | None,
    evaluate: Evaluator | None,
    ctx: DistContext,
) -> Path:
    """`run_sft` inside its device and precision."""
    start = time.perf_counter()
    task, pairs = None, None
    if config.data is not None:
        pairs = load_pairs(config.data)  # refused before any model loads
    elif config.task.name is not None:
        task = user_task(config.task, seed=config.place.seed)
    config = resolve_sft_config(config, len(pairs) if pairs is not None else None)
    config = replace(config, run_dir=str(run_dir or config.run_dir))
    progress = config.place.progress and ctx.is_main
    config = replace(config, place=replace(config.place, progress=progress))
    eval_pairs = load_pairs(config.eval_data) if config.eval_data else None
    if config.model != "tiny":
        model_flag(config.model, hint=" (or --model tiny: a fresh tiny model)")
    trackers = parse_report_to(config.report_to)  # refused before the run directory exists
    check_installed(trackers)
    path = Path(config.run_dir)
    resume = config.resume is not None
    run = open_run_directory(
        path.parent, path.name, overwrite=config.place.overwrite, resume=resume, ctx=ctx
    )
    if ctx.is_main:
        resume_step = latest_checkpoint_step(run.path / "checkpoints") if resume else None
        run.attach(open_loggers(trackers, run.path, path.name, to_dict(config), resume_step))
    with run:
        return _train(config, precision, run, task, pairs, eval_pairs, evaluate, start, ctx)


def _train(
    config: SFTConfig,
    precision: Precision,
    run: RunDirectory,
    task: TaskSpec | None,
    pairs: list[Pair] | None,
    eval_pairs: list[Pair] | None,
    evaluate: Evaluator | None,
    start: float,
    ctx: DistContext,
) -> Path:
    """`_run_sft` once the run directory is open (and its trackers attached)."""
    resume, main = config.resume is not None, ctx.is_main
    checkpoints = run.path / "checkpoints"
    if main:  # an overwritten run's checkpoints are not this run's
        start_run_files(run, config, resume=resume, stale=(checkpoints,))
    if precision.is_cpu:  # the ranks of one machine share its cores
        torch.set_num_threads(max(1, config.place.threads // ctx.world_size))

    # --- model ---------------------------------------------------------------------------------
    model, tokenizer = _initial_model(config)
    model = model.to(precision.device)
    if evaluate is None:
        evaluate = _default_evaluator(config, task, tokenizer, eval_pairs)
    if not main:
        evaluate = None

    # --- data ----------------------------------------------------------------------------------
    fmt = prompt_formatter(tokenizer, config.chat_template)
    stream = ((fmt(p), c) for p, c in _stream(config, pairs, task))

    # --- train ---------------------------------------------------------------------------------
    log, on_start = _loggers(config, run, model, evaluate, resume)
    train_next_token(
        model,
        tokenizer,
        stream,
        config.steps,
        config.batch_size,
        config.lr,
        warmup_steps=config.warmup_steps,
        weight_decay=config.weight_decay,
        max_length=config.max_length,
        on_step=log if main else None,
        progress=config.place.progress,
        desc="sft",
        grad_clip=config.grad_clip,
        final_lr_fraction=config.final_lr_fraction,
        seed=config.place.seed,
        checkpoints=Checkpoints(
            checkpoints,
            config.checkpoint_every,
            config.keep_checkpoints,
            resume=resume,
            resume_command=f"rlvr sft --resume {run.path}",
        ),
        dist_ctx=ctx,
        on_start=on_start if main else None,
    )
    if not main:
        return run.model_path
    return _report(config, run, model, tokenizer, pairs, start)


def _loggers(
    config: SFTConfig,
    run: RunDirectory,
    model: torch.nn.Module,
    evaluate: Evaluator | None,
    resume: bool,
) -> tuple[Callable[[int, dict[str, float]], None], Callable[[int], None]]:
    """(`on_step`, `on_start`) of the loop on rank 0: the first logs a step's metrics, with the
    evaluation's where it is due; the second cuts the logs back to the step the run continues
    after, and on a fresh start (a resume with no checkpoint yet included) logs the starting
    evaluation as step 0."""

    def log(step: int, metrics: dict[str, float]) -> None:
        every = config.eval_every and step % config.eval_every == 0
        due = step == 0 or step == config.steps or every
        if evaluate is not None and due:
            metrics = {**metrics, **{f"eval/{k}": v for k, v in evaluate(model).items()}}
        run.log_metrics({"step": step, **metrics})

    def on_start(step: int) -> None:
        if step > 0 or resume:  # resumed: the steps after the checkpoint come again
            run.truncate_logs(after_step=step if step > 0 else -1)
        if step == 0 and evaluate is not None:
            log(0, {})

    return log, on_start


def _report(
    config: SFTConfig,
    run: RunDirectory,
    model: torch.nn.Module,
    tokenizer,
    pairs: list[Pair] | None,
    start: float,
) -> Path:
    """Save the model (LoRA merged), the loss curve and summary.json, from metrics.jsonl (a
    resumed run's too); return the `model/` directory."""
    records = read_jsonl(run.metrics_path)
    losses = [r["loss"] for r in records if "loss" in r]
    model = merged(model)  # LoRA: adapters folded in, a plain Hugging Face model
    save_model(model, tokenizer, run.model_path)
    plot_loss_curve(records, run.path / "loss_curve.png")
    summary = {
        "model_dir": str(run.model_path),
        "init_model": config.model,
        "examples": len(pairs) if pairs is not None else None,
        **_training_summary(config, losses, records),
        "wall_seconds": time.perf_counter() - start,
    }
    run.write_summary(summary)
    if config.place.progress:
        print(f"[rlvr] sft: {json.dumps({k: summary[k] for k in _SHOWN})}", flush=True)
    return run.model_path


_SHOWN = (
    "steps",
    "first_loss",
    "last_loss",
    "truncated_sequences",
    "eval_before",
    "eval_after",
    "model_dir",
)


def _initial_model(config: SFTConfig) -> tuple[torch.nn.Module, Any]:
    """(model, tokenizer) to fine-tune: a fresh tiny model or `config.model`'s checkpoint, with
    LoRA adapters when `config.lora_rank > 0`; torch's RNG seeded by `config.place.seed`."""
    if config.model == "tiny":
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(config.tiny, tokenizer, seed=config.place.seed)
    else:
        model, tokenizer = load_model(config.model)
    torch.manual_seed(config.place.seed)
    if config.lora_rank > 0:
        model = add_lora(model, config.lora_rank, config.lora_alpha)
    return model, tokenizer


def _training_summary(
    config: SFTConfig, losses: list[float], records: list[dict[str, Any]]
) -> dict[str, Any]:
    """The summary's training fields: steps, losses, tokens, truncation and the evaluations
    before and after."""
    evals = [r for r in records if any(k.startswith("eval/") for k in r)]
    tail = losses[-max(1, len(losses) // 10) :]
    return {
        "steps": config.steps,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "mean_loss_last_tenth": sum(tail) / len(tail) if losses else None,
        "completion_tokens": int(sum(r.get("tokens/completion", 0) for r in records)),
        "truncated_sequences": int(sum(r.get("data/truncated", 0) for r in records)),
        "eval_before": _evals_of(evals[0]) if evals else {},
        "eval_after": _evals_of(evals[-1]) if evals else {},
        "lora_rank": config.lora_rank,
    }


def _evals_of(record: dict[str, Any]) -> dict[str, float]:
    """The `eval/` values of a metrics record, without the prefix."""
    return {k.removeprefix("eval/"): v for k, v in record.items() if k.startswith("eval/")}


def _default_evaluator(
    config: SFTConfig, task: TaskSpec | None, tokenizer, eval_pairs: list[Pair] | None
) -> Evaluator | None:
    """eval/loss on --eval-data and eval/greedy_acc on the task's held-out rows, if asked for."""
    rows = task.held_out_rows()[: config.eval_rows] if task is not None else []
    if not rows and not eval_pairs:
        return None
    fmt = prompt_formatter(tokenizer, config.chat_template)
    formatted = [(fmt(p), c) for p, c in eval_pairs or []]
    prompted = format_rows(tokenizer, rows, config.chat_template)

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        """Held-out loss and/or greedy accuracy of `model`."""
        out = {}
        if formatted:
            out["loss"] = completion_nll(
                model, tokenizer, formatted, config.batch_size, config.max_length
            )
        if prompted:
            out["greedy_acc"] = held_out_accuracy(
                model, tokenizer, prompted, task.score, task.max_new_tokens
            )
        return out

    return evaluate


def _stream(config: SFTConfig, pairs: list[Pair] | None, task: TaskSpec | None) -> Iterator[Pair]:
    """The training pairs: seeded epochs over `pairs`, or the task's correct worked solutions
    (its corpus at flaw_prob 0)."""
    if pairs is not None:
        return shuffled_epochs(pairs, config.place.seed)
    return task.corpus(config.place.seed, 0.0)
