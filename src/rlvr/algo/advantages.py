"""Sequence-level advantages for outcome rewards: GRPO, Dr. GRPO, RLOO, REINFORCE++.

Each completion ``i`` has a scalar reward ``rewards[i]`` and belongs to the group
``group_ids[i]`` (the completions sampled for the same prompt). Group ids are arbitrary
integers: they need not be contiguous or sorted, and groups may have different sizes. All
functions are vectorised over groups (:class:`rlvr.algo.groups.GroupStats`: ``torch.unique`` +
``index_add`` / ``scatter_reduce``).

Groups whose rewards are all equal (including groups of one completion) carry no learning
signal; every group-baselined function here gives their members an advantage of exactly 0.0
(not a floating-point residue such as 1e-17), whatever ``eps``. The one exception is
:func:`advantages_reinforce_pp`, whose baseline is the *batch* mean: there only an all-equal
batch gives exactly 0. :data:`GROUP_BASELINE_ESTIMATORS` names the group-baselined estimators,
which therefore need groups of at least 2 completions.

The estimators a config picks by name live in :data:`ADVANTAGE_ESTIMATORS`, all with the call
``fn(rewards[N], group_ids[N], *, scale_rewards="group", eps=1e-4) -> advantages[N]``:

- ``"grpo"``: ``A_i = (r_i - mean_g) / scale_i``; honours ``scale_rewards`` (below).
- ``"dr_grpo"``: ``A_i = r_i - mean_g``; never divides.
- ``"rloo"``: ``A_i = r_i - (mean of the other N_g - 1 rewards of g)``; never divides.
- ``"reinforce++"``: ``A_i = (r_i - mean_B) / (std_B(r) + eps)``; always the batch.
- ``"reinforce++-baseline"``: ``c_i = r_i - mean_g``, ``A_i = c_i / (std_B(c) + eps)``; always
  the batch.

``mean_g`` is the mean reward of ``i``'s group, ``mean_B`` the mean over all ``N`` rewards of
the batch. Every std is the unbiased sample std (``N - 1`` denominator, ``torch.std``'s and
TRL's); a set of one element has std 0.

``scale_rewards`` (:data:`REWARD_SCALES`) picks GRPO's divisor ``scale_i``:

- ``"group"``: ``eps`` plus the std of the rewards of ``i``'s group,
  ``sqrt(sum_{j in g} (r_j - mean_g)**2 / (N_g - 1))`` (GRPO, TRL's ``scale_rewards="group"``);
- ``"batch"``: ``eps`` plus the std of *all* ``N`` rewards of the batch,
  ``sqrt(sum_j (r_j - mean_B)**2 / (N - 1))``, one number for every completion (TRL's
  ``scale_rewards="batch"``; the std of the raw rewards, so between-group spread counts too);
- ``"none"``: no division and no ``eps`` (then ``"grpo"`` equals ``"dr_grpo"``).

The other estimators accept the keyword for a uniform call signature and ignore it (an
unknown value still raises): their scaling is part of their definition.

Advantages are constants of the policy loss; these functions are not meant to be
differentiated through.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rlvr.algo.groups import GroupStats, as_float

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "GROUP_BASELINE_ESTIMATORS",
    "REWARD_SCALES",
    "advantages_dr_grpo",
    "advantages_grpo",
    "advantages_reinforce_pp",
    "advantages_reinforce_pp_baseline",
    "advantages_rloo",
    "scale_by_batch_std",
    "scale_by_group_std",
    "scale_none",
    "zero_std_group_fraction",
]


def _group_centred(rewards: Tensor, groups: GroupStats) -> Tensor:
    """``[N]`` reward minus the mean reward of its group, ``r_i - sum_g / N_g``."""
    mean = groups.sums / groups.counts.clamp(min=1)  # [G]
    return rewards - mean[groups.inverse]  # [N]


def _zero_constant_groups(advantages: Tensor, groups: GroupStats) -> Tensor:
    """``advantages`` with the members of all-equal groups set to exactly 0.0."""
    return torch.where(groups.constant[groups.inverse], torch.zeros_like(advantages), advantages)


def zero_std_group_fraction(rewards: Tensor, group_ids: Tensor) -> float:
    """Fraction of groups whose rewards are all equal (the diagnostic ``frac_zero_std_groups``).

    Counts groups, not completions: the number of groups with ``max == min`` reward divided by
    the number of distinct group ids. A group of size 1 counts as zero-std. An empty batch
    (``N == 0``) gives 0.0.

    Args:
        rewards (Tensor): ``[N]`` rewards.
        group_ids (Tensor): ``[N]`` integer group id of each reward.

    Returns:
        float: in ``[0, 1]``.
    """
    groups = GroupStats(as_float(rewards), group_ids)
    if groups.constant.numel() == 0:
        return 0.0
    return groups.constant.float().mean().item()


# ----------------------------------------------------------------------------- reward scales


def _sample_std(centred: Tensor) -> Tensor:
    """Unbiased std of an already-centred 1-D tensor: ``sqrt(sum c**2 / (n - 1))``, 0 for n <= 1."""
    return torch.sqrt((centred**2).sum() / max(centred.numel() - 1, 1))


def scale_by_group_std(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-4) -> Tensor:
    """Divisor ``"group"``: each reward's group std plus ``eps``.

    ``scale_i = sqrt(sum_{j in g} (r_j - mean_g)**2 / (N_g - 1)) + eps`` with ``g`` the group of
    ``i`` (a group of one has std 0, so its divisor is ``eps``).

    Args:
        rewards (Tensor): ``[N]`` rewards.
        group_ids (Tensor): ``[N]`` integer group ids.
        eps (float): added to the std.

    Returns:
        Tensor: ``[N]`` divisors.
    """
    rewards = as_float(rewards)
    groups = GroupStats(rewards, group_ids)
    centred = _group_centred(rewards, groups)  # [N]
    sq_dev = rewards.new_zeros(groups.counts.shape).index_add_(0, groups.inverse, centred**2)
    std = torch.sqrt(sq_dev / (groups.counts - 1).clamp(min=1))  # [G]
    return std[groups.inverse] + eps


def scale_by_batch_std(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-4) -> Tensor:
    """Divisor ``"batch"``: the std of all ``N`` rewards plus ``eps``, the same for every reward.

    ``scale_i = sqrt(sum_j (r_j - mean_B)**2 / (N - 1)) + eps`` over the whole batch, groups
    ignored (TRL's ``scale_rewards="batch"``). A batch of one reward has std 0.

    Args:
        rewards (Tensor): ``[N]`` rewards.
        group_ids (Tensor): ``[N]`` integer group ids (only checked).
        eps (float): added to the std.

    Returns:
        Tensor: ``[N]`` divisors (all equal).
    """
    rewards = as_float(rewards)
    GroupStats(rewards, group_ids)  # shape and dtype checks
    if rewards.numel() == 0:
        return rewards.clone()
    std = _sample_std(rewards - rewards.mean())
    return (std + eps).expand_as(rewards).clone()


def scale_none(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-4) -> Tensor:
    """Divisor ``"none"``: exactly 1 for every reward (``eps`` is ignored).

    Args:
        rewards (Tensor): ``[N]`` rewards.
        group_ids (Tensor): ``[N]`` integer group ids (only checked).
        eps (float): ignored.

    Returns:
        Tensor: ``[N]`` ones.
    """
    del eps
    rewards = as_float(rewards)
    GroupStats(rewards, group_ids)  # shape and dtype checks
    return torch.ones_like(rewards)


REWARD_SCALES: dict[str, Callable[..., Tensor]] = {
    "group": scale_by_group_std,
    "batch": scale_by_batch_std,
    "none": scale_none,
}
"""GRPO's advantage divisors by ``scale_rewards`` name; each is
``f(rewards[N], group_ids[N], *, eps) -> divisor[N]``."""


def _check_scale(scale_rewards: str) -> None:
    """Raise ``ValueError`` unless ``scale_rewards`` is a key of :data:`REWARD_SCALES`."""
    if scale_rewards not in REWARD_SCALES:
        raise ValueError(
            f"unknown scale_rewards {scale_rewards!r}; expected one of {list(REWARD_SCALES)}"
        )


# ----------------------------------------------------------------------------- estimators


def advantages_grpo(
    rewards: Tensor, group_ids: Tensor, *, scale_rewards: str = "group", eps: float = 1e-4
) -> Tensor:
    """Estimator ``"grpo"``: reward minus its group mean, over ``REWARD_SCALES[scale_rewards]``.

    ``A_i = (r_i - mean_g) / scale_i``; ``scale_i`` is ``std_g + eps`` (``"group"``, the default,
    the default), ``std_B + eps`` (``"batch"``) or 1 (``"none"``). See the
    module docstring for the exact stds. Zero-variance groups (and groups of one) get exactly 0.

    Args:
        rewards (Tensor): ``[N]`` rewards; an integer tensor is cast to the default float dtype.
        group_ids (Tensor): ``[N]`` integer group id of each reward (arbitrary values).
        scale_rewards (str): a key of :data:`REWARD_SCALES`.
        eps (float): added to the std (not used by ``"none"``).

    Returns:
        Tensor: ``[N]`` advantages, float.
    """
    _check_scale(scale_rewards)
    scale_fn = REWARD_SCALES[scale_rewards]
    rewards = as_float(rewards)
    groups = GroupStats(rewards, group_ids)
    advantages = _group_centred(rewards, groups) / scale_fn(rewards, group_ids, eps=eps)
    return _zero_constant_groups(advantages, groups)


def advantages_dr_grpo(
    rewards: Tensor, group_ids: Tensor, *, scale_rewards: str = "group", eps: float = 1e-4
) -> Tensor:
    """Estimator ``"dr_grpo"`` (Liu et al. 2025, Dr. GRPO): ``A_i = r_i - mean_g``, never divided.

    ``scale_rewards`` and ``eps`` are accepted for the uniform signature and ignored (an unknown
    ``scale_rewards`` still raises). Zero-variance groups get exactly 0.

    Args:
        rewards (Tensor): ``[N]`` rewards.
        group_ids (Tensor): ``[N]`` integer group ids.
        scale_rewards (str): ignored (checked).
        eps (float): ignored.

    Returns:
        Tensor: ``[N]`` advantages, float.
    """
    del eps
    _check_scale(scale_rewards)
    rewards = as_float(rewards)
    groups = GroupStats(rewards, group_ids)
    return _zero_constant_groups(_group_centred(rewards, groups), groups)


def advantages_rloo(
    rewards: Tensor, group_ids: Tensor, *, scale_rewards: str = "group", eps: float = 1e-4
) -> Tensor:
    """Estimator ``"rloo"``: reward minus the mean of the *other* ``N_g - 1`` rewards of its group.

    ``A_i = r_i - (sum_g - r_i) / (N_g - 1) = N_g / (N_g - 1) * (r_i - mean_g)``. A group of one
    (no other member) gets 0; a zero-variance group gets exactly 0. ``scale_rewards`` and ``eps``
    are accepted for the uniform signature and ignored (an unknown ``scale_rewards`` still
    raises).

    Args:
        rewards (Tensor): ``[N]`` rewards.
        group_ids (Tensor): ``[N]`` integer group ids.
        scale_rewards (str): ignored (checked).
        eps (float): ignored.

    Returns:
        Tensor: ``[N]`` advantages, float.
    """
    del eps
    _check_scale(scale_rewards)
    rewards = as_float(rewards)
    groups = GroupStats(rewards, group_ids)
    counts = groups.counts[groups.inverse]  # [N]
    loo_mean = (groups.sums[groups.inverse] - rewards) / (counts - 1).clamp(min=1)
    advantages = rewards - loo_mean
    zero = groups.constant[groups.inverse] | (counts < 2)
    return torch.where(zero, torch.zeros_like(advantages), advantages)


def advantages_reinforce_pp(
    rewards: Tensor, group_ids: Tensor, *, scale_rewards: str = "group", eps: float = 1e-4
) -> Tensor:
    """Estimator ``"reinforce++"`` (Hu et al. 2025, arXiv:2501.03262): batch-normalised reward.

    ``A_i = (r_i - mean_B) / (std_B + eps)`` with ``mean_B`` and ``std_B`` (unbiased, ``N - 1``)
    over all ``N`` rewards of the batch; groups are ignored (the baseline is global, so a group
    whose rewards are all equal still gets a nonzero advantage unless the whole batch is
    constant, which gives exactly 0).

    This is REINFORCE++ for an outcome reward with ``gamma = 1`` (every token's return is the
    sequence's reward) normalised over *sequences*. The paper and verl whiten the per-token
    returns over the batch's *tokens*, so a long completion weighs more in the mean and std;
    :func:`rlvr.algo.gae.reinforce_pp_token_advantages` is that per-token form (needed once a
    KL penalty is folded into per-token rewards).

    Args:
        rewards (Tensor): ``[N]`` rewards.
        group_ids (Tensor): ``[N]`` integer group ids (only checked).
        scale_rewards (str): ignored (checked); the scale is always the batch std.
        eps (float): added to the batch std.

    Returns:
        Tensor: ``[N]`` advantages, float.
    """
    _check_scale(scale_rewards)
    rewards = as_float(rewards)
    GroupStats(rewards, group_ids)  # shape and dtype checks
    if rewards.numel() == 0:
        return rewards.clone()
    centred = rewards - rewards.mean()
    advantages = centred / (_sample_std(centred) + eps)
    constant = rewards.max() == rewards.min()
    return torch.where(constant, torch.zeros_like(advantages), advantages)


def advantages_reinforce_pp_baseline(
    rewards: Tensor, group_ids: Tensor, *, scale_rewards: str = "group", eps: float = 1e-4
) -> Tensor:
    """Estimator ``"reinforce++-baseline"``: group-mean baseline, then divide by the *batch* std.

    ``c_i = r_i - mean_g`` (exactly 0 in zero-variance groups), then
    ``A_i = c_i / (std_B(c) + eps)`` with ``std_B(c) = sqrt(sum_j c_j**2 / (N - 1))`` over all
    ``N`` completions of the batch: the std of the group-centred rewards, not of the raw ones
    (so, unlike ``"grpo"`` with ``scale_rewards="batch"``, the spread *between* groups does not
    enlarge the divisor). The paper also subtracts the batch mean of ``c``; over sequences that
    mean is exactly 0 (every group's ``c`` sums to 0), so it is not subtracted here. As for
    ``"reinforce++"``, verl whitens over tokens instead of sequences.

    Args:
        rewards (Tensor): ``[N]`` rewards.
        group_ids (Tensor): ``[N]`` integer group ids.
        scale_rewards (str): ignored (checked); the scale is always the batch std of ``c``.
        eps (float): added to the batch std.

    Returns:
        Tensor: ``[N]`` advantages, float.
    """
    _check_scale(scale_rewards)
    rewards = as_float(rewards)
    groups = GroupStats(rewards, group_ids)
    centred = _zero_constant_groups(_group_centred(rewards, groups), groups)  # exact zeros
    if centred.numel() == 0:
        return centred
    divisor = _sample_std(centred) + eps
    # divisor 0 only when every group is constant and eps = 0: all advantages are then 0
    return torch.where(divisor > 0, centred / torch.where(divisor > 0, divisor, 1.0), centred)


ADVANTAGE_ESTIMATORS: dict[str, Callable[..., Tensor]] = {
    "grpo": advantages_grpo,
    "dr_grpo": advantages_dr_grpo,
    "rloo": advantages_rloo,
    "reinforce++": advantages_reinforce_pp,
    "reinforce++-baseline": advantages_reinforce_pp_baseline,
}
"""Sequence-level advantage estimators by name; each is
``f(rewards[N], group_ids[N], *, scale_rewards="group", eps=1e-4) -> advantages[N]``."""

GROUP_BASELINE_ESTIMATORS: frozenset[str] = frozenset(
    {"grpo", "dr_grpo", "rloo", "reinforce++-baseline"}
)
"""The keys of :data:`ADVANTAGE_ESTIMATORS` whose baseline is a statistic of the completion's own
group (its mean, or the mean of the other members). They need at least 2 completions per prompt:
in a group of one the baseline is the reward itself, so every advantage is exactly 0 (and
``"rloo"`` has no other member to average). ``"reinforce++"`` is absent: its baseline is the
batch mean."""
