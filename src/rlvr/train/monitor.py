"""What the loop records beside the update: the hacking monitor and the step's samples."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from rlvr.rollout.sampler import RolloutBatch
from rlvr.tasks.rewards import RewardFn, reward_columns, total_rewards


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
    verifier), with a warning on stderr when a step is flagged."""

    strict_reward_fn: RewardFn | None
    train_reward_fn: RewardFn | None
    every: int
    samples: int
    gap: float

    def __call__(self, step: int, batch: RolloutBatch, rewards: torch.Tensor) -> dict[str, float]:
        if (
            self.strict_reward_fn is None
            or self.every <= 0
            or step % self.every
            or not len(rewards)
        ):
            return {}
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
        return record


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
