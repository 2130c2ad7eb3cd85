"""LoRA adapters (Hu et al. 2021, arXiv:2106.09685) through `peft`, an optional dependency.

A LoRA model trains only its adapters; its base weights stay frozen. So the base is still there
to be used: with the adapters disabled the model *is* the initial policy, which is how RL
training gets its KL reference without a second copy of the weights (`rlvr.train.state`), and
a checkpoint only needs the adapters (`rlvr.train.checkpoint`).

`peft` is imported when first needed (`pip install -e ".[lora]"` in a checkout), so nothing
here costs anything when LoRA is off.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "LoRAConfig",
    "adapter_state_dict",
    "adapters_disabled",
    "apply_lora",
    "is_lora",
    "linear_module_names",
    "merged",
]

ALL_LINEAR = "all-linear"
INSTALL = 'pip install peft, or pip install rlvr[lora] (in a checkout: pip install -e ".[lora]")'


@dataclass(frozen=True)
class LoRAConfig:
    """LoRA adapters on the policy: only they train, the base weights stay frozen."""

    rank: int = 0
    """Rank of each adapter; 0 turns LoRA off (the whole model trains)."""
    alpha: float | None = None
    """Scaling numerator: adapters are scaled by alpha / rank. None: 2 x rank."""
    dropout: float = 0.0
    """Dropout on the adapters' input while training."""
    target_modules: tuple[str, ...] = (ALL_LINEAR,)
    """Names of the layers that get adapters (e.g. q_proj v_proj), or "all-linear": every
    linear layer but the output head."""
    save_adapter_only: bool = False
    """Save the trained model as a peft adapter directory (small; loading it needs the base
    model) instead of merging the adapters into a plain Hugging Face directory."""

    @property
    def enabled(self) -> bool:
        """Whether adapters are added at all (rank > 0)."""
        return self.rank > 0


def _peft():
    """The `peft` module, or an ImportError that says how to install it."""
    try:
        import peft  # optional: pip install rlvr[lora]
    except ImportError:
        raise ImportError(f"LoRA needs the peft package: {INSTALL}") from None
    return peft


def linear_module_names(model: nn.Module) -> list[str]:
    """The distinct last name components of `model`'s `nn.Linear` layers, sorted (q_proj, ...)."""
    names = {
        name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)
    }
    return sorted(names)


def _check_targets(model: nn.Module, targets: tuple[str, ...]) -> None:
    """ValueError (one line) when a target names no layer of `model`, listing the linear ones.

    A target matches a layer whose dotted name is it or ends in "." + it, as in peft."""
    if targets == (ALL_LINEAR,):
        return
    names = [name for name, _ in model.named_modules() if name]
    bad = [
        t
        for t in targets
        if t == ALL_LINEAR or not any(n == t or n.endswith("." + t) for n in names)
    ]
    if bad or not targets:
        raise ValueError(
            f"LoRA target_modules {list(bad)} not found ({ALL_LINEAR!r} goes alone); the "
            f"model's linear layers are: {', '.join(linear_module_names(model))}"
        )


def apply_lora(model: nn.Module, config: LoRAConfig, seed: int | None = None) -> nn.Module:
    """`model` wrapped with LoRA adapters per `config`: only the adapters require grad.

    The adapters are initialised from torch's global RNG, or, with `seed`, from a private
    stream seeded with it (the global one is left as it was). Raises ImportError (how to install
    peft) without `peft`, ValueError for a rank < 1 or a target layer the model lacks."""
    if config.rank < 1:
        raise ValueError(f"LoRA rank must be >= 1 to add adapters, got {config.rank}")
    _check_targets(model, config.target_modules)
    peft = _peft()
    from transformers import PreTrainedModel

    targets = ALL_LINEAR if config.target_modules == (ALL_LINEAR,) else list(config.target_modules)
    peft_config = peft.LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha if config.alpha is not None else 2 * config.rank,
        lora_dropout=config.dropout,
        target_modules=targets,
        # a causal LM gets peft's generation-aware wrapper; any other module the plain one
        task_type="CAUSAL_LM" if isinstance(model, PreTrainedModel) else None,
    )
    rng = torch.random.fork_rng() if seed is not None else contextlib.nullcontext()
    with rng, warnings.catch_warnings():
        # peft asks transformers 5 a deprecated question about gradient checkpointing
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
        if seed is not None:
            torch.manual_seed(seed)
        return peft.get_peft_model(model, peft_config)


def is_lora(model: nn.Module) -> bool:
    """Whether `model` is a peft model (its adapters train, its base is frozen)."""
    try:
        from peft import PeftModel
    except ImportError:  # without peft nothing can be a peft model
        return False
    return isinstance(model, PeftModel)


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that train (require grad), by `state_dict` name: a LoRA model's adapters."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block `model` computes as its base model (adapters off); restored after.

    The switch is on the shared layers: nothing else may run `model` meanwhile."""
    if not is_lora(model):
        raise TypeError(f"adapters_disabled needs a LoRA (peft) model, got {type(model).__name__}")
    with model.disable_adapter():
        yield model


def merged(model: nn.Module) -> nn.Module:
    """The plain model with the adapters folded into its weights (a non-LoRA model as is).

    Merges in place: use the returned model, not the LoRA one, afterwards."""
    if not is_lora(model):
        return model
    return model.merge_and_unload()
