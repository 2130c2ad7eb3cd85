"""Group-relative advantages (GRPO, Dr. GRPO, RLOO) for outcome rewards.

Each completion ``i`` has a scalar reward ``rewards[i]`` and belongs to the group
``group_ids[i]`` (the completions sampled for the same prompt). Group ids are arbitrary
integers: they need not be contiguous or sorted, and groups may have different sizes. All
functions are vectorised over groups (``torch.unique`` + ``index_add`` / ``scatter_reduce``).

Groups whose rewards are all equal (including groups of one completion) carry no learning
signal; every function here gives their members an advantage of exactly 0.0 (not a
floating-point residue such as 1e-17), whatever ``eps``.

Advantages are constants of the policy loss; these functions are not meant to be
differentiated through.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["grpo_advantages", "rloo_advantages", "zero_std_group_fraction"]


class _Groups:
    """Per-group statistics of a flat reward vector.

    Attributes:
        inverse (Tensor): ``[N]`` long, index of each element's group in ``0..G-1``.
        counts (Tensor): ``[G]`` group sizes (in the reward dtype).
        sums (Tensor): ``[G]`` reward sums.
        constant (Tensor): ``[G]`` bool, True where all rewards of the group are equal.
    """

    def __init__(self, rewards: Tensor, group_ids: Tensor) -> None:
        if rewards.dim() != 1:
            raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
        if group_ids.shape != rewards.shape:
            raise ValueError(
                f"group_ids shape {tuple(group_ids.shape)} must equal rewards shape "
                f"{tuple(rewards.shape)}"
            )
        if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
            raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
        unique_ids, inverse = torch.unique(group_ids, return_inverse=True)
        num_groups = unique_ids.numel()
        self.inverse = inverse
        self.counts = rewards.new_zeros(num_groups).index_add_(0, inverse, torch.ones_like(rewards))
        self.sums = rewards.new_zeros(num_groups).index_add_(0, inverse, rewards)
        group_max = rewards.new_empty(num_groups).scatter_reduce_(
            0, inverse, rewards, reduce="amax", include_self=False
        )
        group_min = rewards.new_empty(num_groups).scatter_reduce_(
            0, inverse, rewards, reduce="amin", include_self=False
        )
        self.constant = group_max == group_min


def _as_float(rewards: Tensor) -> Tensor:
    return rewards if rewards.dtype.is_floating_point else rewards.to(torch.get_default_dtype())


def grpo_advantages(
    rewards: Tensor, group_ids: Tensor, eps: float = 1e-4, scale: bool = True
) -> Tensor:
    """GRPO advantages: reward minus its group mean, over the group's std.

    ``A_i = (r_i - mean_g) / (std_g + eps)`` with ``mean_g`` the mean of the rewards of ``i``'s
    group ``g`` and ``std_g`` their unbiased sample standard deviation
    (``sqrt(sum_j (r_j - mean_g)**2 / (N_g - 1))``, the ``N_g - 1`` denominator, as in TRL).
    With ``scale=False`` it is ``A_i = r_i - mean_g`` (Dr. GRPO: no std division).

    A group of size 1 gets advantage 0 (its only member equals its mean; its sample std is
    undefined and never computed). A zero-variance group (all rewards equal) gets exactly 0.

    Args:
        rewards (Tensor): ``[N]`` rewards; an integer tensor is cast to the default float dtype.
        group_ids (Tensor): ``[N]`` integer group id of each reward (arbitrary values).
        eps (float): added to the std before dividing; ignored when ``scale=False``.
        scale (bool): divide by ``std_g + eps`` (GRPO) or not (Dr. GRPO).

    Returns:
        Tensor: ``[N]`` advantages, float.
    """
    rewards = _as_float(rewards)
    groups = _Groups(rewards, group_ids)
    mean = groups.sums / groups.counts.clamp(min=1)  # [G]
    centred = rewards - mean[groups.inverse]  # [N]
    constant = groups.constant[groups.inverse]  # [N]
    if scale:
        sq_dev = rewards.new_zeros(groups.counts.shape).index_add_(0, groups.inverse, centred**2)
        std = torch.sqrt(sq_dev / (groups.counts - 1).clamp(min=1))  # [G]
        centred = centred / (std[groups.inverse] + eps)
    return torch.where(constant, torch.zeros_like(centred), centred)


def rloo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO advantages: reward minus the mean reward of the *other* members of its group.

    ``A_i = r_i - (sum_g - r_i) / (N_g - 1)``, which equals ``N_g / (N_g - 1) * (r_i - mean_g)``.
    A group of size 1 (no other member) gets 0; a zero-variance group gets exactly 0.

    Args:
        rewards (Tensor): ``[N]`` rewards; an integer tensor is cast to the default float dtype.
        group_ids (Tensor): ``[N]`` integer group id of each reward (arbitrary values).

    Returns:
        Tensor: ``[N]`` advantages, float.
    """
    rewards = _as_float(rewards)
    groups = _Groups(rewards, group_ids)
    counts = groups.counts[groups.inverse]  # [N]
    loo_mean = (groups.sums[groups.inverse] - rewards) / (counts - 1).clamp(min=1)
    advantages = rewards - loo_mean
    zero = groups.constant[groups.inverse] | (counts < 2)
    return torch.where(zero, torch.zeros_like(advantages), advantages)


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
    groups = _Groups(_as_float(rewards), group_ids)
    if groups.constant.numel() == 0:
        return 0.0
    return groups.constant.float().mean().item()
