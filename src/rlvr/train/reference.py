"""Reference-model synchronisation: copy (``alpha = 1``) or blend the policy into the reference.

It takes modules (it needs their parameters), so it lives with the loop rather than with the
pure formulas of ``algo/``; ``alpha`` is passed in flat. It mutates the reference in place under
``no_grad``.

A LoRA policy's reference is its own frozen base (adapters disabled), which cannot move toward
the policy without moving the policy too: ``lora_state.check_reference_sync`` refuses that
combination, and the learner calls it when it is built, before any step runs.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["sync_reference"]


@torch.no_grad()
def sync_reference(ref_model: nn.Module, policy: nn.Module, alpha: float) -> None:
    """Move the reference model's parameters toward the policy's, in place.

    For every parameter, matched by name: ``ref = alpha * policy + (1 - alpha) * ref``
    (TR-DPO's soft update, Gorbatovski et al. 2024); ``alpha = 1.0`` copies the policy exactly
    (the hard update, e.g. a periodic reference reset). Buffers (e.g. rotary frequency tables)
    are left alone: they are not trained. The policy is not modified.

    Args:
        ref_model (nn.Module): the reference model, updated in place.
        policy (nn.Module): the current policy, with the same parameter names and shapes.
        alpha (float): blend weight of the policy, ``0 < alpha <= 1``.

    Raises:
        ValueError: ``alpha`` outside ``(0, 1]``, or the two models' parameter names or shapes
            differ.
    """
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    ref_params = dict(ref_model.named_parameters())
    policy_params = dict(policy.named_parameters())
    if ref_params.keys() != policy_params.keys():
        missing = sorted(ref_params.keys() ^ policy_params.keys())
        raise ValueError(f"parameter names differ between ref_model and policy: {missing[:5]}")
    for name, ref in ref_params.items():
        src = policy_params[name]
        if ref.shape != src.shape:
            raise ValueError(
                f"parameter {name!r}: ref shape {tuple(ref.shape)} != policy {tuple(src.shape)}"
            )
        if alpha == 1.0:
            ref.copy_(src)
        else:
            ref.lerp_(src.to(ref.dtype), alpha)
