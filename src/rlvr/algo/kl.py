"""Per-token estimators of ``KL(pi || pi_ref)`` from the log-probs of sampled tokens.

The tokens were sampled from ``pi`` (the policy), ``logp`` is ``log pi(token)`` and ``ref_logp``
is ``log pi_ref(token)``. With ``log_r = ref_logp - logp`` (the log of ``r = pi_ref / pi``),
Schulman's estimators (http://joschu.net/blog/kl-approx.html) are:

- k1 = ``-log_r``: unbiased, high variance, can be negative per token.
- k2 = ``0.5 * log_r**2``: biased, low variance, always >= 0.
- k3 = ``(r - 1) - log_r``: unbiased, low variance, always >= 0 (the GRPO / DeepSeekMath term).

All take and return ``[B, T]`` tensors (any matching shapes work); no masking happens here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["KL_ESTIMATORS", "kl_k1", "kl_k2", "kl_k3"]


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
