"""Supervised fine-tuning: next-token loss on (prompt, completion) pairs, completion tokens only.

One loop, `train_next_token`, serves both uses: the lab's "pretraining" of its base model on a
flawed corpus, and `rlvr sft` (`run_sft`): cold-start SFT, SFT on rejection-sampled completions
(`rlvr sample`), distillation. Pairs come from a JSONL file (`{"prompt", "completion"}` per line)
or from a task's correct worked solutions.

Choices, and where they differ from common practice:

- The loss is a token mean over the batch: the divisor is the number of completion tokens in the
  batch (EOS included; prompt and padding excluded), so a long completion weighs more than a
  short one (as TRL's SFTTrainer and torchtune do; not a mean of per-sequence means).
- A sequence longer than `max_length` is cut on the right: the end of its completion (EOS with
  it) is not trained on. Cut sequences are counted per step (`data/truncated`) and in the
  summary, never silently dropped.
- Chat template: the prompt becomes a user message followed by the assistant's generation prompt
  (`apply_chat_template(..., add_generation_prompt=True)`); the completion follows as plain
  text and ends with the tokenizer's EOS, which for chat checkpoints is the end-of-turn token.
  The completion is not passed through the template, so a template that rewrites assistant
  content (Qwen3 drops `<think>` blocks of earlier turns) cannot change what is trained.
- LoRA (`lora_rank > 0`, needs `peft`): adapters on every linear layer, merged into the weights
  before saving, so the output is a plain Hugging Face directory.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from rlvr.models.tiny import TinyModelConfig
from rlvr.tasks.arithmetic import ArithmeticTaskConfig

IGNORE_INDEX = -100
Pair = tuple[str, str]  # (prompt, completion)


# --- batches and the loss ----------------------------------------------------------------------


def format_prompt(tokenizer, prompt: str, chat_template: bool) -> str:
    """The prompt as the model sees it: a user turn plus the assistant's generation prompt when
    `chat_template` is on and the tokenizer has a template; otherwise unchanged."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return prompt


def supervised_batch(
    tokenizer, prompts: list[str], completions: list[str], max_length: int | None = None
) -> dict[str, torch.Tensor]:
    """Right-padded prompt + completion + EOS, as `input_ids`, `attention_mask`, `labels` [B, L]
    and `truncated` [B] (bool: the sequence was longer than `max_length` and was cut).

    Labels are IGNORE_INDEX on prompt tokens and padding, so the loss covers the completion and
    its EOS only. Prompt and completion are tokenized separately, the prompt as the sampler
    tokenizes it (with the tokenizer's added special tokens, e.g. a BOS), so training sees the
    token boundary that generation produces.
    """
    eos = tokenizer.eos_token_id
    sequences, labels, truncated = [], [], []
    for prompt, completion in zip(prompts, completions, strict=True):
        p = tokenizer(prompt)["input_ids"]
        c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [eos]
        seq, lab = p + c, [IGNORE_INDEX] * len(p) + c
        truncated.append(max_length is not None and len(seq) > max_length)
        sequences.append(seq[:max_length])
        labels.append(lab[:max_length])
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), tokenizer.pad_token_id, dtype=torch.long)
    label_ids = torch.full((len(sequences), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, (s, lab) in enumerate(zip(sequences, labels)):
        input_ids[i, : len(s)] = torch.tensor(s)
        label_ids[i, : len(lab)] = torch.tensor(lab)
        attention_mask[i, : len(s)] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "labels": label_ids,
        "truncated": torch.tensor(truncated, dtype=torch.bool),
    }


def completion_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(mean next-token cross-entropy, number of tokens it averages over).

    logits [B, L, V] (position t predicts token t+1), labels [B, L] with IGNORE_INDEX on tokens
    not trained on. Divisor: the number of labelled targets `labels[:, 1:] != IGNORE_INDEX`, i.e.
    the batch's completion tokens including EOS (at least 1, so a batch with none gives 0).
    """
    targets = labels[:, 1:]
    num_tokens = int((targets != IGNORE_INDEX).sum())
    total = F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    return total / max(1, num_tokens), num_tokens


def pairs_loss(
    model: torch.nn.Module, tokenizer, pairs: list[Pair], max_length: int | None = None
) -> tuple[torch.Tensor, int, int]:
    """(`completion_loss` of one forward pass over `pairs`, its divisor, sequences truncated)."""
    inputs = supervised_batch(tokenizer, *zip(*pairs), max_length=max_length)
    logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
    loss, num_tokens = completion_loss(logits, inputs["labels"])
    return loss, num_tokens, int(inputs["truncated"].sum())


@torch.no_grad()
def completion_nll(
    model: torch.nn.Module,
    tokenizer,
    pairs: list[Pair],
    batch_size: int = 32,
    max_length: int | None = None,
) -> float:
    """Mean negative log-likelihood per completion token (EOS included) over all `pairs`; the
    divisor is their total number of completion tokens (held-out loss)."""
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        loss, n, _ = pairs_loss(model, tokenizer, chunk, max_length)
        total, tokens = total + loss.item() * n, tokens + n
    model.train(was_training)
    return total / max(1, tokens)


# --- the loop ----------------------------------------------------------------------------------


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, final_fraction: float) -> float:
    """Learning-rate multiplier: linear warm-up, then cosine decay to `final_fraction`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return final_fraction + (1 - final_fraction) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, progress))
    )


def train_next_token(
    model: torch.nn.Module,
    tokenizer,
    pairs: Iterator[Pair],
    steps: int,
    batch_size: int,
    lr: float,
    warmup_steps: int = 10,
    weight_decay: float = 0.0,
    max_length: int | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    progress: bool = True,
    desc: str = "base model",
) -> list[float]:
    """AdamW on the completion-token cross-entropy (`completion_loss`); returns every step's loss.

    Each step's loss is the mean over the completion tokens of its batch (EOS included, prompt
    and padding excluded): the divisor is the batch's number of completion tokens. Only
    parameters with `requires_grad` are trained (LoRA adapters, when the model has them).
    `on_step(step, metrics)` gets the 1-based step and `loss`, `lr`, `grad_norm`,
    `tokens/completion` and `data/truncated` (sequences cut at `max_length` in this batch).
    """
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine(s, steps, warmup_steps, final_fraction=0.1)
    )
    losses = []
    bar = tqdm(range(1, steps + 1), desc=desc, disable=not progress, leave=False)
    for step in bar:
        batch = list(itertools.islice(pairs, batch_size))
        if not batch:
            raise ValueError(f"the training pairs ran out at step {step} of {steps}")
        loss, num_tokens, truncated = pairs_loss(model, tokenizer, batch, max_length)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        current_lr = schedule.get_last_lr()[0]
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if on_step is not None:
            on_step(step, {"loss": losses[-1], "lr": current_lr, "grad_norm": float(grad_norm),
                           "tokens/completion": float(num_tokens),
                           "data/truncated": float(truncated)})  # fmt: skip
    model.eval()
    return losses


# --- data --------------------------------------------------------------------------------------


def load_pairs(path: str | Path) -> list[Pair]:
    """(prompt, completion) pairs of a JSONL file, one `{"prompt", "completion"}` object a line.

    Malformed lines are refused with file, line and field (`rlvr.tasks.jsonl.load_rows`); a
    completion must also be a non-empty string. Other fields (e.g. `reward`) are ignored.
    """
    from rlvr.tasks.jsonl import JSONLError, load_rows

    path = Path(path)
    rows = load_rows(path, required=("prompt", "completion"))
    # load_rows has checked the file is UTF-8; its line numbers count blank lines too
    lines = [n for n, text in enumerate(path.read_text("utf-8-sig").split("\n"), 1) if text.strip()]
    for row, number in zip(rows, lines, strict=True):
        completion = row["completion"]
        if not isinstance(completion, str):
            kind = type(completion).__name__
            raise JSONLError(path, f"field 'completion' must be a string, not {kind}", number,
                             "completion")  # fmt: skip
        if not completion.strip():
            raise JSONLError(path, "field 'completion' is empty", number, "completion")
    return [(row["prompt"], row["completion"]) for row in rows]


def shuffled_epochs(pairs: list[Pair], seed: int) -> Iterator[Pair]:
    """Endless passes over `pairs`, each in a fresh seeded order."""
    rng = random.Random(seed)
    while True:
        order = pairs[:]
        rng.shuffle(order)
        yield from order


# --- `rlvr sft` --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SFTConfig:
    """`rlvr sft`: fine-tune on prompt/completion pairs; writes a run directory with model/."""

    data: str | None = None
    """A JSONL file of {"prompt": ..., "completion": ...} lines (e.g. `rlvr sample` output)."""
    task: str | None = None
    """Instead of --data: a task (arithmetic, code, tool, or FILE.jsonl with a "solution"
    column) whose correct worked solutions are the pairs, an endless stream (needs --steps)."""
    model: str = "tiny"
    """A local Hugging Face model directory, or "tiny" for a fresh tiny model (--tiny.*)."""
    run_dir: str = "runs/sft"
    """The run directory to write (config.yaml, metrics.jsonl, loss_curve.png, summary.json,
    model/)."""
    overwrite: bool = False
    """Replace an existing run directory."""
    steps: int | None = None
    """Optimizer steps. None: --epochs passes over --data."""
    epochs: int = 1
    """Passes over --data when --steps is None."""
    batch_size: int = 16
    """Pairs per step."""
    lr: float | None = None
    """Peak AdamW learning rate. None: 2e-3 for a fresh tiny model, 2e-4 with LoRA, else 1e-5."""
    warmup_steps: int = 10
    """Linear warm-up steps, then cosine decay to a tenth of --lr."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_length: int = 1024
    """Longest prompt + completion in tokens; longer ones are cut on the right and counted."""
    seed: int = 0
    """Seed of a fresh model's weights, the data order and LoRA's initialisation."""
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
    threads: int = 2
    """CPU threads (torch.set_num_threads)."""
    progress: bool = True
    """Show a progress bar."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    arithmetic: ArithmeticTaskConfig = field(default_factory=ArithmeticTaskConfig)


def resolve_sft_config(config: SFTConfig, num_examples: int | None) -> SFTConfig:
    """Fill the derived fields (`steps` from epochs, the default `lr`) and check the rest."""
    if (config.data is None) == (config.task is None):
        raise ValueError("rlvr sft: pass exactly one of --data FILE.jsonl and --task NAME")
    if config.steps is None and num_examples is None:
        raise ValueError("rlvr sft --task streams endless pairs: pass --steps")
    if config.batch_size < 1 or config.max_length < 2 or config.lora_rank < 0:
        raise ValueError("batch_size must be >= 1, max_length >= 2 and lora_rank >= 0")
    steps = config.steps
    if steps is None:
        steps = math.ceil(config.epochs * num_examples / config.batch_size)
    if steps < 1:
        raise ValueError(f"rlvr sft: {steps} steps; pass --steps or --epochs of at least 1")
    lr = config.lr
    if lr is None:
        lr = 2e-4 if config.lora_rank > 0 else 2e-3 if config.model == "tiny" else 1e-5
    return replace(config, steps=steps, lr=lr)


def add_lora(model: torch.nn.Module, rank: int, alpha: float | None) -> torch.nn.Module:
    """`model` with LoRA adapters on every linear layer (only they train); needs `peft`."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ImportError(
            "--lora-rank needs the peft package: pip install rlvr[lora] (or pip install peft)"
        ) from None
    config = LoraConfig(r=rank, lora_alpha=alpha or 2 * rank, target_modules="all-linear",
                        lora_dropout=0.0, task_type="CAUSAL_LM")  # fmt: skip
    return get_peft_model(model, config)


def run_sft(
    config: SFTConfig,
    run_dir: str | Path | None = None,
    evaluate: Callable[[torch.nn.Module], dict[str, float]] | None = None,
) -> Path:
    """Fine-tune as `config` says; write the run directory and return its `model/` directory.

    `run_dir` overrides `config.run_dir`. `evaluate(model) -> {name: value}` runs before
    training, every `eval_every` steps and after; its values are logged as `eval/<name>`.
    Without one, --eval-data gives eval/loss and --task gives eval/greedy_acc.
    """
    from rlvr.models.tiny import build_char_tokenizer, build_tiny_model, load_model, save_model
    from rlvr.report.run_dir import RunDirectory

    start = time.perf_counter()
    task, pairs = None, None
    if config.data is not None:
        pairs = load_pairs(config.data)  # refused before any model loads
    elif config.task is not None:
        task = _build_task(config)
    config = resolve_sft_config(config, len(pairs) if pairs is not None else None)
    config = replace(config, run_dir=str(run_dir or config.run_dir))
    eval_pairs = load_pairs(config.eval_data) if config.eval_data else None
    path = Path(config.run_dir)
    run = RunDirectory(path.parent, path.name, overwrite=config.overwrite)
    run.write_config(config)
    torch.set_num_threads(config.threads)

    # --- model ---------------------------------------------------------------------------------
    if config.model == "tiny":
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(config.tiny, tokenizer, seed=config.seed)
    else:
        model, tokenizer = load_model(config.model)
    torch.manual_seed(config.seed)
    if config.lora_rank > 0:
        model = add_lora(model, config.lora_rank, config.lora_alpha)
    if evaluate is None:
        evaluate = _default_evaluator(config, task, tokenizer, eval_pairs)

    # --- data ----------------------------------------------------------------------------------
    if pairs is not None:
        stream = shuffled_epochs(pairs, config.seed)
    else:  # flaw_prob 0: the task's correct worked solutions
        stream = task.corpus(config.seed, 0.0)
    stream = ((format_prompt(tokenizer, p, config.chat_template), c) for p, c in stream)

    # --- train ---------------------------------------------------------------------------------
    records = []

    def log(step: int, metrics: dict[str, float]) -> None:
        if evaluate is not None and (step == 0 or step == config.steps or (
                config.eval_every and step % config.eval_every == 0)):  # fmt: skip
            metrics = {**metrics, **{f"eval/{k}": v for k, v in evaluate(model).items()}}
        records.append({"step": step, **metrics})
        run.log_metrics(records[-1])

    if evaluate is not None:
        log(0, {})
    losses = train_next_token(
        model, tokenizer, stream, config.steps, config.batch_size, config.lr,
        warmup_steps=config.warmup_steps, weight_decay=config.weight_decay,
        max_length=config.max_length, on_step=log, progress=config.progress, desc="sft",
    )  # fmt: skip

    # --- save and report -----------------------------------------------------------------------
    if config.lora_rank > 0:
        model = model.merge_and_unload()
    save_model(model, tokenizer, run.model_path)
    plot_loss_curve(records, run.path / "loss_curve.png")
    evals = [r for r in records if any(k.startswith("eval/") for k in r)]
    tail = losses[-max(1, len(losses) // 10) :]
    summary = {
        "model_dir": str(run.model_path),
        "init_model": config.model,
        "examples": len(pairs) if pairs is not None else None,
        "steps": config.steps,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "mean_loss_last_tenth": sum(tail) / len(tail) if losses else None,
        "completion_tokens": int(sum(r.get("tokens/completion", 0) for r in records)),
        "truncated_sequences": int(sum(r.get("data/truncated", 0) for r in records)),
        "eval_before": _evals_of(evals[0]) if evals else {},
        "eval_after": _evals_of(evals[-1]) if evals else {},
        "lora_rank": config.lora_rank,
        "wall_seconds": time.perf_counter() - start,
    }
    run.write_summary(summary)
    if config.progress:
        print(f"[rlvr] sft: {json.dumps({k: summary[k] for k in _SHOWN})}", flush=True)
    return run.model_path


_SHOWN = ("steps", "first_loss", "last_loss", "truncated_sequences", "eval_before", "eval_after",
          "model_dir")  # fmt: skip


def _evals_of(record: dict) -> dict[str, float]:
    return {k.removeprefix("eval/"): v for k, v in record.items() if k.startswith("eval/")}


def _build_task(config: SFTConfig):
    # the task registry lives with the lab; imported here to keep `rlvr.train` importable alone
    from rlvr.pipelines.lab import LabConfig, build_task

    return build_task(LabConfig(task=config.task, arithmetic=config.arithmetic, seed=config.seed))


def _default_evaluator(config: SFTConfig, task, tokenizer, eval_pairs: list[Pair] | None):
    """eval/loss on --eval-data and eval/greedy_acc on the task's held-out rows, if asked for."""
    rows = task.held_out_rows()[: config.eval_rows] if task is not None else []
    if not rows and not eval_pairs:
        return None
    from rlvr.train.evaluate import held_out_accuracy

    template = config.chat_template
    formatted = [(format_prompt(tokenizer, p, template), c) for p, c in eval_pairs or []]
    prompted = [{**r, "prompt": format_prompt(tokenizer, r["prompt"], template)} for r in rows]

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        out = {}
        if formatted:
            out["loss"] = completion_nll(model, tokenizer, formatted, config.batch_size,
                                         config.max_length)  # fmt: skip
        if prompted:
            out["greedy_acc"] = held_out_accuracy(model, tokenizer, prompted, task.score,
                                                  task.max_new_tokens)  # fmt: skip
        return out

    return evaluate


def plot_loss_curve(records: list[dict], path: str | Path) -> Path:
    """Training loss per step (and eval/loss where logged) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlvr.report.plots import save_figure

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    train = [r for r in records if "loss" in r]
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], color="#2563eb", lw=1,
            label="train loss (per completion token)")  # fmt: skip
    held = [r for r in records if "eval/loss" in r]
    if held:
        ax.plot([r["step"] for r in held], [r["eval/loss"] for r in held], color="#d97706",
                marker="o", ms=3, lw=2, label="held-out loss")  # fmt: skip
    ax.set_xlabel("SFT step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    return save_figure(fig, path)
