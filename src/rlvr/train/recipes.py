"""Named recipes: nothing but sets of switches of `GRPOConfig`.

GRPO and RLOO are siblings one switch apart; DAPO, Dr. GRPO and GSPO are patches, each a few
switches that combine with the others; CISPO and GMPO change the surrogate. A recipe only lists
what it changes from the defaults, so `rlvr recipes show NAME` prints exactly what makes it what
it is.

Where the papers' values were tuned for billion-parameter models on long chains of thought
(GSPO's clip range, DAPO's overlong buffer), the values here are scaled to the lab's ~40-token
completions; each such choice says so.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlvr.config import ConfigError, apply_overrides
from rlvr.train.config import GRPOConfig

RECIPES: dict[str, dict[str, Any]] = {
    # DeepSeekMath (arXiv:2402.03300): group mean/std, per-sequence token means, k3 KL in loss
    "grpo": {
        "advantage_estimator": "grpo",
        "scale_rewards": "group",
        "aggregation": "seq-mean-token-mean",
        "beta": 0.04,
        "kl_estimator": "k3",
    },
    # RLOO (Ahmadian et al. 2024): leave-one-out baseline, no std scaling; the KL penalty is
    # folded into the reward as in TRL's RLOOTrainer
    "rloo": {
        "advantage_estimator": "rloo",
        "scale_rewards": "none",
        "aggregation": "seq-mean-token-mean",
        "beta": 0.04,
        "kl_estimator": "k1",
        "kl_in_reward": True,
    },
    # Dr. GRPO (Liu et al. 2025, arXiv:2503.20783): no std division, no per-length division
    "dr_grpo": {
        "advantage_estimator": "dr_grpo",
        "scale_rewards": "none",
        "aggregation": "seq-mean-token-sum-norm",
        "beta": 0.0,
    },
    # DAPO (arXiv:2503.14476): clip-higher, dynamic sampling, token-mean, overlong shaping.
    # The paper's 4096-token overlong buffer is scaled to 8 of the lab's 48-token budget.
    "dapo": {
        "advantage_estimator": "grpo",
        "scale_rewards": "group",
        "aggregation": "token-mean",
        "epsilon_low": 0.2,
        "epsilon_high": 0.28,
        "dynamic_sampling": True,
        "overlong_buffer": 8,
        "overlong_penalty": 1.0,
        "beta": 0.0,
    },
    # GSPO (Zheng et al. 2025, arXiv:2507.18071): sequence-level, length-normalised ratio with
    # the paper's small clip range (3e-4 / 4e-4)
    "gspo": {
        "advantage_estimator": "grpo",
        "scale_rewards": "group",
        "ratio_level": "sequence",
        "epsilon_low": 3e-4,
        "epsilon_high": 4e-4,
        "aggregation": "seq-mean-token-mean",
        "beta": 0.0,
    },
    # CISPO (MiniMax-M1, arXiv:2506.13585): the IS weight clipped (no floor, cap 5: the fields'
    # defaults) and its gradient stopped, so every token keeps a gradient; token-mean, no KL
    "cispo": {
        "advantage_estimator": "grpo",
        "scale_rewards": "group",
        "surrogate": "cispo",
        "aggregation": "token-mean",
        "beta": 0.0,
    },
    # GMPO (Zhao et al. 2025, arXiv:2507.20673): the geometric mean of each sequence's token
    # ratios, log-ratios clipped per token to (-0.4, 0.4) (the fields' defaults), then the mean
    # over sequences; no KL, as the paper's scripts
    "gmpo": {
        "advantage_estimator": "grpo",
        "scale_rewards": "group",
        "surrogate": "gmpo",
        "aggregation": "seq-mean-token-mean",
        "beta": 0.0,
    },
    # REINFORCE++ (Hu et al. 2025, arXiv:2501.03262): batch-normalised advantages, KL in reward
    "reinforce++": {
        "advantage_estimator": "reinforce++",
        "aggregation": "token-mean",
        "beta": 0.01,
        "kl_estimator": "k1",
        "kl_in_reward": True,
    },
    # PPO with a learned critic: GAE per token; the baseline GRPO's memory claim is measured
    # against (policy + critic + reference)
    "ppo": {
        "advantage_estimator": "gae",
        "aggregation": "token-mean",
        "beta": 0.01,
        "kl_estimator": "k1",
        "kl_in_reward": True,
        "gamma": 1.0,
        "lam": 0.95,
    },
    # On-policy distillation (Thinking Machines 2025, tinker-cookbook): per-token reverse-KL
    # advantages from a teacher (--grpo.teacher DIR) on the student's own samples, no group
    # baseline needed (one completion per prompt), no KL to a reference. The verifier's reward
    # enters only with distill_reward_coef > 0, through REINFORCE++'s batch baseline (valid
    # for groups of one); without a teacher this is that REINFORCE++ alone
    "opd": {
        "group_size": 1,
        "prompts_per_step": 64,
        "advantage_estimator": "reinforce++",
        "aggregation": "token-mean",
        "beta": 0.0,
    },
}


def recipe_config(name: str, base: GRPOConfig | None = None) -> GRPOConfig:
    """`base` (default: GRPOConfig()) with the switches of recipe `name` applied (they replace
    base's values). An unknown name is a `ConfigError` (a ValueError) naming the recipes."""
    if name not in RECIPES:
        raise ConfigError(f"unknown recipe {name!r}; choose one of: {', '.join(RECIPES)}")
    return apply_overrides(base or GRPOConfig(), RECIPES[name])


def apply_recipe(name: str, config: GRPOConfig) -> GRPOConfig:
    """`config` built on recipe `name`: the recipe is a base config, and `config`'s explicit
    choices win. Each switch of the recipe fills the field of `config` that still has
    `GRPOConfig`'s default; a field set to any other value is kept.

    So `apply_recipe("dapo", GRPOConfig(lr=3e-5, epsilon_high=0.3))` is DAPO with that learning
    rate and clip. A recipe switch set back to exactly the default cannot be told apart from
    one left alone: set it after the recipe (`LabConfig.set`, or `apply_overrides` on the
    result); the CLI does so for `rlvr train RECIPE --grpo.x DEFAULT`.
    """
    defaults = GRPOConfig()
    recipe = recipe_config(name)
    unset = {
        key: getattr(recipe, key)
        for key in RECIPES[name]
        if getattr(config, key) == getattr(defaults, key)
    }
    return dataclasses.replace(config, **unset)


def describe_recipe(name: str) -> str:
    """The recipe's switches, then every other setting it inherits, as YAML-like text."""
    config = recipe_config(name)
    switches = RECIPES[name]
    lines = [f"# recipe {name}: switches it sets"]
    lines += [f"{k}: {v}" for k, v in switches.items()]
    lines.append("# inherited defaults")
    lines += [
        f"{f.name}: {getattr(config, f.name)}"
        for f in dataclasses.fields(config)
        if f.name not in switches
    ]
    return "\n".join(lines)
