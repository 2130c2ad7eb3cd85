"""What the loop records beside the update: the hacking monitor (with the step's lengths by
correctness and zero-variance share, `step_metrics`) and the step's samples."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from rlvr.config import UserError
from rlvr.rollout.sampler import RolloutBatch
from rlvr.tasks.rewards import RewardFn, reward_columns, total_rewards
from rlvr.train.step_metrics import step_metrics


class ZeroRewardError(UserError):
    """The training reward stayed exactly 0 while the verifier parsed no answer from most
    completions: a format mismatch, not a hard task; training on would learn nothing."""


def unparsed_fraction(metrics: dict[str, float], completions: int) -> float | None:
    """The largest share of a step's `completions` that a reward function found no answer in
    (`verifier/<fn>/no_answer` over the completions); None when no function reports it."""
    counts = [
        v for k, v in metrics.items() if k.startswith("verifier/") and k.endswith("/no_answer")
    ]
    if not counts or completions == 0:
        return None
    return max(counts) / completions


def unparsed_share(
    reward_fn: RewardFn, rows: list[dict[str, Any]], completions: list[str]
) -> float | None:
    """The share of `completions` (one per row of `rows`) in which `reward_fn`, scoring them
    as in training, found no answer (`unparsed_fraction`); None when it does not say."""
    _, metrics = total_rewards(
        [reward_fn], [1.0], [r["prompt"] for r in rows], completions, reward_columns(rows)
    )
    return unparsed_fraction(metrics, len(completions))


def never_parsed_warning(share: float | None, problems: int) -> str | None:
    """The warning after the base model's first evaluation when the verifier found no answer
    in any of its `problems` greedy completions (`share` 1.0), else None."""
    if share is None or share < 1.0:
        return None
    return (
        f"the base model wrote no answer the verifier can read in any of its {problems} "
        "held-out completions: RL will see reward 0 everywhere and learn nothing; make the "
        "prompt ask for the verifier's format (e.g. a final '#### 42' or '\\boxed{42}': "
        "--few-shot, --system-prompt) or start from a model that writes it"
    )


class ZeroRewardWatch:
    """Counts the steps in a row whose reward is exactly 0 with most completions unparsed
    (more than half), and stops the run after `limit` of them (0: never)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.in_a_row = limit, 0

    def __call__(self, step: int, metrics: dict[str, float], completions: int) -> None:
        unparsed = unparsed_fraction(metrics, completions)
        silent = metrics.get("reward/mean") == 0.0 and unparsed is not None and unparsed > 0.5
        self.in_a_row = self.in_a_row + 1 if silent else 0
        if self.limit > 0 and self.in_a_row >= self.limit:
            raise ZeroRewardError(
                f"step {step}: the training reward has been exactly 0 for {self.in_a_row} "
                f"steps in a row and the verifier found no answer in {unparsed:.0%} of this "
                "step's completions: the model does not write answers in the format the "
                "verifier reads (e.g. a final '#### 42' or '\\boxed{42}'); look at "
                "samples.jsonl, and fix the prompt (--few-shot, --system-prompt) or the "
                "task. --grpo.abort-zero-reward-steps 0 turns this check off"
            )


def monitor_hacking(
    strict_reward_fn: RewardFn,
    batch: RolloutBatch,
    rewards: torch.Tensor,
    samples: int,
    gap: float,
    train_reward_fn: RewardFn | None = None,
) -> dict[str, float]:
    """Re-score the first `samples` completions with the strict verifier and compare with the
    training verifier's score of the same completions: `train_reward_fn` (the first reward
    function, the one that judges correctness) when given, else the step's total reward.
    Other terms of a weighted reward (a format bonus, say) are not hacking. Flagged when the
    training reward exceeds strict accuracy by more than `gap`."""
    n = min(samples, len(batch.completions))
    sample_rows = [batch.row_of(i) for i in range(n)]
    prompts, columns = [r["prompt"] for r in sample_rows], reward_columns(sample_rows)
    strict, _ = total_rewards([strict_reward_fn], [1.0], prompts, batch.completions[:n], columns)
    train = rewards[:n]
    if train_reward_fn is not None:
        train, _ = total_rewards([train_reward_fn], [1.0], prompts, batch.completions[:n], columns)
    train_reward, strict_acc = train.mean().item(), strict.mean().item()
    return {
        "monitor/train_reward": train_reward,
        "monitor/strict_acc": strict_acc,
        "monitor/gap": train_reward - strict_acc,
        "monitor/flagged": float(train_reward - strict_acc > gap),
    }


@dataclass(frozen=True)
class HackingMonitor:
    """`monitor_hacking` every `every` steps (never when `every` is 0 or there is no strict
    verifier), with a warning on stderr when a step is flagged; every step, the step's
    `step_metrics` (lengths of right and wrong completions, the zero-variance token share),
    since this is what the loop calls with each step's batch and rewards."""

    strict_reward_fn: RewardFn | None
    train_reward_fn: RewardFn | None
    every: int
    samples: int
    gap: float

    def __call__(self, step: int, batch: RolloutBatch, rewards: torch.Tensor) -> dict[str, float]:
        measured = step_metrics(batch, rewards)
        if (
            self.strict_reward_fn is None
            or self.every <= 0
            or step % self.every
            or not len(rewards)
        ):
            return measured
        record = monitor_hacking(
            self.strict_reward_fn, batch, rewards, self.samples, self.gap, self.train_reward_fn
        )
        if record["monitor/flagged"]:
            tqdm.write(
                f"[rlvr] step {step}: training reward {record['monitor/train_reward']:.2f}"
                f" but strict accuracy {record['monitor/strict_acc']:.2f} on the same "
                "completions: the reward is being gamed (see docs/metrics.md, monitor/)",
                file=sys.stderr,
            )
        return measured | record


def sample_records(
    step: int, batch: RolloutBatch, rewards: torch.Tensor, samples: int
) -> list[dict[str, Any]]:
    """The first `samples` completions of the step, as plain data for samples.jsonl."""
    out = []
    for i in range(min(samples, len(batch.completions))):
        row = batch.row_of(i)
        out.append(
            {
                "step": step,
                "prompt": row.get("prompt"),
                "answer": row.get("answer"),
                "completion": batch.completions[i],
                "reward": rewards[i].item(),
                "truncated": bool(batch.truncated[i]),
            }
        )
    return out
