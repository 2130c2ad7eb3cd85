"""What a LoRA policy changes in the state, the learner and the checkpoints, in one place.

A LoRA policy trains only its adapters over a frozen base, and the code around it is told so by
calling these, not by testing `is_lora` itself:

- `check_reference_sync`: such a reference cannot be synced toward the policy (refused);
- `make_reference`: the KL reference is the policy's own base (adapters disabled,
  `reference_is_base`), not a frozen copy;
- `scoring_reference`: the model a reference forward runs (the copy, the adapters-off policy in
  eval mode, or none);
- `save_weights` / `load_weights`: a LoRA model's checkpoint holds its adapters only;
- `checkpoint_meta` / `check_checkpoint`: such a checkpoint records a checksum of the base (the
  sum of squares of its frozen weights) and whether the reference was the base, and loading
  refuses another base, other adapters or another kind of reference.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch

from rlvr.models.lora import adapter_state_dict, adapters_disabled, is_lora

__all__ = [
    "LoRACheckpointError",
    "check_checkpoint",
    "checkpoint_meta",
    "load_weights",
    "make_reference",
    "save_weights",
    "scoring_reference",
]


class LoRACheckpointError(RuntimeError):
    """A LoRA checkpoint that does not fit the models it is loaded into (`check_checkpoint`);
    `rlvr.train.checkpoint` raises it as its `CheckpointError`."""


def make_reference(policy: torch.nn.Module, wanted: bool) -> tuple[torch.nn.Module | None, bool]:
    """(a frozen copy of `policy` in eval mode, or None; whether the reference is the policy's
    own base). Not `wanted`: (None, False). A LoRA policy: (None, True): its base with the
    adapters disabled is the initial policy, no copy needed."""
    if not wanted:
        return None, False
    if is_lora(policy):
        return None, True
    return copy.deepcopy(policy).eval().requires_grad_(False), False


def check_reference_sync(reference_is_base: bool, every: int) -> None:
    """ValueError when a reference that is the LoRA policy's base would be synced (every > 0)."""
    if reference_is_base and every > 0:
        raise ValueError(
            f"ref_sync_every={every} cannot be used with LoRA: the reference is the policy's "
            "frozen base model (adapters disabled), which cannot be moved toward the policy; "
            "set ref_sync_every=0 (--grpo.ref-sync-every 0) or train without LoRA"
        )


@contextlib.contextmanager
def scoring_reference(
    reference: torch.nn.Module | None, policy: torch.nn.Module, reference_is_base: bool
) -> Iterator[torch.nn.Module | None]:
    """The model a reference forward runs, for the block: `reference` when there is one; the
    LoRA `policy` with its adapters disabled, in eval mode (as a frozen copy would be), when
    `reference_is_base` (its adapters and train/eval mode restored after); else None."""
    if reference is not None or not reference_is_base:
        yield reference
        return
    was_training = policy.training
    try:
        with adapters_disabled(policy):
            policy.eval()
            yield policy
    finally:
        policy.train(was_training)


@torch.no_grad()
def base_checksum(model: torch.nn.Module) -> float:
    """Sum of squares (float64) of `model`'s frozen weights: tells one LoRA base from another.

    In chunks, so that a large embedding is never copied to float64 whole."""
    total = 0.0
    for param in model.parameters():
        if not param.requires_grad:
            for chunk in param.detach().flatten().split(1 << 24):
                total += chunk.double().square().sum().item()
    return total


def save_weights(model: torch.nn.Module, path: Path) -> None:
    """All of a plain model's weights (`safetensors.torch.save_model`, tied weights once); only
    the trainable ones (adapters) of a LoRA model."""
    if is_lora(model):
        weights = {k: v.detach().contiguous() for k, v in adapter_state_dict(model).items()}
        safetensors.torch.save_file(weights, str(path))
    else:
        safetensors.torch.save_model(model, str(path))


def load_weights(model: torch.nn.Module, file: Path) -> None:
    """What `save_weights` wrote, into `model` on its own device: every weight (strict), or a
    LoRA model's adapters only (the frozen base is left as it is; `check_checkpoint` first)."""
    device = str(next(model.parameters()).device)
    if not is_lora(model):
        safetensors.torch.load_model(model, file, strict=True, device=device)
        return
    result = model.load_state_dict(safetensors.torch.load_file(file, device=device), strict=False)
    assert not result.unexpected_keys, result.unexpected_keys


def checkpoint_meta(models: dict[str, torch.nn.Module], reference_is_base: bool) -> dict[str, Any]:
    """meta.json's LoRA entries: `adapter_only` (each LoRA model's `base_checksum`) and
    `reference_is_base`; nothing without a LoRA model (other checkpoints stay as they were)."""
    lora = {key: base_checksum(m) for key, m in models.items() if is_lora(m)}
    return {"adapter_only": lora, "reference_is_base": reference_is_base} if lora else {}


def check_checkpoint(
    path: Path, models: dict[str, torch.nn.Module], meta: dict[str, Any], reference_is_base: bool
) -> None:
    """`LoRACheckpointError`, before anything is loaded, unless the models are LoRA exactly
    where the checkpoint's were, with the same adapters on the same base weights, and the
    reference is the base exactly when it was."""
    adapter_only = meta.get("adapter_only", {})
    for key, model in models.items():
        if is_lora(model) != (key in adapter_only):
            saved = "LoRA adapters" if key in adapter_only else "a full model"
            raise LoRACheckpointError(
                f"{path} holds {saved} for {key!r} but the {key} passed "
                f"{'is' if is_lora(model) else 'is not'} a LoRA model; build it as the run did"
            )
        if key not in adapter_only:
            continue
        with safetensors.safe_open(path / f"{key}.safetensors", "pt") as file:
            saved_shapes = {k: tuple(file.get_slice(k).get_shape()) for k in file.keys()}
        shapes = {k: tuple(p.shape) for k, p in adapter_state_dict(model).items()}
        if saved_shapes != shapes:
            differ = sorted(
                k
                for k in saved_shapes.keys() | shapes.keys()
                if saved_shapes.get(k) != shapes.get(k)
            )
            raise LoRACheckpointError(
                f"{path}: the {key}'s adapters differ from the checkpoint's ({len(differ)} "
                f"names or shapes, e.g. {differ[:2]}); use the LoRA settings the run used"
            )
        checksum = base_checksum(model)
        if not math.isclose(checksum, adapter_only[key], rel_tol=1e-9):
            raise LoRACheckpointError(
                f"{path}: the {key}'s frozen base weights differ from the run's (sum of "
                f"squares {checksum!r}, saved {adapter_only[key]!r}); resume on the base "
                "model the run started from"
            )
    saved_is_base = meta.get("reference_is_base", False)
    if saved_is_base != reference_is_base:
        raise LoRACheckpointError(
            f"{path} was saved with reference_is_base={saved_is_base} but the state has "
            f"{reference_is_base}; pass the same objects the run saved"
        )
