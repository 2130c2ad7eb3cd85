"""Supervised fine-tuning: next-token loss on (prompt, completion) pairs, completion tokens only.

One loop, `train_next_token`, serves both uses: the "pretraining" of the lab's and the
pipelines' base model on a flawed corpus (`rlvr.pipelines.base_model`), and `rlvr sft`
(`rlvr.pipelines.sft.run_sft`): cold-start SFT, SFT on rejection-sampled completions
(`rlvr sample`), distillation.

Choices, and where they differ from common practice:

- The loss is a token mean over the batch: the divisor is the number of completion tokens in the
  batch (EOS included; prompt and padding excluded), so a long completion weighs more than a
  short one (as TRL's SFTTrainer and torchtune do; not a mean of per-sequence means).
- A sequence longer than `max_length` is cut on the right: the end of its completion (EOS with
  it) is not trained on. Cut sequences are counted per step (`data/truncated`) and in the
  summary, never silently dropped.
- Prompts arrive as the model sees them (`rlvr.models.chat.format_prompt` applies a chat
  template); the completion follows as plain text and ends with the tokenizer's EOS.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from rlvr.tasks.jsonl import Pair

IGNORE_INDEX = -100


# --- batches and the loss ----------------------------------------------------------------------


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
    device = next(model.parameters()).device
    ids, mask = inputs["input_ids"].to(device), inputs["attention_mask"].to(device)
    logits = model(input_ids=ids, attention_mask=mask).logits
    loss, num_tokens = completion_loss(logits, inputs["labels"].to(device))
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
    grad_clip: float = 1.0,
    final_lr_fraction: float = 0.1,
) -> list[float]:
    """AdamW on the completion-token cross-entropy (`completion_loss`); returns every step's loss.

    Each step's loss is the mean over the completion tokens of its batch (EOS included, prompt
    and padding excluded): the divisor is the batch's number of completion tokens. Only
    parameters with `requires_grad` are trained (LoRA adapters, when the model has them). The
    learning rate warms up linearly over `warmup_steps`, then decays by a cosine to
    `final_lr_fraction` of `lr`; the gradient's global norm is clipped to `grad_clip`.
    `on_step(step, metrics)` gets the 1-based step and `loss`, `lr`, `grad_norm`,
    `tokens/completion` and `data/truncated` (sequences cut at `max_length` in this batch).
    """
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine(s, steps, warmup_steps, final_fraction=final_lr_fraction)
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
        grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
        current_lr = schedule.get_last_lr()[0]
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if on_step is not None:
            metrics = {
                "loss": losses[-1],
                "lr": current_lr,
                "grad_norm": float(grad_norm),
                "tokens/completion": float(num_tokens),
                "data/truncated": float(truncated),
            }
            on_step(step, metrics)
    model.eval()
    return losses


# --- data --------------------------------------------------------------------------------------


def shuffled_epochs(pairs: list[Pair], seed: int) -> Iterator[Pair]:
    """Endless passes over `pairs`, each in a fresh seeded order."""
    rng = random.Random(seed)
    while True:
        order = pairs[:]
        rng.shuffle(order)
        yield from order
