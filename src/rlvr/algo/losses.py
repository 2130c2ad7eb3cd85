"""The GRPO policy loss: PPO-clip surrogate + optional KL penalty, aggregated over tokens."""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algo.kl import KL_ESTIMATORS, kl_k3
from rlvr.algo.reductions import AGGREGATIONS, masked_mean

__all__ = ["clipped_surrogate", "policy_loss"]


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> tuple[Tensor, Tensor]:
    """Per-token PPO-clip loss with asymmetric clip range (DAPO's "clip-higher").

    ``ratio = exp(logp - old_logp)``,
    ``loss = -min(ratio * A, clip(ratio, 1 - epsilon_low, 1 + epsilon_high) * A)``.

    A token is clipped when the clipped branch is strictly the smaller one, i.e.
    ``ratio > 1 + epsilon_high`` with ``A > 0`` or ``ratio < 1 - epsilon_low`` with ``A < 0``;
    its loss is then constant in ``logp`` and its gradient is 0. Tokens with ``A == 0`` are
    never counted as clipped (their gradient is 0 anyway).

    No masking happens here: padded positions must hold finite log-probs (e.g. 0), otherwise
    ``exp`` can overflow and poison the backward pass. :func:`policy_loss` takes care of that.

    Args:
        logp (Tensor): ``[B, T]`` log-probs of the sampled tokens under the current policy.
        old_logp (Tensor): ``[B, T]`` log-probs under the policy that sampled them.
        advantages (Tensor): ``[B]`` per-sequence advantages, broadcast over tokens (``[B, T]``
            per-token advantages are also accepted).
        epsilon_low (float): lower clip width, ratio floor ``1 - epsilon_low``.
        epsilon_high (float): upper clip width, ratio ceiling ``1 + epsilon_high``.

    Returns:
        tuple[Tensor, Tensor]: ``per_token_loss`` ``[B, T]`` and ``is_clipped`` ``[B, T]`` bool.
    """
    if advantages.dim() == logp.dim() - 1:
        advantages = advantages.unsqueeze(-1)  # [B, 1]
    ratio = torch.exp(logp - old_logp)  # [B, T]
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * advantages
    per_token_loss = -torch.minimum(unclipped, clipped)
    is_clipped = ((ratio > 1 + epsilon_high) & (advantages > 0)) | (
        (ratio < 1 - epsilon_low) & (advantages < 0)
    )
    return per_token_loss, is_clipped


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
    kl_estimator: str = "k3",
    aggregation: str = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    max_len: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GRPO policy loss of one (micro-)batch.

    ``per_token = clipped_surrogate(...) + beta * KL_ESTIMATORS[kl_estimator](logp, ref_logp)``
    (the KL term only when ``beta > 0``), then aggregated over the masked tokens by
    ``AGGREGATIONS[aggregation]``. What the loss divides by:

    - ``"token-mean"``: the masked-token sum divided by ``num_tokens`` (default: the masked
      tokens of this batch, ``mask.sum()``).
    - ``"seq-mean-token-mean"``: each sequence's masked sum divided by its own masked-token
      count, then the sum over sequences divided by ``num_seqs`` (default ``B``).
    - ``"seq-mean-token-sum-norm"``: each sequence's masked sum divided by ``max_len``
      (required), then the sum over sequences divided by ``num_seqs`` (default ``B``).

    For gradient accumulation pass ``num_tokens`` / ``num_seqs`` of the whole optimizer step.

    Padded positions (``mask == 0``) of ``logp``, ``old_logp`` and ``ref_logp`` are replaced by
    0 before any arithmetic, so garbage there affects neither the loss, the gradient, nor the
    metrics. ``old_logp`` and ``ref_logp`` are detached.

    Metrics (python floats, no grad, masked means over all completion tokens of the batch,
    whatever the aggregation):

    - ``"policy/clip_frac"``: fraction of tokens where the clipped branch is active.
    - ``"policy/approx_kl"``: k3 estimate of ``KL(pi_old || pi)`` (the tokens were sampled from
      ``pi_old``), i.e. ``kl_k3(old_logp, logp)``; how far the update moved the policy.
    - ``"policy/kl_ref"``: the chosen estimator of ``KL(pi || pi_ref)``; only when ``beta > 0``.
    - ``"policy/ratio_mean"``: mean of ``exp(logp - old_logp)``.

    Args:
        logp (Tensor): ``[B, T]`` current-policy log-probs of the sampled tokens (with grad).
        old_logp (Tensor): ``[B, T]`` log-probs under the sampling policy.
        advantages (Tensor): ``[B]`` per-sequence advantages.
        mask (Tensor): ``[B, T]``, 1 on completion tokens, 0 on padding.
        epsilon_low (float): lower clip width (>= 0).
        epsilon_high (float): upper clip width (>= 0).
        beta (float): KL-penalty coefficient (>= 0); 0 disables the KL term.
        ref_logp (Tensor | None): ``[B, T]`` reference log-probs; required when ``beta > 0``.
        kl_estimator (str): a key of ``KL_ESTIMATORS``: ``"k1"``, ``"k2"`` or ``"k3"``.
        aggregation (str): a key of ``AGGREGATIONS``.
        num_tokens (float | None): see ``"token-mean"``.
        num_seqs (float | None): see the ``seq-mean-*`` modes.
        max_len (int | None): see ``"seq-mean-token-sum-norm"``.

    Returns:
        tuple[Tensor, dict[str, float]]: the 0-d loss and the metrics.

    Raises:
        ValueError: unknown ``aggregation`` or ``kl_estimator``; negative ``beta`` or epsilon;
            ``beta > 0`` without ``ref_logp``; mismatched shapes; ``max_len`` missing for
            ``"seq-mean-token-sum-norm"``.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(
            f"unknown aggregation {aggregation!r}; expected one of {list(AGGREGATIONS)}"
        )
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(
            f"unknown kl_estimator {kl_estimator!r}; expected one of {list(KL_ESTIMATORS)}"
        )
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if epsilon_low < 0 or epsilon_high < 0:
        raise ValueError(f"epsilons must be >= 0, got {epsilon_low=}, {epsilon_high=}")
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 requires ref_logp")
    for name, tensor in (("old_logp", old_logp), ("mask", mask), ("ref_logp", ref_logp)):
        if tensor is not None and tensor.shape != logp.shape:
            raise ValueError(
                f"{name} shape {tuple(tensor.shape)} must equal logp shape {tuple(logp.shape)}"
            )
    if logp.dim() != 2 or advantages.shape != logp.shape[:1]:
        raise ValueError(
            f"expected logp [B, T] and advantages [B], got {tuple(logp.shape)} and "
            f"{tuple(advantages.shape)}"
        )

    keep = mask.bool()
    zero = logp.new_zeros(())
    logp = torch.where(keep, logp, zero)
    old_logp = torch.where(keep, old_logp.detach(), zero)
    advantages = advantages.detach()

    per_token, is_clipped = clipped_surrogate(logp, old_logp, advantages, epsilon_low, epsilon_high)
    kl_ref = None
    if beta > 0:
        assert ref_logp is not None
        ref_logp = torch.where(keep, ref_logp.detach(), zero)
        kl_ref = KL_ESTIMATORS[kl_estimator](logp, ref_logp)
        per_token = per_token + beta * kl_ref

    loss = AGGREGATIONS[aggregation](
        per_token, mask, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len
    )

    with torch.no_grad():
        metrics = {
            "policy/clip_frac": masked_mean(is_clipped.float(), mask).item(),
            "policy/approx_kl": masked_mean(kl_k3(old_logp, logp), mask).item(),
            "policy/ratio_mean": masked_mean(torch.exp(logp - old_logp), mask).item(),
        }
        if kl_ref is not None:
            metrics["policy/kl_ref"] = masked_mean(kl_ref, mask).item()
    return loss, metrics
