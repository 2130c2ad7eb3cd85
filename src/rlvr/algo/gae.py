"""Per-token credit assignment: outcome reward placement, GAE (PPO with a critic), returns.

Conventions. ``mask[b, t]`` is 1 on completion tokens and 0 on padding. The recursions below
walk each row backwards over its *masked* positions only: a masked-out position is skipped
(its reward and value are never read, its output is 0) and the recursion carries across it
unchanged. For right padding (the rollout's layout) this means the recursion starts at the last
completion token with ``V(after end) = 0``, so a right-padded row gives exactly the result of
the unpadded row; left padding and masked holes (e.g. tool output) are handled the same way.

The outcome reward of a completion is placed on its *last* completion token (the position of
EOS, or the last token of a truncated completion) and every other token gets reward 0
(:func:`outcome_to_token_rewards`); a per-token KL penalty can then be added on top
(:func:`rlvr.algo.kl.kl_in_reward`).

Everything here is computed without gradient (inputs are detached): advantages and returns are
targets, not functions of the parameters.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algo.reductions import masked_whiten

__all__ = [
    "discounted_returns",
    "gae_advantages",
    "outcome_to_token_rewards",
    "reinforce_pp_token_advantages",
]


def _check_bt(name: str, tensor: Tensor, mask: Tensor) -> None:
    """Raise ``ValueError`` unless ``mask`` is ``[B, T]`` and ``tensor`` has its shape."""
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    if tensor.shape != mask.shape:
        raise ValueError(
            f"{name} shape {tuple(tensor.shape)} must equal mask shape {tuple(mask.shape)}"
        )


def outcome_to_token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Place each completion's scalar reward on its last completion token, 0 elsewhere.

    ``out[b, t] = rewards[b]`` at ``t = last_b`` (the largest ``t`` with ``mask[b, t] != 0``),
    0 everywhere else. A row without any completion token gets no reward (all 0).

    Args:
        rewards (Tensor): ``[B]`` outcome rewards.
        mask (Tensor): ``[B, T]``, 1 on completion tokens, 0 on padding.

    Returns:
        Tensor: ``[B, T]`` per-token rewards (float).
    """
    if mask.dim() != 2 or rewards.shape != mask.shape[:1]:
        raise ValueError(
            f"expected rewards [B] and mask [B, T], got {tuple(rewards.shape)} and "
            f"{tuple(mask.shape)}"
        )
    rewards = rewards.detach()
    if not rewards.dtype.is_floating_point:
        rewards = rewards.to(torch.get_default_dtype())
    keep = mask.bool()
    num_cols = mask.shape[1]
    # index of the last True per row: T - 1 - (first True of the flipped row)
    last = num_cols - 1 - keep.flip(1).int().argmax(dim=1)  # [B]
    out = rewards.new_zeros(mask.shape)
    out.scatter_(1, last.unsqueeze(1), rewards.unsqueeze(1))
    has_token = keep.any(dim=1, keepdim=True)
    return torch.where(has_token, out, torch.zeros_like(out))


def gae_advantages(
    rewards_per_token: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over each completion.

    Backwards over the masked positions ``t`` of a row, with ``t'`` the next masked position
    (``V_{t'} = 0`` and ``A_{t'} = 0`` after the last one)::

        delta_t = r_t + gamma * V_{t'} - V_t
        A_t     = delta_t + gamma * lam * A_{t'}
        R_t     = A_t + V_t                      (the value target)

    ``gamma = lam = 1`` gives ``A_t = (sum of rewards from t on) - V_t``. No whitening happens
    here; PPO implementations usually whiten ``A`` over the batch afterwards
    (:func:`rlvr.algo.reductions.masked_whiten`), while the returns stay raw.

    Args:
        rewards_per_token (Tensor): ``[B, T]`` rewards (see :func:`outcome_to_token_rewards`).
        values (Tensor): ``[B, T]`` critic values ``V_t`` of the state before token ``t``.
        mask (Tensor): ``[B, T]``, 1 on completion tokens, 0 on padding.
        gamma (float): discount, in ``[0, 1]``.
        lam (float): GAE lambda, in ``[0, 1]``.

    Returns:
        tuple[Tensor, Tensor]: ``advantages`` ``[B, T]`` and ``returns`` ``[B, T]``, both 0 on
        masked-out positions.
    """
    _check_bt("rewards_per_token", rewards_per_token, mask)
    _check_bt("values", values, mask)
    if not (0 <= gamma <= 1 and 0 <= lam <= 1):
        raise ValueError(f"gamma and lam must be in [0, 1], got {gamma=}, {lam=}")
    keep = mask.bool()
    zero = values.new_zeros(())
    rewards = torch.where(keep, rewards_per_token.detach().to(values.dtype), zero)
    values = torch.where(keep, values.detach(), zero)
    advantages = torch.zeros_like(values)
    next_value = values.new_zeros(values.shape[0])  # [B]
    next_adv = values.new_zeros(values.shape[0])  # [B]
    for t in range(values.shape[1] - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        k = keep[:, t]
        advantages[:, t] = torch.where(k, adv, zero)
        next_value = torch.where(k, values[:, t], next_value)
        next_adv = torch.where(k, adv, next_adv)
    returns = torch.where(keep, advantages + values, zero)
    return advantages, returns


def discounted_returns(rewards_per_token: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """Discounted reward-to-go ``G_t = r_t + gamma * G_{t'}`` over the masked positions.

    Equal to :func:`gae_advantages` with ``values = 0`` and ``lam = 1``. With an outcome reward
    on the last token and ``gamma = 1`` every completion token's return is the outcome reward.
    A tested reference formula: the trainer does not call it (its ``"gae"`` estimator calls
    :func:`gae_advantages`); :func:`reinforce_pp_token_advantages` builds on it.

    Args:
        rewards_per_token (Tensor): ``[B, T]`` rewards.
        mask (Tensor): ``[B, T]``, 1 on completion tokens, 0 on padding.
        gamma (float): discount, in ``[0, 1]``.

    Returns:
        Tensor: ``[B, T]`` returns, 0 on masked-out positions.
    """
    dtype = rewards_per_token.dtype
    zeros = torch.zeros_like(
        rewards_per_token, dtype=dtype if dtype.is_floating_point else torch.get_default_dtype()
    )
    returns, _ = gae_advantages(rewards_per_token, zeros, mask, gamma, 1.0)
    return returns


def reinforce_pp_token_advantages(
    rewards_per_token: Tensor, mask: Tensor, gamma: float = 1.0, eps: float = 1e-4
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu et al. 2025, arXiv:2501.03262) in its per-token form, as verl computes it.

    ``G = discounted_returns(rewards_per_token, mask, gamma)``, then
    ``A = masked_whiten(G, mask, eps)``: minus the mean of ``G`` over all completion tokens of the
    batch, over their unbiased std plus ``eps`` (tokens pooled, so long completions weigh more).
    This is the form to use when the rewards vary per token, e.g. with the KL penalty folded in
    (:func:`rlvr.algo.kl.kl_in_reward`); for outcome-only rewards the sequence-level
    ``ADVANTAGE_ESTIMATORS["reinforce++"]`` normalises over completions instead. A tested
    reference formula: the trainer does not call it (``advantage_estimator="reinforce++"`` is the
    sequence-level form).

    Args:
        rewards_per_token (Tensor): ``[B, T]`` rewards.
        mask (Tensor): ``[B, T]``, 1 on completion tokens, 0 on padding.
        gamma (float): discount, in ``[0, 1]``.
        eps (float): added to the std.

    Returns:
        tuple[Tensor, Tensor]: ``advantages`` ``[B, T]`` and ``returns`` ``[B, T]``, both 0 on
        masked-out positions.
    """
    returns = discounted_returns(rewards_per_token, mask, gamma)
    return masked_whiten(returns, mask, eps), returns
