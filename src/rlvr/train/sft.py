"""Next-token training on (prompt, completion) pairs, loss on completion tokens only.

Used to "pretrain" the lab's base model on a flawed corpus; the same loop is supervised
fine-tuning (cold start, rejection-sampling SFT, distillation) on any pairs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
from tqdm.auto import tqdm

IGNORE_INDEX = -100


def supervised_batch(
    tokenizer, prompts: list[str], completions: list[str]
) -> dict[str, torch.Tensor]:
    """Right-padded `input_ids`, `attention_mask` and `labels` for prompt + completion + EOS.

    Labels are IGNORE_INDEX on prompt tokens and padding, so the loss covers the completion and
    its EOS only.
    """
    eos = tokenizer.eos_token_id
    sequences, labels = [], []
    for prompt, completion in zip(prompts, completions):
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [eos]
        sequences.append(p + c)
        labels.append([IGNORE_INDEX] * len(p) + c)
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), tokenizer.pad_token_id, dtype=torch.long)
    label_ids = torch.full((len(sequences), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, (s, lab) in enumerate(zip(sequences, labels)):
        input_ids[i, : len(s)] = torch.tensor(s)
        label_ids[i, : len(lab)] = torch.tensor(lab)
        attention_mask[i, : len(s)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": label_ids}


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
    pairs: Iterator[tuple[str, str]],
    steps: int,
    batch_size: int,
    lr: float,
    warmup_steps: int = 10,
    weight_decay: float = 0.0,
    on_step: Callable[[int, float], None] | None = None,
    progress: bool = True,
) -> list[float]:
    """AdamW on the completion-token cross-entropy; returns the loss of every step.

    Each step's loss is the mean over the completion tokens of its batch (EOS included, prompt
    and padding excluded): the divisor is the batch's number of completion tokens.
    """
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine(s, steps, warmup_steps, final_fraction=0.1)
    )
    losses = []
    bar = tqdm(range(steps), desc="base model", disable=not progress, leave=False)
    for step in bar:
        batch = [next(pairs) for _ in range(batch_size)]
        inputs = supervised_batch(tokenizer, [p for p, _ in batch], [c for _, c in batch])
        loss = model(**inputs).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    return losses
