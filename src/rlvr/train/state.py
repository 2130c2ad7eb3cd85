"""What a GRPO run holds between steps, as one object: what a checkpoint saves and loads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rlvr.models.value import ValueModel
from rlvr.train.distributed import DistContext
from rlvr.train.lora_state import make_reference
from rlvr.train.strategy import LocalStrategy, Strategy, make_strategy


@dataclass
class TrainState:
    """The policy and everything that must survive a restart for the run to continue exactly.

    The reference exists only when the KL coefficient is > 0: either `reference`, a frozen
    copy of the initial policy, or, for a LoRA policy, `reference_is_base`: the policy itself
    with its adapters disabled (its frozen base *is* the initial policy; no copy is made).
    `critic` and `critic_optimizer` exist only for PPO (`advantage_estimator="gae"`). `step`
    is the last completed step and `data_position` the training rows consumed so far (a
    resumed run skips that many).

    `dist_ctx`: the torch.distributed ranks the models are split over (FSDP2); None or one
    rank: one process. `strategy` is how the learner works on that layout (`train/strategy.py`:
    `make_strategy(dist_ctx)` unless given). Both are where the state lives, not state:
    checkpoints do not save them."""

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
    dist_ctx: DistContext | None = None
    strategy: Strategy = field(default_factory=LocalStrategy)

    def __post_init__(self) -> None:
        if isinstance(self.strategy, LocalStrategy):  # the default: the context's layout
            self.strategy = make_strategy(self.dist_ctx)

    @property
    def world_size(self) -> int:
        """The ranks the models are split over (1: one process)."""
        return self.strategy.world_size

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
    dist_ctx: DistContext | None = None,
    schedule: Callable[[int], float] | None = None,
    strategy: Strategy | None = None,
) -> TrainState:
    """A fresh state: AdamW on the policy's trainable parameters (a LoRA policy's adapters) with
    a linear warm-up to a constant LR, the sampling generator and torch's global RNG seeded with
    `seed`, a reference when `reference` (a frozen copy of the policy; for a LoRA policy its
    base, with no copy), and a value model with its own AdamW when `critic_lr` is set.

    The models are prepared by `strategy` (default `make_strategy(dist_ctx)`): with
    `dist_ctx` over more than one rank FSDP2 splits the policy in place (gradients summed over
    the ranks), and the reference and the critic, copied from it first, the same way
    (`FSDP2Strategy.prepare`); the optimizers are built last, over the prepared parameters
    (each rank's AdamW holds its shards' moments).
    `schedule(step)` is the LR multiplier after `step` scheduler steps (SFT's warm-up and
    cosine); None: the linear warm-up over `warmup_steps` to a constant LR.
    The random streams are drawn in the same order as in one process. A LoRA policy on
    several ranks is a `ConfigError` (`FSDP2Strategy.prepare`)."""
    strategy = strategy or make_strategy(dist_ctx)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    frozen, reference_is_base = make_reference(policy, reference)
    critic = ValueModel(policy) if critic_lr is not None else None
    strategy.prepare(policy, frozen, critic)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay)
    if schedule is None:
        warmup = max(1, warmup_steps)

        def schedule(s: int) -> float:
            return min(1.0, (s + 1) / warmup)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    state = TrainState(
        policy, optimizer, scheduler, generator, dist_ctx=dist_ctx, strategy=strategy
    )
    state.reference, state.reference_is_base = frozen, reference_is_base
    if critic is not None:
        state.critic = critic
        state.critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=critic_lr)
    return state
