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

The loop runs on GRPO's safety net: its state is `rlvr.train.state.build_state`'s (AdamW, the
LR schedule, RNG), each update `rlvr.train.update.optimizer_step` (a NaN/Inf loss or gradient
skips the step), and with `Checkpoints` it saves `rlvr.train.checkpoint` checkpoints and
resumes from the newest bit for bit. Under torchrun (`dist_ctx` over N ranks) the policy is an
FSDP2 copy of `model`; each rank runs rows `rank, rank + N, ...` of every batch with the
whole batch's divisor (gradients summed over the ranks), and `model` gets the trained weights
after every step.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from rlvr.config import ConfigError
from rlvr.tasks.jsonl import Pair
from rlvr.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from rlvr.train.distributed import DistContext
from rlvr.train.grpo import StopRequest
from rlvr.train.state import TrainState, build_state
from rlvr.train.strategy import make_strategy
from rlvr.train.update import optimizer_step

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


def completion_loss(
    logits: torch.Tensor, labels: torch.Tensor, num_tokens: int | None = None
) -> tuple[torch.Tensor, int]:
    """(summed next-token cross-entropy / divisor, the divisor).

    logits [B, L, V] (position t predicts token t+1), labels [B, L] with IGNORE_INDEX on tokens
    not trained on. Divisor: `num_tokens` when given (a rank's share of a batch divides by the
    whole batch's tokens), else the number of labelled targets `labels[:, 1:] != IGNORE_INDEX`,
    i.e. the batch's completion tokens including EOS; at least 1, so a batch with none gives 0.
    """
    targets = labels[:, 1:]
    if num_tokens is None:
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


def share_loss(
    model: torch.nn.Module,
    tokenizer,
    pairs: list[Pair],
    max_length: int | None,
    rank: int,
    world_size: int,
) -> tuple[torch.Tensor, int, int]:
    """Rank `rank`'s part of `pairs_loss` over all of `pairs`: (the cross-entropy summed over
    the completion tokens of rows `rank, rank + world_size, ...`, divided by the whole batch's
    completion tokens; that divisor; sequences of the whole batch truncated). Summed over the
    ranks, the losses (and gradients) are `pairs_loss`'s; one rank is `pairs_loss` itself."""
    if world_size == 1:
        return pairs_loss(model, tokenizer, pairs, max_length)
    inputs = supervised_batch(tokenizer, *zip(*pairs), max_length=max_length)
    num_tokens = int((inputs["labels"][:, 1:] != IGNORE_INDEX).sum())
    rows = torch.arange(rank, len(pairs), world_size)
    width = int(inputs["attention_mask"][rows].sum(dim=1).max())  # right-padded: trim
    ids, mask, labels = (
        inputs[k][rows][:, :width] for k in ("input_ids", "attention_mask", "labels")
    )
    device = next(model.parameters()).device
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
    loss, _ = completion_loss(logits, labels.to(device), num_tokens)
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
    *,
    seed: int | None = None,
    checkpoints: Checkpoints | None = None,
    dist_ctx: DistContext | None = None,
    on_start: Callable[[int], None] | None = None,
    max_nonfinite_steps: int = 3,
) -> list[float]:
    """AdamW on the completion-token cross-entropy (`completion_loss`); returns the loss of
    every step it ran.

    Each step's loss is the mean over the completion tokens of its batch (EOS included, prompt
    and padding excluded): the divisor is the batch's number of completion tokens. Only
    parameters with `requires_grad` are trained (LoRA adapters, when the model has them). The
    learning rate warms up linearly over `warmup_steps`, then decays by a cosine to
    `final_lr_fraction` of `lr`; the gradient's global norm is clipped to `grad_clip`.
    `on_step(step, metrics)` gets the 1-based step and `loss`, `lr`, `grad_norm`,
    `tokens/completion` and `data/truncated` (sequences cut at `max_length` in this batch).

    The state is `build_state`'s, seeded with `seed` (None: torch's global RNG is left as it
    was). A NaN/Inf loss or gradient skips the update (`update/nonfinite` 1.0 in its metrics;
    the scheduler does not advance) and `max_nonfinite_steps` in a row stop the run
    (FloatingPointError). `checkpoints`: see `Checkpoints`; on resume the first
    `data_position` pairs of `pairs` are skipped; without `checkpoints` SIGINT/SIGTERM are
    left to their defaults (nothing to save). `on_start(step)` is called once before the
    first step with the step the run continues after (0: a fresh start). With `dist_ctx` over
    several ranks, every rank runs this with the same `pairs`; `on_step` should be given on
    rank 0 only (the others' `model` is current too)."""
    strategy = make_strategy(dist_ctx)
    if batch_size < strategy.world_size:
        raise ConfigError(
            f"--batch-size {batch_size} is below the {strategy.world_size} torchrun ranks: every "
            "rank needs a row of each batch; raise it or run fewer ranks"
        )
    model.train()
    policy = strategy.learner_copy(model)  # FSDP2: `model` stays whole, the copy is split

    def schedule(s: int) -> float:
        return warmup_cosine(s, steps, warmup_steps, final_fraction=final_lr_fraction)

    with contextlib.nullcontext() if seed is not None else torch.random.fork_rng():
        state = build_state(
            policy,
            seed=seed or 0,
            lr=lr,
            weight_decay=weight_decay,
            dist_ctx=dist_ctx,
            schedule=schedule,
            strategy=strategy,
        )
    if resume_state(state, checkpoints) is not None:
        for _ in itertools.islice(pairs, state.data_position):  # the rows already trained on
            pass
        give_weights(model, state)
    first = state.step
    if on_start is not None:
        on_start(first)
    losses: list[float] = []
    bar = tqdm(range(first + 1, steps + 1), desc=desc, disable=not progress, leave=False)
    nonfinite, stop = 0, StopRequest()
    with stop.installed() if checkpoints is not None else contextlib.nullcontext():
        for step in bar:
            batch = list(itertools.islice(pairs, batch_size))
            if not batch:
                raise ValueError(f"the training pairs ran out at step {step} of {steps}")
            current_lr = state.scheduler.get_last_lr()[0]
            metrics = _update(model, policy, tokenizer, batch, max_length, state, grad_clip)
            state.step, state.data_position = step, state.data_position + len(batch)
            nonfinite = nonfinite + 1 if "update/nonfinite" in metrics else 0
            stop_if_diverging(step, nonfinite, max_nonfinite_steps, checkpoints)
            losses.append(metrics["loss"])
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if on_step is not None:
                on_step(step, {"loss": losses[-1], "lr": current_lr, **metrics})
            end_of_step(state, checkpoints, stop, step == steps)
    model.eval()
    return losses


# --- checkpoints, shared with the DPO loop -------------------------------------------------------


@dataclass(frozen=True)
class Checkpoints:
    """Where a loop checkpoints (`save_checkpoint`), how often, and whether it resumes.

    A checkpoint is written every `every` steps (0: none on the way), after the last step and
    when SIGINT/SIGTERM asks the run to stop (the step finishes first); the newest `keep_last`
    are kept. With `resume`, the newest complete one in `directory` is loaded first (none: a
    fresh start). `resume_command` is what a stopped run prints to be continued."""

    directory: Path
    every: int = 25
    keep_last: int = 3
    resume: bool = False
    resume_command: str = ""
    extra: Callable[[], dict[str, Any]] | None = None
    """What the loop saves beside the state (JSON; e.g. DPO's pool), asked at each save."""


def resume_state(state: TrainState, checkpoints: Checkpoints | None) -> dict[str, Any] | None:
    """Load the newest checkpoint of `checkpoints.directory` into `state` when resuming (under
    torchrun: the one rank 0 lists, loaded by every rank; `state.step` is then its step) and
    return its `extra`; None when nothing was loaded (not resuming, or no checkpoint yet)."""
    if checkpoints is None or not checkpoints.resume:
        return None
    strategy = state.strategy
    latest = latest_checkpoint(checkpoints.directory) if strategy.is_main else None
    latest = strategy.broadcast(latest)  # rank 0's choice: the ranks' listings could differ
    if latest is None:
        return None
    loaded = load_checkpoint(latest, state)
    if strategy.is_main:
        tqdm.write(f"[rlvr] resumed from {latest} (step {state.step})", file=sys.stderr)
    return loaded["extra"]


def end_of_step(
    state: TrainState, checkpoints: Checkpoints | None, stop: StopRequest, last: bool
) -> None:
    """After step `state.step`: checkpoint when due (every `checkpoints.every` steps, the last
    step, a stop request: the ranks agree on that one), then stop (KeyboardInterrupt) when a
    signal asked for it, saying how to resume."""
    stop.requested = not state.strategy.all_agree(not stop.requested)  # the ranks' signals differ
    if checkpoints is not None:
        every = checkpoints.every
        if last or (every > 0 and state.step % every == 0) or stop.requested:
            extra = checkpoints.extra() if checkpoints.extra is not None else None
            try:
                save_checkpoint(
                    checkpoints.directory, state, extra=extra, keep_last=checkpoints.keep_last
                )
            except CheckpointError as exc:  # e.g. a full disk: the previous one is intact
                tqdm.write(f"[rlvr] WARNING: {exc}", file=sys.stderr)
    if stop.requested:
        saved = "checkpoint written" if checkpoints is not None else "no checkpoints kept"
        command = checkpoints.resume_command if checkpoints is not None else ""
        again = f". Resume with: {command}" if command else ""
        tqdm.write(
            f"[rlvr] stopped by signal after step {state.step}; {saved}{again}", file=sys.stderr
        )
        raise KeyboardInterrupt


def stop_if_diverging(
    step: int, in_a_row: int, limit: int, checkpoints: Checkpoints | None
) -> None:
    """FloatingPointError once `limit` updates in a row were skipped for a NaN/Inf."""
    if in_a_row >= limit:
        where = f"; the last good checkpoint is in {checkpoints.directory}" if checkpoints else ""
        raise FloatingPointError(
            f"step {step}: {in_a_row} updates in a row had a NaN/Inf loss or gradient and were "
            f"skipped; stopping. Lower the learning rate or check the data{where}"
        )


def _update(
    model: torch.nn.Module,
    policy: torch.nn.Module,
    tokenizer,
    batch: list[Pair],
    max_length: int | None,
    state: TrainState,
    grad_clip: float,
) -> dict[str, float]:
    """One step's forward and backward (this rank's rows under torchrun), `optimizer_step`
    (the scheduler advances when it stepped), and under torchrun `model` given the new
    weights (a collective). Returns `loss` (the whole batch's), `grad_norm`,
    `tokens/completion` (the divisor), `data/truncated`, and `update/nonfinite` 1.0 when the
    update was skipped for a NaN/Inf."""
    strategy = state.strategy
    rank, world = strategy.rank, strategy.world_size
    with strategy.ranks("the update"):
        loss, num_tokens, truncated = share_loss(policy, tokenizer, batch, max_length, rank, world)
        state.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        total = strategy.sum_over_ranks({"loss": loss.item()})["loss"]
        grad_norm, stepped = optimizer_step(policy, state.optimizer, grad_clip, total)
        if stepped:
            state.scheduler.step()
        give_weights(model, state)
    metrics = {
        "loss": total,
        "grad_norm": float(grad_norm),
        "tokens/completion": float(num_tokens),
        "data/truncated": float(truncated),
    }
    return metrics if stepped else metrics | {"update/nonfinite": 1.0}


def give_weights(model: torch.nn.Module, state: TrainState) -> None:
    """Copy the trained weights into `model` when the learner trains a copy of it (FSDP2: the
    full weights gathered, a collective); nothing when it trains `model` itself."""
    if state.policy is not model:
        model.load_state_dict(state.strategy.full_state_dict(state.policy))


# --- data --------------------------------------------------------------------------------------


def shuffled_epochs(pairs: list[Pair], seed: int) -> Iterator[Pair]:
    """Endless passes over `pairs`, each in a fresh seeded order."""
    rng = random.Random(seed)
    while True:
        order = pairs[:]
        rng.shuffle(order)
        yield from order
