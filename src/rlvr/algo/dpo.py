"""DPO and IPO: preference losses on (chosen, rejected) completion pairs against a frozen reference.

Pure tensor formulas on per-sequence log-probs. With ``h`` the difference of log-ratios of a
pair,

    h = [log pi(y_c|x) - log pi(y_r|x)] - [log ref(y_c|x) - log ref(y_r|x)]

- ``"sigmoid"`` (DPO, Rafailov et al. 2023, eq. 7; label smoothing as cDPO, Mitchell 2023):
  ``-(1 - eps) * log sigmoid(beta * h) - eps * log sigmoid(-beta * h)``;
- ``"ipo"`` (IPO, Azar et al. 2023, eq. 17): ``(h - 1 / (2 * beta))**2``, ``beta`` being the
  paper's tau.

Log-probs are *sums* over each completion's tokens (EOS included, padding excluded) for both
losses, as the papers define log pi(y|x). Deviation from TRL, stated: TRL's DPOTrainer divides
the summed log-probs by the completion length when ``loss_type == "ipo"`` (a per-token mean);
this module follows the IPO paper and uses the sum for IPO too, so ``1 / (2 * beta)`` is a
target margin in nats per sequence, not per token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor

from rlvr.algo.reductions import masked_sum

__all__ = ["DPO_LOSSES", "dpo_loss", "ipo_pair_losses", "sequence_logps", "sigmoid_pair_losses"]


def sequence_logps(token_logps: Tensor, mask: Tensor) -> Tensor:
    """Per-sequence log-prob: the sum of each row's masked per-token log-probs.

    Args:
        token_logps (Tensor): ``[N, T]`` log-prob of each completion token; positions where
            ``mask`` is 0 may hold anything (``inf``, ``nan``): they are selected away.
        mask (Tensor): ``[N, T]``, 1 on completion tokens (EOS included), 0 on padding.

    Returns:
        Tensor: ``[N]``, ``sum_t mask[n, t] * token_logps[n, t]``. Nothing is divided; an
        all-padding row gives 0.
    """
    if token_logps.dim() != 2:
        raise ValueError(f"token_logps must be [N, T], got shape {tuple(token_logps.shape)}")
    return masked_sum(token_logps, mask, dim=1)


def sigmoid_pair_losses(h: Tensor, beta: float, label_smoothing: float = 0.0) -> Tensor:
    """DPO's per-pair loss ``-(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)``: ``[P]``
    from ``h [P]`` (``eps = label_smoothing``; 0 is the original DPO)."""
    return -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(
        -beta * h
    )


def ipo_pair_losses(h: Tensor, beta: float, label_smoothing: float = 0.0) -> Tensor:
    """IPO's per-pair loss ``(h - 1 / (2 beta))**2``: ``[P]`` from ``h [P]``. IPO has no label
    smoothing: a nonzero ``label_smoothing`` raises ``ValueError``."""
    if label_smoothing:
        raise ValueError("label_smoothing applies to the sigmoid (DPO) loss only, not IPO")
    return (h - 1 / (2 * beta)) ** 2


DPO_LOSSES: dict[str, Callable[[Tensor, float, float], Tensor]] = {
    "sigmoid": sigmoid_pair_losses,
    "ipo": ipo_pair_losses,
}
"""Per-pair preference losses by `loss_type`: ``(h [P], beta, label_smoothing) -> [P]``."""


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    num_pairs: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """(loss, metrics) of a batch of P preference pairs.

    Every input is ``[P]``: per-sequence summed log-probs (`sequence_logps`) of the chosen and
    the rejected completion under the policy (with gradient) and the frozen reference (no
    gradient needed). ``loss = sum_p pair_loss_p / num_pairs``: the mean over pairs by default
    (``num_pairs = P``); under micro-batching pass the number of pairs of the whole optimizer
    step, so the micro-batch losses add up to the step's mean.

    Metrics (floats, means over the P pairs of this call): ``rewards/chosen`` and
    ``rewards/rejected`` (the implicit rewards ``beta * (log pi - log ref)``),
    ``rewards/margin`` (chosen minus rejected) and ``rewards/accuracy`` (share of pairs whose
    chosen implicit reward is strictly above the rejected one).
    """
    if loss_type not in DPO_LOSSES:
        raise ValueError(f"loss_type must be one of {sorted(DPO_LOSSES)}, got {loss_type!r}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    if num_pairs is not None and not num_pairs > 0:
        raise ValueError(f"num_pairs must be > 0, got {num_pairs}")
    shape = policy_chosen_logps.shape
    for other in (policy_rejected_logps, ref_chosen_logps, ref_rejected_logps):
        if other.shape != shape or len(shape) != 1:
            raise ValueError(f"every log-prob input must be the same [P] shape, got {tuple(shape)}")
    chosen_ratio = policy_chosen_logps - ref_chosen_logps.detach()  # [P]
    rejected_ratio = policy_rejected_logps - ref_rejected_logps.detach()  # [P]
    h = chosen_ratio - rejected_ratio  # [P]
    losses = DPO_LOSSES[loss_type](h, beta, label_smoothing)
    divisor = shape[0] if num_pairs is None else num_pairs
    loss = losses.sum() / max(divisor, 1)
    chosen_reward = beta * chosen_ratio.detach()
    rejected_reward = beta * rejected_ratio.detach()
    metrics = {
        "rewards/chosen": float(chosen_reward.mean()) if shape[0] else 0.0,
        "rewards/rejected": float(rejected_reward.mean()) if shape[0] else 0.0,
        "rewards/margin": float((chosen_reward - rejected_reward).mean()) if shape[0] else 0.0,
        "rewards/accuracy": float((chosen_reward > rejected_reward).float().mean())
        if shape[0]
        else 0.0,
    }
    return loss, metrics
