"""The policy loss (a surrogate of the chosen name + optional KL penalty) and PPO's clipped
value loss.

The importance ratio is chosen by name from :data:`RATIO_LEVELS`; each is
``f(logp[B, T], old_logp[B, T], mask[B, T]) -> ratio[B, T]``:

- ``"token"``: ``r_t = exp(logp_t - old_logp_t)`` (PPO / GRPO / DAPO; the default).
- ``"sequence"``: GSPO (Zheng et al. 2025, arXiv:2507.18071),
  ``s_i = exp(mean_t (logp_t - old_logp_t))`` over the row's completion tokens, the same value
  on every token of the row; gradient ``s_i / |y_i| * grad logp_t`` per token.
- ``"gspo-token"``: GSPO-token, ``s_it = sg[s_i] * exp(logp_t - sg[logp_t])``: the value is
  ``s_i`` but the gradient is ``s_i * grad logp_t`` per token, so per-token advantages weigh
  each token's gradient (with a per-sequence advantage and ``"seq-mean-token-mean"`` it gives
  exactly GSPO's gradient).

GSPO's objective averages over sequences, i.e. ``aggregation="seq-mean-token-mean"``, and uses
tiny clip ranges (the paper: ``epsilon_low = 3e-4``, ``epsilon_high = 4e-4``); both stay the
caller's choice (the recipe sets them).

Clipping, per token, with ``r`` the ratio of the chosen level and ``A`` the advantage::

    clip_loss = max(-A * r, -A * clip(r, 1 - epsilon_low, 1 + epsilon_high))   (PPO)
    loss      = min(clip_loss, -A * clip_ratio_c)   where A < 0, if clip_ratio_c is given
              = clip_loss                           otherwise

The second line is dual-clip PPO (Ye et al. 2020; verl's ``clip_ratio_c``): for a negative
advantage the PPO loss grows without bound in ``r``, so a token whose ratio exploded (``r >
clip_ratio_c``) gets the constant loss ``-A * clip_ratio_c`` and no gradient.

The surrogate is chosen by name from :data:`SURROGATES`; ``epsilon_low`` / ``epsilon_high`` are
its clip range, whose meaning each surrogate states:

- ``"ppo-clip"``: the PPO-clip loss above (the default); ``epsilon_*`` clip the ratio.
- ``"cispo"``: CISPO (MiniMax-M1, arXiv:2506.13585, eq. 4), per token
  ``-sg[clip(r, 1 - epsilon_low, 1 + epsilon_high)] * A * logp``: the importance weight is
  clipped and its gradient stopped, so every token keeps the gradient ``-clip(r) * A`` of its
  log-prob, where PPO-clip gives a clipped token none. MiniMax set no lower bound on the weight
  ("setting epsilon_low^IS to a large value"; ``epsilon_low = 1`` floors it at 0, which no ratio
  is below) and tuned only ``epsilon_high``.
- ``"gmpo"``: GMPO (Zhao et al. 2025, arXiv:2507.20673, and its reference code
  ``callsys/GMPO`` ``train_zero_math_gmpo.py``), per sequence
  ``-A_i * exp(mean_t clip_A(logp_t - old_logp_t))``: the geometric mean of the token ratios,
  each log-ratio clipped in log space at its token, on the pessimistic side of the advantage's
  sign (``A_i >= 0``: capped at ``+epsilon_high``; ``A_i < 0``: floored at ``-epsilon_low``,
  the paper's range ``(e^-0.4, e^0.4)`` being ``epsilon_* = 0.4``). Needs
  ``ratio_level="token"`` (it builds its own sequence ratio). Deviation: the paper defines one
  advantage per sequence; ``[B, T]`` advantages (GAE, a rollout correction's weights folded in)
  are first averaged *arithmetically* over the row's tokens, as verl's ``geo_mean`` averages
  its advantages. Rollout-correction weights ``w_t`` therefore enter as their arithmetic mean,
  where verl's ``geo_mean`` (``compute_policy_loss_geo_mean``) takes their *geometric* mean
  apart from the advantage: rlvr ``L_i = -A_i * mean_t(w_t) * rho_i``, verl ``L_i = -A_i *
  exp(mean_t log(w_t + 1e-10)) * rho_i``, means over the row's loss-mask tokens. They agree
  when a row's weights are equal (``level="sequence"``: one weight per row); otherwise rlvr's
  is the larger in magnitude (AM >= GM). See :func:`surrogate_gmpo`.

The dual clip ``clip_ratio_c`` is PPO-clip's only: CISPO's weight is already capped and GMPO's
paper has none, so the other surrogates refuse it (:func:`surrogate_conflicts`). A run's config
holds each surrogate's clips in its own config (``rlvr.train.config.PPOClip``, ``CISPO``,
``GMPO``), which ``build_plan`` passes here as ``epsilon_low`` / ``epsilon_high``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from rlvr.algo.kl import KL_ESTIMATORS, kl_k3
from rlvr.algo.reductions import AGGREGATIONS, masked_mean

__all__ = [
    "RATIO_LEVELS",
    "SURROGATES",
    "policy_loss",
    "ratio_gspo_token",
    "ratio_sequence",
    "ratio_surrogate",
    "ratio_token",
    "surrogate_cispo",
    "surrogate_conflicts",
    "surrogate_gmpo",
    "surrogate_ppo_clip",
    "value_loss",
]


# ----------------------------------------------------------------------------- ratio levels


def _on_tokens(values: Tensor, mask: Tensor, fill: float = 0.0) -> Tensor:
    """``values`` where ``mask`` is nonzero, ``fill`` elsewhere (same shape as ``values``).

    Every function here selects its inputs' padding away with this *before* its formula, never
    after and never by multiplying: ``-inf`` or NaN log-probs on padding would give ``-inf * 0 =
    nan`` values, and even a ``torch.where`` on the output back-propagates ``0 * nan = nan``
    into the input wherever the formula's own derivative is NaN there (``exp(-inf - -inf)``).
    Selected away first, the padding's gradient is exactly 0."""
    return torch.where(mask.bool(), values, values.new_full((), fill))


def ratio_token(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """Ratio level ``"token"``: ``exp(logp - old_logp)`` per token.

    Padded positions (``mask == 0``) are selected away first, whatever they hold (``-inf``,
    NaN): their ratio is ``exp(0) = 1`` and their gradient 0.

    Args:
        logp (Tensor): ``[B, T]`` current log-probs (with grad).
        old_logp (Tensor): ``[B, T]`` sampling log-probs (no grad).
        mask (Tensor): ``[B, T]``, 1 on completion tokens, 0 on padding.

    Returns:
        Tensor: ``[B, T]`` ratios, 1 on padding.
    """
    return torch.exp(_on_tokens(logp, mask) - _on_tokens(old_logp, mask))


def _sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """``[B, 1]`` mean over each row's masked tokens of ``logp - old_logp`` (divided by the
    row's masked-token count; 0 for an empty row); padding selected away first."""
    log_ratio = _on_tokens(logp, mask) - _on_tokens(old_logp, mask)
    return masked_mean(log_ratio, mask, dim=1).unsqueeze(-1)


def ratio_sequence(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """Ratio level ``"sequence"`` (GSPO): ``s_i = exp(mean over row i's tokens of log-ratio)``.

    ``s_i = exp(sum_t mask[i,t] * (logp - old_logp)[i,t] / sum_t mask[i,t])`` — the
    length-normalised sequence likelihood ratio ``(pi(y_i) / pi_old(y_i)) ** (1 / |y_i|)`` —
    broadcast to every position of the row (an all-padding row gets 1). Padded positions are
    selected away, so garbage there does not matter.

    Args:
        logp (Tensor): ``[B, T]`` current log-probs (with grad).
        old_logp (Tensor): ``[B, T]`` sampling log-probs (no grad).
        mask (Tensor): ``[B, T]``, 1 on completion tokens, 0 on padding.

    Returns:
        Tensor: ``[B, T]`` ratios, constant along each row.
    """
    return torch.exp(_sequence_log_ratio(logp, old_logp, mask)).expand_as(logp)


def ratio_gspo_token(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """Ratio level ``"gspo-token"``: ``s_it = sg[s_i] * exp(logp_t - sg[logp_t])``.

    The value equals :func:`ratio_sequence`'s ``s_i`` exactly (``logp_t - sg[logp_t]`` is 0);
    the gradient is ``d s_it / d logp_t = s_i`` at its own token only, which lets a per-token
    advantage weigh each token.

    Args:
        logp (Tensor): ``[B, T]`` current log-probs (with grad).
        old_logp (Tensor): ``[B, T]`` sampling log-probs (no grad).
        mask (Tensor): ``[B, T]``, 1 on completion tokens, 0 on padding.

    Returns:
        Tensor: ``[B, T]`` ratios, constant in value along each row.
    """
    log_s = _sequence_log_ratio(logp, old_logp, mask).detach()  # [B, 1]
    logp = _on_tokens(logp, mask)  # -inf - -inf would be NaN in the bracket and its gradient
    return torch.exp(log_s + (logp - logp.detach()))  # the bracket is exactly 0 in value


RATIO_LEVELS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "token": ratio_token,
    "sequence": ratio_sequence,
    "gspo-token": ratio_gspo_token,
}
"""Importance-ratio levels by name; each is ``f(logp, old_logp, mask) -> ratio[B, T]``."""


# ----------------------------------------------------------------------------- surrogate


def ratio_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    epsilon_low: float,
    epsilon_high: float,
    clip_ratio_c: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token PPO-clip loss of given ratios, with optional dual clip (see the module docstring).

    ``clip_loss = -min(r * A, clip(r, 1 - epsilon_low, 1 + epsilon_high) * A)``; with
    ``clip_ratio_c`` the loss of a token with ``A < 0`` is ``min(clip_loss, -A * clip_ratio_c)``.

    Args:
        ratio (Tensor): ``[B, T]`` importance ratios (with grad).
        advantages (Tensor): ``[B]`` per-sequence (broadcast over tokens) or ``[B, T]``
            per-token advantages.
        epsilon_low (float): ratio floor ``1 - epsilon_low``.
        epsilon_high (float): ratio ceiling ``1 + epsilon_high``.
        clip_ratio_c (float | None): dual-clip constant (> 1); ``None`` disables it.

    Returns:
        tuple[Tensor, Tensor, Tensor]: ``per_token_loss`` ``[B, T]``; ``is_clipped`` ``[B, T]``
        bool, the PPO clip is active (``r > 1 + epsilon_high`` with ``A > 0`` or
        ``r < 1 - epsilon_low`` with ``A < 0``); ``is_dual_clipped`` ``[B, T]`` bool, ``A < 0``
        and the dual-clip cap is strictly the smaller (all False without ``clip_ratio_c``).
    """
    advantages = _per_token(advantages, ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * advantages
    per_token_loss = -torch.minimum(unclipped, clipped)
    is_clipped = ((ratio > 1 + epsilon_high) & (advantages > 0)) | (
        (ratio < 1 - epsilon_low) & (advantages < 0)
    )
    is_dual_clipped = torch.zeros_like(is_clipped)
    if clip_ratio_c is not None:
        cap = -advantages * clip_ratio_c
        is_dual_clipped = (advantages < 0) & (per_token_loss > cap)
        per_token_loss = torch.where(
            advantages < 0, torch.minimum(per_token_loss, cap), per_token_loss
        )
    return per_token_loss, is_clipped, is_dual_clipped


def _per_token(advantages: Tensor, like: Tensor) -> Tensor:
    """``[B, 1]`` from per-sequence ``[B]`` advantages (broadcasting over ``like``'s tokens);
    ``[B, T]`` advantages unchanged."""
    return advantages.unsqueeze(-1) if advantages.dim() == like.dim() - 1 else advantages


def surrogate_ppo_clip(
    ratio: Tensor,
    advantages: Tensor,
    *,
    logp: Tensor,
    log_ratio: Tensor,
    mask: Tensor,
    epsilon_low: float,
    epsilon_high: float,
    clip_ratio_c: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Surrogate ``"ppo-clip"``: :func:`ratio_surrogate` of ``ratio`` (PPO-clip, optional dual
    clip). No reduction: one loss per token; the aggregation divides.

    ``logp`` and ``log_ratio`` are accepted for the uniform signature of :data:`SURROGATES`
    and unused; ``mask`` selects the padding of ``ratio`` (to 1) and of ``[B, T]``
    ``advantages`` (to 0) away first, so its loss there is finite and its gradient 0.

    Returns:
        tuple[Tensor, Tensor, Tensor]: see :func:`ratio_surrogate`.
    """
    del logp, log_ratio
    ratio, advantages = _surrogate_inputs(ratio, advantages, mask)
    return ratio_surrogate(ratio, advantages, epsilon_low, epsilon_high, clip_ratio_c)


def _surrogate_inputs(ratio: Tensor, advantages: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """``ratio`` with 1 and ``[B, T]`` ``advantages`` with 0 on padding (``[B]`` unchanged)."""
    if advantages.dim() == ratio.dim():
        advantages = _on_tokens(advantages, mask)
    return _on_tokens(ratio, mask, fill=1.0), advantages


def surrogate_cispo(
    ratio: Tensor,
    advantages: Tensor,
    *,
    logp: Tensor,
    log_ratio: Tensor,
    mask: Tensor,
    epsilon_low: float,
    epsilon_high: float,
    clip_ratio_c: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Surrogate ``"cispo"`` (MiniMax-M1, arXiv:2506.13585, eq. 4): clip the IS weight, not the
    update.

    ``per_token = -sg[clip(r, 1 - epsilon_low, 1 + epsilon_high)] * A * logp``, so
    ``d per_token / d logp = -clip(r) * A`` on every token, a clipped one included (PPO-clip
    gives that token 0). The value is a REINFORCE-style ``-w * A * logp``, not PPO's ``-r * A``:
    only its gradient is meaningful. No reduction here: one loss per token (MiniMax-M1 divides
    the sum by the batch's token count, ``aggregation="token-mean"``).

    Args:
        ratio (Tensor): ``[B, T]`` importance ratios of the chosen level (their gradient is
            stopped).
        advantages (Tensor): ``[B]`` or ``[B, T]``.
        logp (Tensor): ``[B, T]`` current log-probs (with grad).
        log_ratio (Tensor): unused (uniform signature).
        mask (Tensor): ``[B, T]``, 1 on completion tokens, 0 on padding: the padding of
            ``ratio``, ``logp`` and ``[B, T]`` ``advantages`` is selected away first.
        epsilon_low (float): weight floor ``1 - epsilon_low`` (1: no floor, MiniMax's choice).
        epsilon_high (float): weight cap ``1 + epsilon_high``.
        clip_ratio_c (float | None): must be ``None`` (``policy_loss`` refuses a dual clip).

    Returns:
        tuple[Tensor, Tensor, Tensor]: ``per_token_loss`` ``[B, T]``; ``is_clipped`` ``[B, T]``
        bool, *the IS weight was clipped* (``r > 1 + epsilon_high`` or ``r < 1 - epsilon_low``,
        whatever the advantage's sign: the token still has a gradient); all-False
        ``is_dual_clipped``.
    """
    del log_ratio, clip_ratio_c
    ratio, advantages = _surrogate_inputs(ratio, advantages, mask)
    logp = _on_tokens(logp, mask)
    advantages = _per_token(advantages, ratio)
    weight = torch.clamp(ratio.detach(), 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss = -weight * advantages * logp
    is_clipped = (ratio > 1 + epsilon_high) | (ratio < 1 - epsilon_low)
    return per_token_loss, is_clipped, torch.zeros_like(is_clipped)


def surrogate_gmpo(
    ratio: Tensor,
    advantages: Tensor,
    *,
    logp: Tensor,
    log_ratio: Tensor,
    mask: Tensor,
    epsilon_low: float,
    epsilon_high: float,
    clip_ratio_c: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Surrogate ``"gmpo"`` (Geometric-Mean Policy Optimization, arXiv:2507.20673): per
    sequence, ``-A_i`` times the geometric mean of its token ratios, each clipped in log space.

    Per token, on the pessimistic side of ``A_i``'s sign (the reference code's
    ``sgn(A) * max(sgn(A) * d, clip(sgn(A) * d))`` with ``sgn = -1`` for ``A >= 0``)::

        d_t   = logp_t - old_logp_t
        c_t   = min(d_t, epsilon_high)   if A_i >= 0
              = max(d_t, -epsilon_low)   if A_i < 0
        rho_i = exp(sum_t mask * c_t / sum_t mask)       # the row's |y_i| tokens; 1 if empty
        L_i   = -A_i * rho_i = -sgn(A_i) * (prod_t |A_i| exp(c_t)) ** (1 / |y_i|)

    The geometric mean divides the row's summed clipped log-ratios by its own token count
    ``|y_i|``; ``L_i`` is then put on every position of row ``i``, so the aggregation sets the
    divisor over sequences: ``"seq-mean-token-mean"`` (GMPO's ``1/G sum_i``) divides each
    row's mean, ``L_i``, summed over rows by ``num_seqs``; ``"token-mean"`` weighs ``L_i`` by
    ``|y_i|`` and divides by ``num_tokens``. The gradient is ``-A_i * rho_i / |y_i|`` per
    token whose clip is not active and 0 where it is.

    With a rollout correction, ``corrected_advantages`` has folded each kept token's weight
    ``w_t`` into its advantage (``A_i w_t``), so the row's mean advantage here is ``A_i *
    (1 / |y_i|) sum_t w_t``: the weights' arithmetic mean over the row's kept tokens (dropped
    tokens have left ``mask``), the correction every surrogate gets through its advantages.
    verl's ``geo_mean`` differs: it multiplies ``L_i`` by the weights' geometric mean ``exp(sum_t
    mask * log(w_t + 1e-10) / (sum_t mask + 1e-8))``. E.g. ``A_i = 1``, on policy (``rho_i =
    1``), weights 0.5 and 2: rlvr ``L_i = -(0.5 + 2) / 2 = -1.25``, verl ``-sqrt(0.5 * 2) =
    -1``. They agree when the row's weights are equal (``level="sequence"``). Two smaller
    differences: verl clips each token by the sign of its own advantage (here the row mean's),
    and averages ``L_i`` over the micro-batch's rows whatever its ``loss_agg_mode`` (here the
    aggregation divides; ``"seq-mean-token-mean"`` is that mean).

    Args:
        ratio (Tensor): unused (uniform signature; ``policy_loss`` requires
            ``ratio_level="token"``).
        advantages (Tensor): ``[B]`` per-sequence; ``[B, T]`` is averaged over each row's
            masked tokens first (the paper has one advantage per sequence).
        logp (Tensor): unused (uniform signature).
        log_ratio (Tensor): ``[B, T]`` ``logp - old_logp`` (with grad; its padding is
            selected away first).
        mask (Tensor): ``[B, T]``, 1 on completion tokens, 0 on padding.
        epsilon_low (float): log-ratio floor ``-epsilon_low`` for ``A < 0`` (paper: 0.4).
        epsilon_high (float): log-ratio cap ``+epsilon_high`` for ``A >= 0`` (paper: 0.4).
        clip_ratio_c (float | None): must be ``None`` (``policy_loss`` refuses a dual clip).

    Returns:
        tuple[Tensor, Tensor, Tensor]: ``per_token_loss`` ``[B, T]`` (``L_i`` along row ``i``);
        ``is_clipped`` ``[B, T]`` bool, the token's log-ratio clip is active (``d_t >
        epsilon_high`` with ``A_i >= 0`` or ``d_t < -epsilon_low`` with ``A_i < 0``);
        all-False ``is_dual_clipped``.
    """
    del ratio, logp, clip_ratio_c
    log_ratio = _on_tokens(log_ratio, mask)
    seq_adv = advantages if advantages.dim() == 1 else masked_mean(advantages, mask, dim=1)
    positive = (seq_adv >= 0).unsqueeze(-1)  # [B, 1]
    clipped = torch.where(
        positive, log_ratio.clamp(max=epsilon_high), log_ratio.clamp(min=-epsilon_low)
    )
    is_clipped = torch.where(positive, log_ratio > epsilon_high, log_ratio < -epsilon_low)
    seq_ratio = torch.exp(masked_mean(clipped, mask, dim=1))  # [B] geometric means
    per_token_loss = (-seq_adv * seq_ratio).unsqueeze(-1).expand_as(log_ratio)
    return per_token_loss, is_clipped, torch.zeros_like(is_clipped)


SURROGATES: dict[str, Callable[..., tuple[Tensor, Tensor, Tensor]]] = {
    "ppo-clip": surrogate_ppo_clip,
    "cispo": surrogate_cispo,
    "gmpo": surrogate_gmpo,
}
"""Policy surrogates by name; each is ``f(ratio, advantages, *, logp, log_ratio, mask,
epsilon_low, epsilon_high, clip_ratio_c) -> (per_token_loss, is_clipped, is_dual_clipped)``,
all ``[B, T]``."""


def surrogate_conflicts(
    surrogate: str, *, ratio_level: str, clip_ratio_c: float | None
) -> list[str]:
    """The settings ``surrogate`` cannot run with, one sentence each naming the setting.

    GMPO builds its own sequence ratio from token ratios (``ratio_level`` must be ``"token"``);
    the dual clip is PPO-clip's only.

    Returns:
        list[str]: empty when the combination is valid (an unknown ``surrogate`` included:
        that is the caller's registry check).
    """
    problems = []
    if surrogate == "gmpo" and ratio_level != "token":
        problems.append(
            "ratio_level must be token with surrogate=gmpo (GMPO takes its own geometric mean "
            f"of the token ratios), got {ratio_level}"
        )
    if surrogate in SURROGATES and surrogate != "ppo-clip" and clip_ratio_c is not None:
        problems.append(
            f"clip_ratio_c is PPO-clip's dual clip: unset it with surrogate={surrogate}"
        )
    return problems


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
    ratio_level: str = "token",
    clip_ratio_c: float | None = None,
    surrogate: str = "ppo-clip",
) -> tuple[Tensor, dict[str, float]]:
    """GRPO policy loss of one (micro-)batch.

    ``ratio = RATIO_LEVELS[ratio_level](logp, old_logp, mask)``, then
    ``per_token = SURROGATES[surrogate](ratio, ...) + beta * KL_ESTIMATORS[kl_estimator](logp,
    ref_logp)`` (the KL term only when ``beta > 0``; it is always per token, whatever the ratio
    level), then aggregated over the masked tokens by ``AGGREGATIONS[aggregation]``. The defaults
    (``ratio_level="token"``, ``clip_ratio_c=None``, ``surrogate="ppo-clip"``) are plain
    PPO-clip per token. ``"cispo"`` is per token too; ``"gmpo"`` first divides each row's
    clipped log-ratios by the row's token count (its geometric mean) and puts the sequence's
    loss on each of its tokens (see :func:`surrogate_gmpo`). What the loss then divides by:

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

    - ``"policy/clip_frac"``: fraction of tokens where the surrogate's clip is active: for
      ``"ppo-clip"`` the clipped branch (the token has no gradient), for ``"cispo"`` *the IS
      weight was clipped* (either bound, any advantage sign; the token keeps a gradient), for
      ``"gmpo"`` the token's log-ratio was clipped.
    - ``"policy/approx_kl"``: k3 estimate of ``KL(pi_old || pi)`` (the tokens were sampled from
      ``pi_old``), i.e. ``kl_k3(old_logp, logp)``; how far the update moved the policy.
    - ``"policy/kl_ref"``: the chosen estimator of ``KL(pi || pi_ref)``; only when ``beta > 0``.
    - ``"policy/ratio_mean"``: mean of the ratio of ``ratio_level`` (``exp(logp - old_logp)``
      for ``"token"``; each row's ``s_i`` counted once per token for the sequence levels).
    - ``"policy/dual_clip_frac"``: fraction of tokens whose loss the dual clip capped; only when
      ``clip_ratio_c`` is given.
    - ``"policy/ratio_token_sq_dev"``, ``"policy/ratio_seq_sq_dev"``: the mean squared
      deviation from 1 of the token ratios ``exp(logp - old_logp)`` and of GSPO's sequence
      ratios (each row's once per token), over the masked tokens (divides by their count),
      whatever ``ratio_level`` (:func:`ratio_spread`).

    Args:
        logp (Tensor): ``[B, T]`` current-policy log-probs of the sampled tokens (with grad).
        old_logp (Tensor): ``[B, T]`` log-probs under the sampling policy.
        advantages (Tensor): ``[B]`` per-sequence advantages (broadcast over tokens) or
            ``[B, T]`` per-token advantages (e.g. GAE); padded positions are ignored.
        mask (Tensor): ``[B, T]``, 1 on completion tokens, 0 on padding.
        epsilon_low (float): lower clip width (>= 0) of the surrogate: the ratio's for
            ``"ppo-clip"``, the IS weight's for ``"cispo"``, the log-ratio's for ``"gmpo"``.
        epsilon_high (float): upper clip width (>= 0), the same way.
        beta (float): KL-penalty coefficient (>= 0); 0 disables the KL term.
        ref_logp (Tensor | None): ``[B, T]`` reference log-probs; required when ``beta > 0``.
        kl_estimator (str): a key of ``KL_ESTIMATORS``: ``"k1"``, ``"k2"`` or ``"k3"``.
        aggregation (str): a key of ``AGGREGATIONS``.
        num_tokens (float | None): see ``"token-mean"``.
        num_seqs (float | None): see the ``seq-mean-*`` modes.
        max_len (int | None): see ``"seq-mean-token-sum-norm"``.
        ratio_level (str): a key of :data:`RATIO_LEVELS`: ``"token"``, ``"sequence"`` or
            ``"gspo-token"``.
        clip_ratio_c (float | None): dual-clip constant (> 1) for negative advantages;
            ``None`` disables the dual clip. ``"ppo-clip"`` only.
        surrogate (str): a key of :data:`SURROGATES`: ``"ppo-clip"``, ``"cispo"`` or
            ``"gmpo"`` (``"gmpo"`` needs ``ratio_level="token"``).

    Returns:
        tuple[Tensor, dict[str, float]]: the 0-d loss and the metrics.

    Raises:
        ValueError: unknown ``aggregation``, ``kl_estimator``, ``ratio_level`` or
            ``surrogate``; a combination :func:`surrogate_conflicts` refuses;
            ``clip_ratio_c <= 1``; negative ``beta`` or epsilon;
            ``beta > 0`` without ``ref_logp``; mismatched shapes; ``max_len`` missing for
            ``"seq-mean-token-sum-norm"``.
    """
    _check_choice("aggregation", aggregation, AGGREGATIONS)
    _check_choice("kl_estimator", kl_estimator, KL_ESTIMATORS)
    _check_choice("ratio_level", ratio_level, RATIO_LEVELS)
    _check_choice("surrogate", surrogate, SURROGATES)
    conflicts = surrogate_conflicts(surrogate, ratio_level=ratio_level, clip_ratio_c=clip_ratio_c)
    if conflicts:
        raise ValueError("; ".join(conflicts))
    _check_coefficients(epsilon_low, epsilon_high, beta, clip_ratio_c, ref_logp is not None)
    _check_policy_shapes(logp, old_logp, advantages, mask, ref_logp)

    keep = mask.bool()
    zero = logp.new_zeros(())
    logp = torch.where(keep, logp, zero)
    old_logp = torch.where(keep, old_logp.detach(), zero)
    advantages = advantages.detach()
    if advantages.dim() == 2:
        advantages = torch.where(keep, advantages, advantages.new_zeros(()))

    ratio = RATIO_LEVELS[ratio_level](logp, old_logp, mask)
    per_token, is_clipped, is_dual_clipped = SURROGATES[surrogate](
        ratio,
        advantages,
        logp=logp,
        log_ratio=logp - old_logp,
        mask=mask,
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        clip_ratio_c=clip_ratio_c,
    )
    kl_ref = None
    if beta > 0:
        assert ref_logp is not None
        kl_ref = _kl_to_reference(logp, ref_logp, keep, kl_estimator)
        per_token = per_token + beta * kl_ref

    loss = AGGREGATIONS[aggregation](
        per_token, mask, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len
    )
    metrics = _policy_metrics(
        mask,
        ratio=ratio,
        logp=logp,
        old_logp=old_logp,
        is_clipped=is_clipped,
        is_dual_clipped=is_dual_clipped if clip_ratio_c is not None else None,
        kl_ref=kl_ref,
    )
    return loss, metrics


def _check_choice(kind: str, name: str, registry: Mapping[str, object]) -> None:
    """Raise ``ValueError`` unless ``name`` is a key of ``registry`` (``kind`` names the option)."""
    if name not in registry:
        raise ValueError(f"unknown {kind} {name!r}; expected one of {list(registry)}")


def _check_coefficients(
    epsilon_low: float,
    epsilon_high: float,
    beta: float,
    clip_ratio_c: float | None,
    has_ref_logp: bool,
) -> None:
    """Raise ``ValueError`` on a dual clip ``<= 1``, a negative ``beta`` or epsilon, or a KL
    penalty (``beta > 0``) without reference log-probs."""
    if clip_ratio_c is not None and not clip_ratio_c > 1:
        raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if epsilon_low < 0 or epsilon_high < 0:
        raise ValueError(f"epsilons must be >= 0, got {epsilon_low=}, {epsilon_high=}")
    if beta > 0 and not has_ref_logp:
        raise ValueError("beta > 0 requires ref_logp")


def _check_policy_shapes(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, ref_logp: Tensor | None
) -> None:
    """Raise ``ValueError`` unless ``logp`` is ``[B, T]``, ``old_logp``, ``mask`` and ``ref_logp``
    (if given) have its shape, and ``advantages`` is ``[B]`` or ``[B, T]``."""
    for name, tensor in (("old_logp", old_logp), ("mask", mask), ("ref_logp", ref_logp)):
        if tensor is not None and tensor.shape != logp.shape:
            raise ValueError(
                f"{name} shape {tuple(tensor.shape)} must equal logp shape {tuple(logp.shape)}"
            )
    if logp.dim() != 2 or advantages.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(
            f"expected logp [B, T] and advantages [B] or [B, T], got {tuple(logp.shape)} and "
            f"{tuple(advantages.shape)}"
        )


def _kl_to_reference(logp: Tensor, ref_logp: Tensor, keep: Tensor, kl_estimator: str) -> Tensor:
    """``[B, T]`` per-token ``KL_ESTIMATORS[kl_estimator](logp, ref_logp)``, differentiable in
    ``logp``; ``ref_logp`` is detached and its padded positions (``keep`` False) set to 0."""
    ref_logp = torch.where(keep, ref_logp.detach(), logp.new_zeros(()))
    return KL_ESTIMATORS[kl_estimator](logp, ref_logp)


def _policy_metrics(
    mask: Tensor,
    *,
    ratio: Tensor,
    logp: Tensor,
    old_logp: Tensor,
    is_clipped: Tensor,
    is_dual_clipped: Tensor | None,
    kl_ref: Tensor | None,
) -> dict[str, float]:
    """The metrics of :func:`policy_loss`, each a masked mean over all completion tokens.

    ``"policy/dual_clip_frac"`` only when ``is_dual_clipped`` is given and ``"policy/kl_ref"``
    only when ``kl_ref`` is; computed without gradient.
    """
    with torch.no_grad():
        metrics = {
            "policy/clip_frac": masked_mean(is_clipped.float(), mask).item(),
            "policy/approx_kl": masked_mean(kl_k3(old_logp, logp), mask).item(),
            "policy/ratio_mean": masked_mean(ratio, mask).item(),
            **ratio_spread(logp, old_logp, mask),
        }
        if is_dual_clipped is not None:
            metrics["policy/dual_clip_frac"] = masked_mean(is_dual_clipped.float(), mask).item()
        if kl_ref is not None:
            metrics["policy/kl_ref"] = masked_mean(kl_ref, mask).item()
    return metrics


def ratio_spread(logp: Tensor, old_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """How far the ratios stray from 1, token level against sequence level (no grad), as
    masked token means, so that a step's value is the same however its batch is split into
    micro-batches and ranks (a std is not: it does not average):

    - ``"policy/ratio_token_sq_dev"``: ``(exp(logp - old_logp) - 1)^2`` summed over the tokens
      where ``mask`` is nonzero, divided by their count;
    - ``"policy/ratio_seq_sq_dev"``: ``(s_i - 1)^2`` for GSPO's sequence ratio ``s_i =
      exp(masked mean of row i's logp - old_logp)``, each row counted once per masked token
      (as ``policy/ratio_mean`` counts it), divided by the masked-token count.

    Their square roots are the RMS deviations from 1, the std when the mean ratio is 1
    (on-policy). Padded positions of ``logp`` and ``old_logp`` are selected away, whatever
    they hold. An empty mask gives 0 for both.
    """
    with torch.no_grad():
        log_ratio = _on_tokens(logp - old_logp, mask).detach().float()
        token = torch.exp(log_ratio)
        seq = torch.exp(masked_mean(log_ratio, mask, dim=1)).unsqueeze(-1).expand_as(token)
        token_dev = masked_mean((token - 1) ** 2, mask)
        seq_dev = masked_mean((seq - 1) ** 2, mask)
    return {
        "policy/ratio_token_sq_dev": token_dev.item(),
        "policy/ratio_seq_sq_dev": seq_dev.item(),
    }


# ----------------------------------------------------------------------------- value loss


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip_range_value: float | None = None,
    *,
    aggregation: str = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    max_len: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO's clipped value loss of one (micro-)batch.

    Per token, with ``V`` the critic's current values, ``V_old`` those when the batch was
    collected and ``R`` the returns (targets, e.g. from :func:`rlvr.algo.gae.gae_advantages`)::

        V_clip    = V_old + clip(V - V_old, -clip_range_value, clip_range_value)
        per_token = 0.5 * max((V - R)**2, (V_clip - R)**2)

    (``0.5 * (V - R)**2`` when ``clip_range_value is None``), then aggregated over the masked
    tokens by ``AGGREGATIONS[aggregation]``, which fixes the divisor exactly as in
    :func:`policy_loss`: ``"token-mean"`` divides the masked sum by ``num_tokens`` (default
    ``mask.sum()``); the ``seq-mean-*`` modes divide each row by its token count or by
    ``max_len``, then the sum of rows by ``num_seqs`` (default ``B``).

    Padded positions of all inputs are selected away (garbage there affects nothing);
    ``old_values`` and ``returns`` are detached.

    Metrics (python floats, masked means over all completion tokens):
    ``"value/clip_frac"`` (fraction of tokens where the clipped term is strictly the larger,
    so the gradient is 0) and ``"value/mse"`` (mean of ``(V - R)**2``).

    Args:
        values (Tensor): ``[B, T]`` current values (with grad).
        old_values (Tensor): ``[B, T]`` values at collection time.
        returns (Tensor): ``[B, T]`` value targets.
        mask (Tensor): ``[B, T]``, 1 on completion tokens, 0 on padding.
        clip_range_value (float | None): the clip width (> 0); ``None`` disables clipping.
        aggregation (str): a key of ``AGGREGATIONS``.
        num_tokens (float | None): see ``"token-mean"``.
        num_seqs (float | None): see the ``seq-mean-*`` modes.
        max_len (int | None): see ``"seq-mean-token-sum-norm"``.

    Returns:
        tuple[Tensor, dict[str, float]]: the 0-d loss and the metrics.
    """
    _check_choice("aggregation", aggregation, AGGREGATIONS)
    if clip_range_value is not None and not clip_range_value > 0:
        raise ValueError(f"clip_range_value must be > 0, got {clip_range_value}")
    if values.dim() != 2:
        raise ValueError(f"values must be [B, T], got shape {tuple(values.shape)}")
    for name, tensor in (("old_values", old_values), ("returns", returns), ("mask", mask)):
        if tensor.shape != values.shape:
            raise ValueError(
                f"{name} shape {tuple(tensor.shape)} must equal values shape {tuple(values.shape)}"
            )
    aggregate = AGGREGATIONS[aggregation]

    keep = mask.bool()
    zero = values.new_zeros(())
    values = torch.where(keep, values, zero)
    old_values = torch.where(keep, old_values.detach(), zero)
    returns = torch.where(keep, returns.detach(), zero)

    unclipped = (values - returns) ** 2
    per_token = unclipped
    is_clipped = torch.zeros_like(keep)
    if clip_range_value is not None:
        v_clip = old_values + torch.clamp(values - old_values, -clip_range_value, clip_range_value)
        clipped = (v_clip - returns) ** 2
        per_token = torch.maximum(unclipped, clipped)
        is_clipped = clipped > unclipped
    per_token = 0.5 * per_token

    loss = aggregate(per_token, mask, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len)
    with torch.no_grad():
        metrics = {
            "value/clip_frac": masked_mean(is_clipped.float(), mask).item(),
            "value/mse": masked_mean(unclipped, mask).item(),
        }
    return loss, metrics
