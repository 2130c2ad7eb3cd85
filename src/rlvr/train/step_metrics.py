"""Per-step diagnostics of the GRPO family's failure modes, from the step's rollouts and rewards.

- length bias: the mean completion length of right and of wrong completions
  (`length_by_correctness`);
- zero-variance groups: the share of the step's completion tokens that went to groups whose
  rewards are all equal, and, given the seconds spent generating and verifying, the seconds
  that share stands for (`zero_variance_cost`).

`step_metrics` is both for one step's `RolloutBatch` and rewards. With dynamic sampling the
batch the loop sees holds only kept groups: the dropped rounds are `sampling/tries` and
`sampling/kept_groups` of the rollout's metrics.
"""

from __future__ import annotations

import torch

from rlvr import algo
from rlvr.rollout.sampler import RolloutBatch


def length_by_correctness(lengths: torch.Tensor, rewards: torch.Tensor) -> dict[str, float]:
    """`completion/len_correct_mean`: the mean of `lengths` ([N] completion tokens) over the
    completions whose reward ([N]) is at least 1 (divided by their count);
    `completion/len_wrong_mean`: the same over those below 1. A key is absent when no
    completion of its kind is in the step."""
    lengths, right = lengths.float(), rewards >= 1.0
    out = {}
    if right.any():
        out["completion/len_correct_mean"] = lengths[right].mean().item()
    if (~right).any():
        out["completion/len_wrong_mean"] = lengths[~right].mean().item()
    return out


def zero_variance_cost(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    lengths: torch.Tensor,
    seconds: float | None = None,
) -> dict[str, float]:
    """`zero_std/token_frac`: the completion tokens (`lengths`, [N]) of the groups whose
    rewards are all equal (as `frac_zero_std_groups` counts them; a group of one is one),
    divided by all the step's completion tokens (0.0 for an empty step). With `seconds` (the
    step's generate + verify seconds), `zero_std/seconds`: that share of them, an estimate
    that takes a token to cost the same wherever it is."""
    total = lengths.float().sum()
    if len(rewards) == 0 or total <= 0:
        share = 0.0
    else:
        constant = ~algo.dynamic_sampling_keep(rewards, group_ids)
        share = (lengths.float()[constant].sum() / total).item()
    out = {"zero_std/token_frac": share}
    if seconds is not None:
        out["zero_std/seconds"] = share * seconds
    return out


def step_metrics(
    batch: RolloutBatch, rewards: torch.Tensor, times: dict[str, float] | None = None
) -> dict[str, float]:
    """`length_by_correctness` and `zero_variance_cost` of one step ([N] verifier rewards);
    `times` (the step's `time/*`, when known) gives `zero_std/seconds` from
    `time/generate_s` + `time/verify_s`. Empty for a step without completions."""
    if len(rewards) == 0:
        return {}
    seconds = None
    if times is not None:
        seconds = times.get("time/generate_s", 0.0) + times.get("time/verify_s", 0.0)
    lengths = batch.lengths
    return length_by_correctness(lengths, rewards) | zero_variance_cost(
        rewards, batch.group_ids, lengths, seconds
    )
