"""Rollout correction: importance weights for completions sampled by another policy than the
one the loss scores (a stale policy in asynchronous training, or the same weights in another
engine or precision: vLLM, bf16), as pure tensor functions.

With ``logp`` the learner's log-probs of the sampled tokens under the policy the update starts
from (``pi_old``) and ``behaviour_logp`` the rollout engine's (``mu``), the per-token ratio is
``rho_t = exp(logp_t - behaviour_logp_t)`` (no gradient: it reweights, it is not optimised).
Each mode returns a weight per token and a keep mask; the loss multiplies its per-token terms
by the weight and drops the tokens outside the mask *from its mask*, so they leave the
divisor as well as the sum (slime #657 / verl #3915: zeroing a weight but keeping the token
in the denominator silently rescales the gradient).

- ``tis`` (truncated IS, Yao et al. 2025): ``w = min(rho, cap)``, every token kept.
- ``mis`` (masked IS): tokens (or whole sequences) with ``rho > cap`` are dropped, the rest
  weighted by ``rho``.
- ``icepop`` (Ling Team 2025): a two-sided band, tokens with ``rho`` outside ``[low, cap]``
  dropped, the rest weighted by ``rho``.
- ``none``: weight 1, all kept.

``level="sequence"`` uses one ratio per completion, ``exp(sum_t mask_t (logp_t -
behaviour_logp_t))``, for every token of it. Padding (``mask == 0``) gets weight 0 and is never
kept, whatever the values there: they are *selected away* with :func:`torch.where` before any
arithmetic, never multiplied by the mask (an engine that pads with ``-inf`` would otherwise give
``-inf * 0 = nan``, and at the sequence level one NaN spreads over the whole row).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = [
    "ROLLOUT_CORRECTIONS",
    "corrected_advantages",
    "correction_icepop",
    "correction_mis",
    "correction_none",
    "correction_tis",
    "importance_ratios",
    "mismatch_metrics",
]

MAX_LOG_RATIO = 20.0
"""Log-ratios are clamped to +-20 before exponentiating (exp(20) ~ 5e8): a finite weight for a
token the engine gave almost no probability, which every mode then caps or drops."""


def importance_ratios(
    logp: Tensor, behaviour_logp: Tensor, mask: Tensor, level: str = "token"
) -> Tensor:
    """``[N, T]`` ratios ``pi_old / mu`` per token (``level="token"``) or per sequence
    broadcast over its tokens (``"sequence"``: the exp of the masked sum of log-ratios); 0 on
    padding, whatever ``logp`` and ``behaviour_logp`` hold there (``-inf``, NaN). Detached."""
    real = mask.bool()
    zero = logp.new_zeros(())
    log_ratio = torch.where(real, logp.detach() - behaviour_logp.detach(), zero)
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(log_ratio)
    elif level != "token":
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    return torch.where(real, torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)), zero)


def correction_none(
    logp: Tensor, behaviour_logp: Tensor, mask: Tensor, **_: object
) -> tuple[Tensor, Tensor]:
    """(weights, keep): 1 on every real token, all kept."""
    keep = mask.bool()
    return keep.to(logp.dtype), keep


def correction_tis(
    logp: Tensor,
    behaviour_logp: Tensor,
    mask: Tensor,
    cap: float = 2.0,
    level: str = "token",
    **_: object,
) -> tuple[Tensor, Tensor]:
    """(weights ``min(rho, cap)``, keep = every real token)."""
    rho = importance_ratios(logp, behaviour_logp, mask, level)
    return rho.clamp(max=cap), mask.bool()


def correction_mis(
    logp: Tensor,
    behaviour_logp: Tensor,
    mask: Tensor,
    cap: float = 2.0,
    level: str = "token",
    **_: object,
) -> tuple[Tensor, Tensor]:
    """(weights ``rho`` on kept tokens, keep = real tokens with ``rho <= cap``); at the
    sequence level a sequence is kept or dropped whole."""
    rho = importance_ratios(logp, behaviour_logp, mask, level)
    keep = mask.bool() & (rho <= cap)
    return torch.where(keep, rho, rho.new_zeros(())), keep


def correction_icepop(
    logp: Tensor,
    behaviour_logp: Tensor,
    mask: Tensor,
    cap: float = 5.0,
    low: float = 0.5,
    level: str = "token",
    **_: object,
) -> tuple[Tensor, Tensor]:
    """(weights ``rho`` on kept tokens, keep = real tokens with ``low <= rho <= cap``): IcePop's
    two-sided band (its paper's [0.5, 5])."""
    rho = importance_ratios(logp, behaviour_logp, mask, level)
    keep = mask.bool() & (rho >= low) & (rho <= cap)
    return torch.where(keep, rho, rho.new_zeros(())), keep


ROLLOUT_CORRECTIONS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "none": correction_none,
    "tis": correction_tis,
    "mis": correction_mis,
    "icepop": correction_icepop,
}
"""`--grpo.rollout-correction.mode` -> (weights [N, T], keep [N, T] bool)."""


def corrected_advantages(
    advantages: Tensor, loss_mask: Tensor, weights: Tensor, keep: Tensor
) -> tuple[Tensor, Tensor]:
    """Fold a correction's (weights, keep) into the loss's inputs: ``[N, T]`` advantages
    ``A * w`` (a ``[N]`` advantage broadcast over its tokens) and the loss mask with the dropped
    tokens removed (they leave the divisor too).

    Scaling the advantage is scaling the token's PPO-clip term: for ``w >= 0``,
    ``-min(r A w, clip(r) A w) = w * -min(r A, clip(r) A)``, and the dual clip's cap ``-A c``
    scales with it; the clip's active branch and ``A``'s sign are unchanged. The KL term to the
    reference is not reweighted (it is not an expectation over the rollout's tokens). GMPO's
    surrogate averages these ``[N, T]`` advantages over the row's kept tokens, so there the
    weights enter as their arithmetic mean (see :func:`rlvr.algo.losses.surrogate_gmpo`).
    Tokens outside ``keep & loss_mask`` are selected away (0 in both outputs), whatever the
    advantages or weights hold there."""
    per_token = advantages if advantages.dim() == 2 else advantages.unsqueeze(1)
    kept = keep & loss_mask.bool()
    weighted = torch.where(kept, per_token * weights, weights.new_zeros(()))
    return weighted, torch.where(kept, loss_mask, loss_mask.new_zeros(()))


def mismatch_metrics(
    logp: Tensor,
    behaviour_logp: Tensor,
    mask: Tensor,
    weights: Tensor,
    keep: Tensor,
    level: str = "token",
) -> dict[str, float]:
    """How far the rollout engine's policy is from the learner's, over the real tokens:

    - ``mismatch/kl``: ``mean_t(behaviour_logp - logp)``, the k1 estimate of KL(mu || pi_old)
      on tokens sampled from mu (divisor: real tokens);
    - ``mismatch/k3``: ``mean_t(rho - 1 - log rho)``, non-negative per token (same divisor);
    - ``mismatch/ess``: the weights' effective sample size over real tokens,
      ``(sum w)^2 / (n * sum w^2)``, in (0, 1], 1 when all weights are equal;
    - ``mismatch/dropped_frac``: real tokens the mode dropped, over real tokens;
    - ``mismatch/capped_frac``: kept tokens whose weight is below the ratio the mode used at
      `level` (truncated), over real tokens.
    """
    real = mask.bool()
    n = int(real.sum())
    if n == 0:
        return {}
    log_ratio = (logp.detach() - behaviour_logp.detach())[real]
    rho = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    w = weights.detach()[real].double()
    used = importance_ratios(logp, behaviour_logp, mask, level)[real].double()
    square_sum = float((w * w).sum())
    return {
        "mismatch/kl": float((-log_ratio).mean()),
        "mismatch/k3": float((rho - 1 - log_ratio).mean()),
        "mismatch/ess": float(w.sum() ** 2 / (n * square_sum)) if square_sum > 0 else 0.0,
        "mismatch/dropped_frac": float((~keep[real]).sum()) / n,
        "mismatch/capped_frac": float((keep[real] & (w < used - 1e-12)).sum()) / n,
    }
