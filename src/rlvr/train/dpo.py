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
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from rlvr.algo.dpo import dpo_loss, sequence_logps
from rlvr.models.logprobs import completion_logprobs
from rlvr.train.evaluate import held_out_samples
from rlvr.train.sft import shuffled_epochs

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
    reference: torch.nn.Module,
    tokenizer,
    pairs: Sequence[PreferencePair],
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    num_pairs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`dpo_loss` of `pairs`: policy log-probs with gradient, the reference's without; divided
    by `num_pairs` (default: len(pairs))."""
    chosen, rejected = pair_logps(model, tokenizer, pairs)
    with torch.no_grad():
        ref_chosen, ref_rejected = pair_logps(reference, tokenizer, pairs)
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
) -> list[float]:
    """AdamW on the DPO loss against a frozen copy of `model` as it is now; returns every
    step's loss.

    `new_pool(policy, round)` samples a pair pool (`sample_pair_pool`) from `policy`: once before
    step 1 and, with `iterate_every > 0`, again from the current policy before every step
    `k * iterate_every + 1`. Each step takes the next `pairs_per_step` pairs of seeded shuffled
    passes over the current pool; its loss is their mean (the divisor is `pairs_per_step` for
    every micro-batch of `micro_batch_pairs`). `on_pool(step, pool)` sees each new pool (step 0
    for the first). `on_step(step, metrics)` gets the 1-based step and `loss`, `grad_norm`, `lr`,
    the `rewards/*` of `dpo_loss` (means over the step's pairs) and `pool/pairs`.
    """
    reference = copy.deepcopy(model).eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)
    torch.manual_seed(seed)
    losses: list[float] = []
    stream: Iterator[PreferencePair] = iter(())
    pool_size = 0
    bar = tqdm(range(1, steps + 1), desc="dpo", disable=not progress, leave=False)
    for step in bar:
        # --- pairs: a new pool first, and every iterate_every steps -------------------------------
        if step == 1 or (iterate_every and (step - 1) % iterate_every == 0):
            pool = new_pool(model, (step - 1) // iterate_every if iterate_every else 0)
            if on_pool is not None:
                on_pool(step - 1, pool)
            if not pool.pairs:
                raise ValueError(f"the policy's samples gave no pairs before step {step}")
            stream, pool_size = shuffled_epochs(pool.pairs, seed + step), len(pool.pairs)
        batch = [next(stream) for _ in range(pairs_per_step)]

        # --- loss and update ----------------------------------------------------------------------
        model.train()
        optimizer.zero_grad(set_to_none=True)
        total, sums = 0.0, dict.fromkeys(_REWARD_KEYS, 0.0)
        for start in range(0, len(batch), micro_batch_pairs):
            micro = batch[start : start + micro_batch_pairs]
            loss, metrics = pairs_dpo_loss(
                model, reference, tokenizer, micro, beta, loss_type, label_smoothing, len(batch)
            )
            loss.backward()
            total += loss.item()
            for k in _REWARD_KEYS:
                sums[k] += metrics[k] * len(micro)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
        optimizer.step()
        model.eval()

        # --- metrics ------------------------------------------------------------------------------
        losses.append(total)
        bar.set_postfix(loss=f"{total:.3f}")
        if on_step is not None:
            record = {
                "loss": total,
                "grad_norm": float(grad_norm),
                "lr": lr,
                **{k: v / len(batch) for k, v in sums.items()},
                "pool/pairs": float(pool_size),
            }
            on_step(step, record)
    return losses


_REWARD_KEYS = ("rewards/chosen", "rewards/rejected", "rewards/margin", "rewards/accuracy")
