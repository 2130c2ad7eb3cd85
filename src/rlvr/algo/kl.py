"""Per-token estimators of ``KL(pi || pi_ref)`` from the log-probs of sampled tokens.

The tokens were sampled from ``pi`` (the policy), ``logp`` is ``log pi(token)`` and ``ref_logp``
is ``log pi_ref(token)``. With ``log_r = ref_logp - logp`` (the log of ``r = pi_ref / pi``),
Schulman's estimators (http://joschu.net/blog/kl-approx.html) are:

- k1 = ``-log_r``: unbiased, high variance, can be negative per token.
- k2 = ``0.5 * log_r**2``: biased, low variance, always >= 0.
- k3 = ``(r - 1) - log_r``: unbiased, low variance, always >= 0 (the GRPO / DeepSeekMath term).

All take and return ``[B, T]`` tensors (any matching shapes work); no masking happens here.

Two places to put the penalty ``beta * KL``:

- **In the loss** (GRPO, ``policy_loss(beta=..., kl_estimator=...)``): the estimator is a
  differentiable term of the loss at each token; its gradient acts on that token only and does
  not go through the advantages. k3 is the usual choice.
- **In the reward** (PPO / verl ``use_kl_in_reward``, :func:`kl_in_reward`): the detached
  per-token estimate is subtracted from the per-token reward, so it is a *reward*: through the
  returns (GAE, REINFORCE++) every token is charged for the KL of itself and all later tokens,
  the gradient of the KL-regularised objective. k1 is the usual choice (its sum over a
  completion is ``log pi(y) / pi_ref(y)``, the unbiased sequence KL sample). Given ``[B]``
  outcome rewards, :func:`kl_in_reward` subtracts that per-completion sum instead, so a
  sequence-level estimator sees the same total penalty.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["KL_ESTIMATORS", "kl_in_reward", "kl_k1", "kl_k2", "kl_k3"]


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 estimator: ``logp - ref_logp``.

    Args:
        logp (Tensor): ``[B, T]`` policy log-probs of the sampled tokens.
        ref_logp (Tensor): ``[B, T]`` reference log-probs of the same tokens.

    Returns:
        Tensor: ``[B, T]`` per-token estimate; can be negative.
    """
    return logp - ref_logp


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 estimator: ``0.5 * (logp - ref_logp)**2``.

    Args:
        logp (Tensor): ``[B, T]`` policy log-probs of the sampled tokens.
        ref_logp (Tensor): ``[B, T]`` reference log-probs of the same tokens.

    Returns:
        Tensor: ``[B, T]`` per-token estimate, >= 0.
    """
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimator: ``exp(ref_logp - logp) - (ref_logp - logp) - 1``.

    Unbiased and non-negative (``exp(x) >= 1 + x``); 0 exactly where ``logp == ref_logp``.

    Args:
        logp (Tensor): ``[B, T]`` policy log-probs of the sampled tokens.
        ref_logp (Tensor): ``[B, T]`` reference log-probs of the same tokens.

    Returns:
        Tensor: ``[B, T]`` per-token estimate, >= 0.
    """
    log_r = ref_logp - logp
    # expm1(x) = exp(x) - 1 without the cancellation of exp(x) - 1 for small x.
    return torch.expm1(log_r) - log_r


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
}
"""KL estimators by name; each is ``f(logp, ref_logp) -> [B, T]``."""


def kl_in_reward(
    rewards: Tensor,
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    beta: float,
    estimator: str = "k1",
) -> Tensor:
    """Fold the KL penalty into the reward: ``r - beta * KL``, per token; the shape is kept.

    With ``kl = KL_ESTIMATORS[estimator](logp, ref_logp)`` (``[B, T]``, padding selected away):

    - ``rewards`` ``[B, T]`` (per-token, e.g. :func:`rlvr.algo.gae.outcome_to_token_rewards`)
      gives ``[B, T]``: ``out[b, t] = rewards[b, t] - beta * kl[b, t]`` on completion tokens,
      0 on padding. This is PPO's / verl's ``use_kl_in_reward``; feed it to a per-token
      estimator (GAE, REINFORCE++'s returns).
    - ``rewards`` ``[B]`` (outcome) gives ``[B]``: ``out[b] = rewards[b] - beta * sum_t
      mask[b, t] * kl[b, t]``, the per-token penalties summed over the completion (not divided
      by its length): exactly what the per-token rewards above add up to, i.e. the ``gamma = 1``
      return of the first token. Feed it to a sequence-level estimator
      (:data:`rlvr.algo.advantages.ADVANTAGE_ESTIMATORS`).

    Everything is detached: the penalty is a reward, not a loss term (see the module docstring
    for the difference).

    Args:
        rewards (Tensor): ``[B]`` outcome or ``[B, T]`` per-token rewards.
        logp (Tensor): ``[B, T]`` log-probs of the sampled tokens under the policy that sampled
            them (the rollout's).
        ref_logp (Tensor): ``[B, T]`` reference log-probs of the same tokens.
        mask (Tensor): ``[B, T]``, 1 on completion tokens, 0 on padding.
        beta (float): penalty coefficient (>= 0).
        estimator (str): a key of :data:`KL_ESTIMATORS`; default ``"k1"``.

    Returns:
        Tensor: rewards of ``rewards``' shape (float); ``[B, T]`` output is 0 on padding.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; expected one of {list(KL_ESTIMATORS)}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    for name, tensor in (("ref_logp", ref_logp), ("mask", mask)):
        if tensor.shape != logp.shape:
            raise ValueError(
                f"{name} shape {tuple(tensor.shape)} must equal logp shape {tuple(logp.shape)}"
            )
    if rewards.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(
            f"rewards must be [B] or [B, T] with [B, T] = {tuple(logp.shape)}, got "
            f"{tuple(rewards.shape)}"
        )
    kl_fn = KL_ESTIMATORS[estimator]
    keep = mask.bool()
    zero = logp.new_zeros(())
    logp = torch.where(keep, logp.detach(), zero)
    ref_logp = torch.where(keep, ref_logp.detach(), zero)
    penalty = torch.where(keep, beta * kl_fn(logp, ref_logp), zero)  # [B, T]
    rewards = rewards.detach().to(logp.dtype)
    if rewards.dim() == 1:
        return rewards - penalty.sum(dim=1)
    return torch.where(keep, rewards - penalty, zero)
