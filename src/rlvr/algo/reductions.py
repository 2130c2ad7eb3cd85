"""Masked reductions and the loss-aggregation modes of the GRPO family.

Every function here takes a ``mask`` of the same shape as ``values`` with 1 on the positions
that count (completion tokens) and 0 on the positions that do not (padding). Any nonzero mask
entry counts as 1. Masked-out positions are *selected away* with :func:`torch.where`, never
multiplied by 0, so large or non-finite garbage there (``1e6``, ``inf``, ``nan``) changes neither
the result nor the gradient of the kept positions, and the gradient at masked-out positions is 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = [
    "AGGREGATIONS",
    "aggregate_seq_mean_token_mean",
    "aggregate_seq_mean_token_sum_norm",
    "aggregate_token_mean",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
]


def _masked(values: Tensor, mask: Tensor) -> Tensor:
    """``values`` where ``mask`` is nonzero, 0 elsewhere (same shape as ``values``)."""
    if mask.shape != values.shape:
        raise ValueError(
            f"mask shape {tuple(mask.shape)} must equal values shape {tuple(values.shape)}"
        )
    return torch.where(mask.bool(), values, values.new_zeros(()))


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``values`` over the positions where ``mask`` is nonzero.

    Args:
        values (Tensor): any shape ``S``.
        mask (Tensor): shape ``S``; nonzero = included, 0 = excluded.
        dim (int | None): dimension to sum over; ``None`` sums over all elements.

    Returns:
        Tensor: ``S`` with ``dim`` removed, or a 0-d tensor when ``dim is None``. Nothing is
        divided; an all-zero mask gives 0.
    """
    masked = _masked(values, mask)
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` over the positions where ``mask`` is nonzero.

    Divides the masked sum by the number of nonzero mask entries (``mask.sum(dim)`` for a 0/1
    mask). Where that count is 0 (an all-zero mask row, or an all-zero mask with
    ``dim=None``) the result is 0, not NaN: the count is clamped to at least 1 and the masked
    sum there is 0.

    Args:
        values (Tensor): any shape ``S``.
        mask (Tensor): shape ``S``; nonzero = included, 0 = excluded.
        dim (int | None): dimension to average over; ``None`` averages over all elements.

    Returns:
        Tensor: ``S`` with ``dim`` removed, or a 0-d tensor when ``dim is None``.
    """
    total = masked_sum(values, mask, dim)
    keep = mask.bool()
    count = keep.sum() if dim is None else keep.sum(dim=dim)
    return total / count.clamp(min=1).to(total.dtype)


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-4) -> Tensor:
    """Normalise ``values`` to zero mean and unit std over *all* masked positions together.

    ``(values - mean) / (std + eps)`` where ``mean`` is :func:`masked_mean` over every nonzero
    mask entry (all rows pooled, so a long row weighs more than a short one) and ``std`` is the
    unbiased std over the same ``n`` entries, ``sqrt(sum (v - mean)**2 / (n - 1))`` (0 when
    ``n <= 1``). Masked-out positions are 0 in the result, and so is everything when all masked
    values are equal (no 0/0 with ``eps = 0``). Used for PPO's advantage whitening and
    REINFORCE++'s batch-normalised returns.

    Args:
        values (Tensor): any shape ``S``.
        mask (Tensor): shape ``S``; nonzero = included.
        eps (float): added to the std.

    Returns:
        Tensor: shape ``S``, whitened values, 0 where ``mask`` is 0.
    """
    mean = masked_mean(values, mask)
    centred = _masked(values - mean, mask)
    count = mask.bool().sum().clamp(min=2).to(values.dtype)
    std = torch.sqrt((centred**2).sum() / (count - 1))
    divisor = std + eps
    # divisor 0 (all values equal, eps = 0): every centred value is 0 -> 0, not 0/0
    return torch.where(divisor > 0, centred / torch.where(divisor > 0, divisor, 1.0), centred)


def _check_2d(per_token: Tensor, mask: Tensor) -> None:
    """Raise ``ValueError`` unless ``per_token`` is ``[B, T]`` and ``mask`` has its shape."""
    if per_token.dim() != 2:
        raise ValueError(f"per_token must be [B, T], got shape {tuple(per_token.shape)}")
    if mask.shape != per_token.shape:
        raise ValueError(
            f"mask shape {tuple(mask.shape)} must equal per_token shape {tuple(per_token.shape)}"
        )


def _check_positive(name: str, value: float | Tensor | None) -> None:
    """Raise ``ValueError`` if ``value`` is given and not > 0 (``name`` goes in the message)."""
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def aggregate_token_mean(
    per_token: Tensor,
    mask: Tensor,
    num_tokens: float | None = None,
    *,
    num_seqs: float | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Mode ``"token-mean"`` (DAPO): every completion token weighs the same.

    ``loss = sum_{b,t} mask[b,t] * per_token[b,t] / num_tokens``

    Divides by ``num_tokens``; the default is the number of masked tokens in this batch
    (``mask.sum()``, 0 clamped to 1, so an all-padding batch gives 0). Under gradient
    accumulation pass the masked-token count of the *whole optimizer step* (all micro-batches,
    all ranks): the micro-batch losses then add up to exactly the full-batch loss, gradient
    included. ``num_seqs`` and ``max_len`` are accepted for a uniform call signature and ignored.

    Args:
        per_token (Tensor): ``[B, T]`` per-token loss.
        mask (Tensor): ``[B, T]``, 1 on completion tokens, 0 on padding.
        num_tokens (float | None): divisor; must be > 0 when given.

    Returns:
        Tensor: 0-d loss.
    """
    del num_seqs, max_len
    _check_2d(per_token, mask)
    _check_positive("num_tokens", num_tokens)
    if num_tokens is None:
        return masked_mean(per_token, mask)
    return masked_sum(per_token, mask) / num_tokens


def aggregate_seq_mean_token_mean(
    per_token: Tensor,
    mask: Tensor,
    num_seqs: float | None = None,
    *,
    num_tokens: float | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Mode ``"seq-mean-token-mean"`` (original GRPO): mean over each sequence, then over sequences.

    ``loss = sum_b [ sum_t mask[b,t] * per_token[b,t] / sum_t mask[b,t] ] / num_seqs``

    Each row is divided by its own number of masked tokens (an all-padding row contributes 0),
    then the sum of the row means is divided by ``num_seqs`` (default ``B``, the rows of this
    batch). A token of a short completion weighs more than a token of a long one. Under
    gradient accumulation pass the number of sequences of the whole optimizer step.
    ``num_tokens`` and ``max_len`` are accepted for a uniform call signature and ignored.

    Args:
        per_token (Tensor): ``[B, T]`` per-token loss.
        mask (Tensor): ``[B, T]``, 1 on completion tokens, 0 on padding.
        num_seqs (float | None): divisor; must be > 0 when given.

    Returns:
        Tensor: 0-d loss.
    """
    del num_tokens, max_len
    _check_2d(per_token, mask)
    _check_positive("num_seqs", num_seqs)
    seq_means = masked_mean(per_token, mask, dim=1)  # [B]
    divisor = per_token.shape[0] if num_seqs is None else num_seqs
    return seq_means.sum() / divisor


def aggregate_seq_mean_token_sum_norm(
    per_token: Tensor,
    mask: Tensor,
    max_len: int | None = None,
    num_seqs: float | None = None,
    *,
    num_tokens: float | None = None,
) -> Tensor:
    """Mode ``"seq-mean-token-sum-norm"`` (Dr. GRPO): per-sequence sum over a constant length.

    ``loss = sum_b [ sum_t mask[b,t] * per_token[b,t] / max_len ] / num_seqs``

    Each row's masked sum is divided by the constant ``max_len`` (the generation budget, not the
    row's length, so there is no length bias), then the sum over rows is divided by
    ``num_seqs`` (default ``B``). ``max_len`` is required (``ValueError`` if ``None``); it
    defaults to ``None`` only so all modes share one call signature. ``num_tokens`` is ignored.

    Args:
        per_token (Tensor): ``[B, T]`` per-token loss.
        mask (Tensor): ``[B, T]``, 1 on completion tokens, 0 on padding.
        max_len (int): constant per-sequence divisor; must be > 0.
        num_seqs (float | None): divisor over sequences; must be > 0 when given.

    Returns:
        Tensor: 0-d loss.
    """
    del num_tokens
    _check_2d(per_token, mask)
    if max_len is None:
        raise ValueError("aggregation 'seq-mean-token-sum-norm' requires max_len")
    _check_positive("max_len", max_len)
    _check_positive("num_seqs", num_seqs)
    seq_sums = masked_sum(per_token, mask, dim=1) / max_len  # [B]
    divisor = per_token.shape[0] if num_seqs is None else num_seqs
    return seq_sums.sum() / divisor


AGGREGATIONS: dict[str, Callable[..., Tensor]] = {
    "token-mean": aggregate_token_mean,
    "seq-mean-token-mean": aggregate_seq_mean_token_mean,
    "seq-mean-token-sum-norm": aggregate_seq_mean_token_sum_norm,
}
"""Loss-aggregation modes by name. Each accepts
``(per_token, mask, *, num_tokens=None, num_seqs=None, max_len=None)`` and ignores the keywords
it does not use."""
