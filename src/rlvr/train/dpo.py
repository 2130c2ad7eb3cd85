"""DPO on verified samples: pairs (correct, wrong) of the same prompt, against a frozen reference.

Pairs come from the model's own samples, graded by the task's strict `score`: for each prompt,
`num_samples` completions are sampled (`rlvr.rollout.sampler.sample_completions`); the distinct
correct ones are the chosen candidates, the distinct wrong ones the rejected candidates, and the
prompt gives `min(#correct, #wrong, pairs_per_prompt)` pairs, each completion in at most one
pair (a prompt whose samples are all right or all wrong gives none). The loss is
`rlvr.algo.dpo.dpo_loss` (DPO's sigmoid or IPO) on per-sequence summed log-probs.

Choices, and where they differ from common practice:

- Offline DPO (`iterate_every = 0`) samples its pair pool once, from the starting model, and
  trains on seeded shuffled passes over it. Iterated DPO regenerates the pool from the *current*
  policy every `iterate_every` steps (the on-policy middle ground between DPO and GRPO). The
  reference stays the starting model in both (no reference reset per round, unlike some
  iterative-DPO recipes), so the implicit reward is always relative to the same model.
- A completion that hits the token budget without EOS is left out of the pairs (training appends
  EOS, which would teach stopping where the model did not stop); they are counted.
- One step's loss is the mean over the step's `pairs_per_step` pairs: each micro-batch's summed
  pair losses are divided by the number of pairs of the whole step, so micro-batching does not
  change the gradient.

The loop runs on GRPO's safety net, as SFT's does (`rlvr.train.sft`): `build_state` (with the
frozen reference; a LoRA policy's reference is its base, adapters off), `optimizer_step` (a
NaN/Inf skips the update), `Checkpoints` (the current pool and where its round began go into
each checkpoint's `extra`, so a resume mid-round trains on the same pairs in the same order),
and torchrun: each rank a share of every step's pairs with the whole step's divisor, the pool
sampled by rank 0 and sent to the others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from rlvr.algo.dpo import dpo_loss, sequence_logps
from rlvr.models.logprobs import completion_logprobs
from rlvr.train.distributed import DistContext
from rlvr.train.evaluate import held_out_samples
from rlvr.train.grpo import StopRequest
from rlvr.train.lora_state import scoring_reference
from rlvr.train.sft import (
    Checkpoints,
    end_of_step,
    give_weights,
    resume_state,
    shuffled_epochs,
    stop_if_diverging,
)
from rlvr.train.state import TrainState, build_state
from rlvr.train.strategy import Strategy, make_strategy
from rlvr.train.update import optimizer_step

Row = dict[str, Any]
Score = Callable[[str, Row], float]


@dataclass(frozen=True)
class PreferencePair:
    """A prompt (as the model sees it), a verified-correct and a wrong completion of it."""

    prompt: str
    chosen: str
    rejected: str


@dataclass
class PairPool:
    """The pairs of one sampling round and what it cost."""

    pairs: list[PreferencePair]
    prompts: int  # prompts sampled
    completions: int  # completions generated (prompts x samples per prompt)
    correct: int  # completions the verifier accepted
    truncated: int  # completions left out for hitting the budget without EOS
    prompts_with_pairs: int
    stats: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, float]:
        """The round's counts, and its sample accuracy (correct / completions)."""
        return {
            "pairs": len(self.pairs),
            "prompts": self.prompts,
            "completions": self.completions,
            "correct": self.correct,
            "truncated": self.truncated,
            "prompts_with_pairs": self.prompts_with_pairs,
            "sample_acc": self.correct / max(1, self.completions),
        }


# --- pairs -------------------------------------------------------------------------------------


def pairs_of_prompt(
    prompt: str,
    completions: Sequence[str],
    scores: Sequence[float],
    pairs_per_prompt: int,
    rng: random.Random,
) -> list[PreferencePair]:
    """Up to `pairs_per_prompt` (correct, wrong) pairs of one prompt's graded completions.

    Correct means `score == 1.0`, wrong anything else. Duplicates (the same text) count once.
    The distinct correct and distinct wrong completions are shuffled by `rng` and zipped, so
    there are `min(#correct, #wrong, pairs_per_prompt)` pairs and no completion is in two; none
    when all are right or all are wrong.
    """
    correct = list(dict.fromkeys(c for c, s in zip(completions, scores, strict=True) if s == 1.0))
    wrong = list(dict.fromkeys(c for c, s in zip(completions, scores, strict=True) if s != 1.0))
    rng.shuffle(correct)
    rng.shuffle(wrong)
    count = min(len(correct), len(wrong), pairs_per_prompt)
    return [PreferencePair(prompt, correct[i], wrong[i]) for i in range(count)]


@torch.no_grad()
def sample_pair_pool(
    model: torch.nn.Module,
    tokenizer,
    rows: Sequence[Row],
    score: Score,
    num_samples: int,
    max_new_tokens: int,
    pairs_per_prompt: int,
    temperature: float = 1.0,
    seed: int = 0,
    prompts_per_call: int = 32,
) -> PairPool:
    """Sample `num_samples` completions for each of `rows` (prompts as given), grade each with
    `score(completion, row)`, and pair them per prompt (`pairs_of_prompt`); seeded by `seed`
    (sampling and pairing)."""
    samples = held_out_samples(  # seeded by `seed`, `prompts_per_call` prompts a call
        model,
        tokenizer,
        list(rows),
        score,
        max_new_tokens,
        temperature,
        num_samples,
        seed,
        batch_size=prompts_per_call * num_samples,
        workers=1,
    )
    rng = random.Random(seed)
    pairs: list[PreferencePair] = []
    completions = correct = truncated = with_pairs = 0
    for row, texts_of_row, scores_of_row, cut in zip(
        rows, samples.completions, samples.scores, samples.truncated, strict=True
    ):
        completions += len(texts_of_row)
        kept = [j for j, was_cut in enumerate(cut) if not was_cut]
        truncated += len(cut) - len(kept)
        texts = [texts_of_row[j] for j in kept]
        scores = [scores_of_row[j] for j in kept]
        correct += sum(s == 1.0 for s in scores)
        found = pairs_of_prompt(row["prompt"], texts, scores, pairs_per_prompt, rng)
        with_pairs += bool(found)
        pairs += found
    return PairPool(pairs, len(rows), completions, correct, truncated, with_pairs)


# --- log-probs and the loss ----------------------------------------------------------------------


def pair_batch(
    tokenizer, prompts: Sequence[str], completions: Sequence[str], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prompt_ids [N, P] left-padded, prompt_mask [N, P], completion_ids [N, T] right-padded,
    completion_mask [N, T]): each completion tokenized as text plus EOS (the mask covers the EOS),
    the prompt as the sampler tokenizes it."""
    encoded = tokenizer(list(prompts), return_tensors="pt", padding=True, padding_side="left")
    ids = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in completions]
    ids = [c + [tokenizer.eos_token_id] for c in ids]
    width = max(len(c) for c in ids)
    completion_ids = torch.full((len(ids), width), tokenizer.pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros((len(ids), width))
    for i, c in enumerate(ids):
        completion_ids[i, : len(c)] = torch.tensor(c)
        completion_mask[i, : len(c)] = 1.0
    return (
        encoded["input_ids"].to(device),
        encoded["attention_mask"].to(device),
        completion_ids.to(device),
        completion_mask.to(device),
    )


def pair_logps(
    model: torch.nn.Module, tokenizer, pairs: Sequence[PreferencePair]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen [P], rejected [P]) summed completion log-probs (EOS included) under `model`, in
    one forward over the 2P sequences (chosen first)."""
    device = next(model.parameters()).device
    prompts = [p.prompt for p in pairs] * 2
    completions = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    inputs = pair_batch(tokenizer, prompts, completions, device)
    token_logps = completion_logprobs(model, *inputs)  # [2P, T]
    logps = sequence_logps(token_logps, inputs[3])  # [2P]
    return logps[: len(pairs)], logps[len(pairs) :]


def pairs_dpo_loss(
    model: torch.nn.Module,
    reference: torch.nn.Module | None,
    tokenizer,
    pairs: Sequence[PreferencePair],
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    num_pairs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`dpo_loss` of `pairs`: policy log-probs with gradient, the reference's without; divided
    by `num_pairs` (default: len(pairs)). `reference` None: `model` is a LoRA policy whose
    reference is its base (its adapters disabled, in eval mode)."""
    chosen, rejected = pair_logps(model, tokenizer, pairs)
    with torch.no_grad(), scoring_reference(reference, model, reference is None) as scorer:
        ref_chosen, ref_rejected = pair_logps(scorer, tokenizer, pairs)
    return dpo_loss(
        chosen, rejected, ref_chosen, ref_rejected, beta, loss_type, label_smoothing, num_pairs
    )


# --- the loop ----------------------------------------------------------------------------------


def train_dpo(
    model: torch.nn.Module,
    tokenizer,
    new_pool: Callable[[torch.nn.Module, int], PairPool],
    steps: int,
    pairs_per_step: int,
    beta: float,
    lr: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    iterate_every: int = 0,
    micro_batch_pairs: int = 16,
    grad_clip: float = 1.0,
    seed: int = 0,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    on_pool: Callable[[int, PairPool], None] | None = None,
    progress: bool = True,
    *,
    checkpoints: Checkpoints | None = None,
    dist_ctx: DistContext | None = None,
    on_start: Callable[[int], None] | None = None,
    max_nonfinite_steps: int = 3,
) -> list[float]:
    """AdamW on the DPO loss against a frozen copy of `model` as it is now (a LoRA policy: its
    base); returns the loss of every step it ran.

    `new_pool(policy, round)` samples a pair pool (`sample_pair_pool`) from `policy`: once before
    step 1 and, with `iterate_every > 0`, again from the current policy before every step
    `k * iterate_every + 1`. Each step takes the next `pairs_per_step` pairs of seeded shuffled
    passes over the current pool; its loss is their mean (the divisor is `pairs_per_step` for
    every micro-batch of `micro_batch_pairs`). `on_pool(step, pool)` sees each new pool (step 0
    for the first). `on_step(step, metrics)` gets the 1-based step and `loss`, `grad_norm`, `lr`,
    the `rewards/*` of `dpo_loss` (means over the step's pairs) and `pool/pairs`.

    The state is `build_state`'s; a NaN/Inf loss or gradient skips the update
    (`update/nonfinite`), `max_nonfinite_steps` in a row stop the run (FloatingPointError).
    `checkpoints`: see `rlvr.train.sft.Checkpoints`; a checkpoint's `extra` holds the current
    pool's pairs and the step it was drawn at, so a resume inside a round goes on with the same
    pairs in the same order (and the next round samples from the same weights), and
    `on_start(step)` is told the step the run continues after (0: fresh). With `dist_ctx` over
    several ranks every rank runs this: `new_pool` is called on rank 0 only (its pool is sent
    to the others), `on_step`/`on_pool` should be given on rank 0 only, and `model` holds the
    trained weights on every rank after each step."""
    strategy = make_strategy(dist_ctx)
    policy = strategy.learner_copy(model)  # FSDP2: `model` stays whole, the copy is split
    state = build_state(
        policy, seed=seed, lr=lr, reference=True, dist_ctx=dist_ctx, strategy=strategy
    )
    stream: Iterator[PreferencePair] = iter(())
    pool_pairs: list[PreferencePair] = []
    pool_step = 0  # the pool was drawn before step pool_step + 1

    def extra() -> dict[str, Any]:
        pairs = [[p.prompt, p.chosen, p.rejected] for p in pool_pairs]
        return {"dpo_pool": pairs, "dpo_pool_step": pool_step}

    if checkpoints is not None:
        checkpoints = dataclasses.replace(checkpoints, extra=extra)
    saved = resume_state(state, checkpoints)
    if saved is not None:
        give_weights(model, state)
        pool_step = saved["dpo_pool_step"]
        pool_pairs = [PreferencePair(*p) for p in saved["dpo_pool"]]
        stream = shuffled_epochs(pool_pairs, seed + pool_step + 1)
        for _ in itertools.islice(stream, (state.step - pool_step) * pairs_per_step):
            pass  # the pairs already trained on
    if on_start is not None:
        on_start(state.step)
    losses: list[float] = []
    bar = tqdm(range(state.step + 1, steps + 1), desc="dpo", disable=not progress, leave=False)
    nonfinite, stop = 0, StopRequest()
    with stop.installed() if checkpoints is not None else contextlib.nullcontext():
        for step in bar:
            # --- pairs: a new pool first, and every iterate_every steps ---------------------------
            if step == 1 or (iterate_every and (step - 1) % iterate_every == 0):
                round_index = (step - 1) // iterate_every if iterate_every else 0
                pool = _rank0_pool(new_pool, model, round_index, strategy)
                if on_pool is not None:
                    on_pool(step - 1, pool)
                if not pool.pairs:
                    raise ValueError(f"the policy's samples gave no pairs before step {step}")
                pool_pairs, pool_step = pool.pairs, step - 1
                stream = shuffled_epochs(pool_pairs, seed + step)
            batch = [next(stream) for _ in range(pairs_per_step)]

            # --- loss and update ------------------------------------------------------------------
            record = {"lr": state.scheduler.get_last_lr()[0]}
            record |= _dpo_update(
                model,
                state,
                tokenizer,
                batch,
                (beta, loss_type, label_smoothing),
                micro_batch_pairs,
                grad_clip,
            )
            state.step = step
            nonfinite = nonfinite + 1 if "update/nonfinite" in record else 0
            stop_if_diverging(step, nonfinite, max_nonfinite_steps, checkpoints)

            # --- metrics --------------------------------------------------------------------------
            losses.append(record["loss"])
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if on_step is not None:
                on_step(step, {"loss": losses[-1], **record, "pool/pairs": float(len(pool_pairs))})
            end_of_step(state, checkpoints, stop, step == steps)
    return losses


def _rank0_pool(
    new_pool: Callable[[torch.nn.Module, int], PairPool],
    model: torch.nn.Module,
    round_index: int,
    strategy: Strategy,
) -> PairPool:
    """`new_pool(model, round_index)`; under torchrun sampled on rank 0 alone and sent to every
    rank (an error it raised is raised on every rank)."""
    result: PairPool | BaseException | None = None
    if strategy.is_main:
        try:
            result = new_pool(model, round_index)
        except Exception as exc:  # every rank must leave the broadcast
            result = exc
    result = strategy.broadcast(result)
    if isinstance(result, BaseException):
        raise result
    assert result is not None
    return result


def _dpo_update(
    model: torch.nn.Module,
    state: TrainState,
    tokenizer,
    batch: list[PreferencePair],
    loss_args: tuple[float, str, float],
    micro_batch_pairs: int,
    grad_clip: float,
) -> dict[str, float]:
    """One step's gradient over `batch` and `optimizer_step` (the scheduler advances when it
    stepped); under torchrun rank r runs pairs `r, r + N, ...` and `model` gets the new weights
    after (a collective). Every micro-batch of `micro_batch_pairs` divides by `len(batch)`.

    Under torchrun every rank runs as many passes as the rank with the most micro-batches: a
    rank short of one runs a zero-weight pass (a real one-pair loss times 0.0) so that FSDP's
    collectives match. Returns `loss` (the step's, over every rank), `grad_norm`, the
    `rewards/*` means over the step's pairs, and `update/nonfinite` 1.0 when skipped."""
    strategy = state.strategy
    rank, world = strategy.rank, strategy.world_size
    mine = batch[rank::world]
    passes = math.ceil(math.ceil(len(batch) / world) / micro_batch_pairs)  # the largest share's
    policy = state.policy
    policy.train()
    state.optimizer.zero_grad(set_to_none=True)
    total, sums = 0.0, dict.fromkeys(_REWARD_KEYS, 0.0)
    with strategy.ranks("the DPO update"):
        for i in range(passes):
            micro = mine[i * micro_batch_pairs : (i + 1) * micro_batch_pairs]
            real = bool(micro)
            loss, metrics = pairs_dpo_loss(
                policy,
                state.reference,
                tokenizer,
                micro if real else batch[:1],
                *loss_args,
                len(batch),
            )
            (loss if real else loss * 0.0).backward()
            if real:
                total += loss.item()
                for k in _REWARD_KEYS:
                    sums[k] += metrics[k] * len(micro)
        sums = strategy.sum_over_ranks({"loss": total, **sums})
        total = sums.pop("loss")
        grad_norm, stepped = optimizer_step(policy, state.optimizer, grad_clip, total)
        if stepped:
            state.scheduler.step()
        policy.eval()
        give_weights(model, state)
    record = {
        "loss": total,
        "grad_norm": float(grad_norm),
        **{k: v / len(batch) for k, v in sums.items()},
    }
    return record if stepped else record | {"update/nonfinite": 1.0}


_REWARD_KEYS = ("rewards/chosen", "rewards/rejected", "rewards/margin", "rewards/accuracy")
