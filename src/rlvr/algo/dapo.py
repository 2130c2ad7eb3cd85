"""DAPO's sampling-side patches (Yu et al. 2025, arXiv:2503.14476) as pure tensor functions.

- :func:`dynamic_sampling_keep`: which completions survive "dynamic sampling" (groups whose
  rewards are not all equal); the trainer keeps sampling until the batch is full.
- :func:`overlong_penalty`: the "soft overlong punishment" length penalty (eq. 13), added to
  the reward.
- :func:`truncation_mask`: "overlong filtering", taking truncated completions out of the loss.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algo.groups import GroupStats, as_float

__all__ = ["dynamic_sampling_keep", "overlong_penalty", "truncation_mask"]


def dynamic_sampling_keep(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Which completions belong to a group whose rewards are not all equal.

    A group whose rewards are all equal (all correct, all wrong, or a group of one) has zero
    group-relative advantage and so no gradient; DAPO drops such groups and samples more
    prompts until the batch is full (that loop is the trainer's). A group is kept when
    ``max_g > min_g``.

    Args:
        rewards (Tensor): ``[N]`` rewards.
        group_ids (Tensor): ``[N]`` integer group id of each reward (arbitrary values).

    Returns:
        Tensor: ``[N]`` bool, True for the members of groups to keep.
    """
    groups = GroupStats(as_float(rewards), group_ids)
    return ~groups.constant[groups.inverse]


def overlong_penalty(
    lengths: Tensor, max_len: int, buffer_len: int, penalty_factor: float = 1.0
) -> Tensor:
    """DAPO's soft overlong punishment (eq. 13), to be *added* to each completion's reward.

    With ``L = lengths[i]`` (completion tokens), ``L_max = max_len`` and ``L_cache = buffer_len``::

        0                                            if L <= L_max - L_cache
        (L_max - L_cache - L) / L_cache * factor     if L_max - L_cache < L <= L_max
        -factor                                      if L > L_max

    The middle piece falls linearly from 0 to ``-factor`` over the buffer (it is ``-factor``
    at ``L = L_max``, so the penalty is continuous). ``buffer_len == 0`` leaves only the two
    outer pieces.

    Args:
        lengths (Tensor): ``[N]`` completion lengths in tokens (integer or float).
        max_len (int): ``L_max``, the length at which the full penalty applies (> 0).
        buffer_len (int): ``L_cache``, the width of the linear zone, ``0 <= buffer_len <= max_len``.
        penalty_factor (float): the full penalty's magnitude (>= 0).

    Returns:
        Tensor: ``[N]`` penalties, float, in ``[-penalty_factor, 0]``.
    """
    if max_len <= 0:
        raise ValueError(f"max_len must be > 0, got {max_len}")
    if not 0 <= buffer_len <= max_len:
        raise ValueError(f"buffer_len must be in [0, max_len={max_len}], got {buffer_len}")
    if penalty_factor < 0:
        raise ValueError(f"penalty_factor must be >= 0, got {penalty_factor}")
    lengths = as_float(lengths)
    start = max_len - buffer_len  # the penalty starts above this length
    linear = (start - lengths) / max(buffer_len, 1) * penalty_factor
    zero = torch.zeros_like(lengths)
    penalty = torch.where(lengths <= start, zero, linear)
    return torch.where(lengths > max_len, zero - penalty_factor, penalty)


def truncation_mask(mask: Tensor, truncated: Tensor) -> Tensor:
    """DAPO's overlong filtering: zero the loss mask of every truncated completion.

    A completion cut off at the token budget is not wrong for its content, so its (usually 0)
    reward is noise; filtering removes its tokens from the loss. Pass the filtered mask to the
    loss *and* count ``num_tokens`` / ``num_seqs`` from it: a ``"token-mean"`` loss then divides
    by the remaining tokens only. (A fully masked row still counts in the default ``num_seqs``
    of the ``seq-mean-*`` modes, which divide by ``B``.)

    Args:
        mask (Tensor): ``[N, T]`` loss mask (any dtype).
        truncated (Tensor): ``[N]`` bool (or 0/1), True where the completion was truncated.

    Returns:
        Tensor: ``[N, T]`` mask of ``mask``'s dtype, rows of truncated completions all 0.
    """
    if mask.dim() != 2 or truncated.shape != mask.shape[:1]:
        raise ValueError(
            f"expected mask [N, T] and truncated [N], got {tuple(mask.shape)} and "
            f"{tuple(truncated.shape)}"
        )
    keep = ~truncated.bool()
    return torch.where(keep.unsqueeze(-1), mask, torch.zeros_like(mask))
