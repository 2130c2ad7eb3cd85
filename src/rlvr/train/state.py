"""What a GRPO run holds between steps, as one object: what a checkpoint saves and loads."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from rlvr.models.lora import is_lora
from rlvr.models.value import ValueModel


@dataclass
class TrainState:
    """The policy and everything that must survive a restart for the run to continue exactly.

    The reference exists only when the KL coefficient is > 0: either `reference`, a frozen
    copy of the initial policy, or, for a LoRA policy, `reference_is_base`: the policy itself
    with its adapters disabled (its frozen base *is* the initial policy; no copy is made).
    `critic` and `critic_optimizer` exist only for PPO (`advantage_estimator="gae"`). `step`
    is the last completed step and `data_position` the training rows consumed so far (a
    resumed run skips that many)."""

    policy: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    generator: torch.Generator
    reference: torch.nn.Module | None = None
    critic: ValueModel | None = None
    critic_optimizer: torch.optim.Optimizer | None = None
    step: int = 0
    data_position: int = 0
    reference_is_base: bool = False

    def modules(self) -> dict[str, torch.nn.Module]:
        """The models with weights, by checkpoint name; absent ones left out."""
        named = {"policy": self.policy, "reference": self.reference, "critic": self.critic}
        return {k: v for k, v in named.items() if v is not None}

    def stateful(self) -> dict[str, Any]:
        """The objects with `state_dict()` / `load_state_dict()`, by checkpoint name."""
        named = {
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "critic_optimizer": self.critic_optimizer,
        }
        return {k: v for k, v in named.items() if v is not None}


def build_state(
    policy: torch.nn.Module,
    *,
    seed: int,
    lr: float,
    weight_decay: float = 0.0,
    warmup_steps: int = 0,
    reference: bool = False,
    critic_lr: float | None = None,
) -> TrainState:
    """A fresh state: AdamW on the policy's trainable parameters (a LoRA policy's adapters) with
    a linear warm-up to a constant LR, the sampling generator and torch's global RNG seeded with
    `seed`, a reference when `reference` (a frozen copy of the policy; for a LoRA policy its
    base, with no copy), and a value model with its own AdamW when `critic_lr` is set."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay)
    warmup = max(1, warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    state = TrainState(policy, optimizer, scheduler, generator)
    if reference and is_lora(policy):
        state.reference_is_base = True
    elif reference:
        state.reference = copy.deepcopy(policy).eval().requires_grad_(False)
    if critic_lr is not None:
        state.critic = ValueModel(policy)
        state.critic_optimizer = torch.optim.AdamW(state.critic.parameters(), lr=critic_lr)
    return state
