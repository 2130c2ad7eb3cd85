"""Per-group statistics of a flat reward vector, shared by the advantage estimators and DAPO.

A completion ``i`` belongs to the group ``group_ids[i]`` (the completions sampled for the same
prompt). Group ids are arbitrary integers: they need not be contiguous or sorted, and groups may
have different sizes. :class:`GroupStats` maps them to ``0..G-1`` once (``torch.unique``) and
keeps the per-group sums, sizes and the "all rewards equal" flag that the estimators need.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["GroupStats", "as_float"]


def as_float(values: Tensor) -> Tensor:
    """``values`` itself if it is a floating-point tensor, else a copy in the default float dtype.

    Args:
        values (Tensor): any shape, any dtype (e.g. integer rewards or lengths).

    Returns:
        Tensor: same shape, floating point.
    """
    return values if values.dtype.is_floating_point else values.to(torch.get_default_dtype())


class GroupStats:
    """Per-group statistics of a flat reward vector; checks the shapes and dtypes on the way.

    Attributes:
        inverse (Tensor): ``[N]`` long, index of each element's group in ``0..G-1``.
        counts (Tensor): ``[G]`` group sizes (in the reward dtype).
        sums (Tensor): ``[G]`` reward sums.
        constant (Tensor): ``[G]`` bool, True where all rewards of the group are equal (a group
            of one included).
    """

    def __init__(self, rewards: Tensor, group_ids: Tensor) -> None:
        """Group ``rewards`` by ``group_ids`` and compute the per-group statistics.

        Args:
            rewards (Tensor): ``[N]`` float rewards (see :func:`as_float`).
            group_ids (Tensor): ``[N]`` integer group id of each reward (arbitrary values).

        Raises:
            ValueError: ``rewards`` not 1-D, ``group_ids`` of another shape, or ``group_ids``
                not an integer tensor.
        """
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
