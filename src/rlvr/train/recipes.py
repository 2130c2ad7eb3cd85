"""Named recipes: nothing but sets of switches of `GRPOConfig`, in its YAML form (a nested
config's switches as a mapping, `critic: {lam: 0.95}`; a surrogate tagged by its name).

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

from rlvr.config import ConfigError, apply_overrides, warn
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
        "surrogate": {"name": "ppo-clip", "epsilon_low": 0.2, "epsilon_high": 0.28},
        "dynamic_sampling": {"enabled": True},
        "overlong": {"buffer": 8, "penalty": 1.0},
        "beta": 0.0,
    },
    # GSPO (Zheng et al. 2025, arXiv:2507.18071): sequence-level, length-normalised ratio with
    # the paper's small clip range (3e-4 / 4e-4)
    "gspo": {
        "advantage_estimator": "grpo",
        "scale_rewards": "group",
        "ratio_level": "sequence",
        "surrogate": {"name": "ppo-clip", "epsilon_low": 3e-4, "epsilon_high": 4e-4},
        "aggregation": "seq-mean-token-mean",
        "beta": 0.0,
    },
    # CISPO (MiniMax-M1, arXiv:2506.13585): the IS weight clipped (no floor, cap 5: CISPO's
    # defaults) and its gradient stopped, so every token keeps a gradient; token-mean, no KL
    "cispo": {
        "advantage_estimator": "grpo",
        "scale_rewards": "group",
        "surrogate": {"name": "cispo"},
        "aggregation": "token-mean",
        "beta": 0.0,
    },
    # GMPO (Zhao et al. 2025, arXiv:2507.20673): the geometric mean of each sequence's token
    # ratios, log-ratios clipped per token to (-0.4, 0.4) (GMPO's defaults), then the mean
    # over sequences; no KL, as the paper's scripts
    "gmpo": {
        "advantage_estimator": "grpo",
        "scale_rewards": "group",
        "surrogate": {"name": "gmpo"},
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
        "critic": {"gamma": 1.0, "lam": 0.95},
    },
    # On-policy distillation (Thinking Machines 2025, tinker-cookbook): per-token reverse-KL
    # advantages from a teacher (--grpo.distill.teacher DIR) on the student's own samples, no
    # group baseline needed (one completion per prompt), no KL to a reference. The verifier's
    # reward enters only with distill.reward_coef > 0, through REINFORCE++'s batch baseline (valid
    # for groups of one); without a teacher this is that REINFORCE++ alone
    "opd": {
        "group_size": 1,
        "prompts_per_step": 64,
        "advantage_estimator": "reinforce++",
        "aggregation": "token-mean",
        "beta": 0.0,
    },
}


def switch_keys(name: str) -> list[str]:
    """The dotted keys of recipe `name`'s switches: a nested config's each (`critic.lam`), a
    surrogate whole (`surrogate`)."""
    keys = []
    for key, value in RECIPES[name].items():
        nested = isinstance(value, dict) and "name" not in value
        keys += [f"{key}.{inner}" for inner in value] if nested else [key]
    return keys


def switch_text(name: str) -> str:
    """Recipe `name`'s switches on one line as the recipe gives them: `key=value`, nested keys
    dotted (`critic.lam=0.95`), a surrogate as flow YAML (`surrogate={name: cispo}`)."""
    items = []
    for key in switch_keys(name):
        value: Any = RECIPES[name]
        for part in key.split("."):
            value = value[part]
        if isinstance(value, dict):
            value = "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
        items.append(f"{key}={value}")
    return ", ".join(items)


def field_value(config: Any, key: str) -> Any:
    """The value of the (dotted) field `key` of `config`: `field_value(c, "critic.lam")`."""
    for name in key.split("."):
        config = getattr(config, name)
    return config


def recipe_config(name: str, base: GRPOConfig | None = None) -> GRPOConfig:
    """`base` (default: GRPOConfig()) with the switches of recipe `name` applied (they replace
    base's values). An unknown name is a `ConfigError` (a ValueError) naming the recipes."""
    if name not in RECIPES:
        raise ConfigError(f"unknown recipe {name!r}; choose one of: {', '.join(RECIPES)}")
    return apply_overrides(base or GRPOConfig(), RECIPES[name])


def apply_recipe(name: str, config: GRPOConfig) -> GRPOConfig:
    """`config` built on recipe `name`: the recipe is a base config, and `config`'s explicit
    choices win. Each switch of the recipe (a field, a nested one such as `critic.lam`, or the
    `surrogate`) fills the field of `config` that still has `GRPOConfig`'s default; a field
    set to any other value is kept. A surrogate of the recipe's kind has each of its clips
    still at the default filled from the recipe's.

    So `apply_recipe("gspo", GRPOConfig(lr=3e-5, surrogate=PPOClip(epsilon_high=1e-3)))` is
    GSPO with that learning rate and cap (its floor GSPO's 3e-4), as `rlvr train gspo
    --grpo.lr 3e-5 --grpo.surrogate.epsilon-high 1e-3`; `apply_recipe("dapo",
    GRPOConfig(surrogate=CISPO()))` is DAPO with CISPO's surrogate (warned about: a surrogate
    of another kind than the recipe's replaces it, which `rlvr check-loss --recipe cispo
    --grpo.surrogate.epsilon-high 2` would do, its flags binding to the default ppo-clip). A
    recipe switch set back to exactly the default cannot be told apart from one left alone: set
    it after the recipe (`LabConfig.set`, or `apply_overrides` on the result); `rlvr train`
    has no such case, since there the recipe is the parser's default (`recipe_lab_config`).
    """
    defaults = GRPOConfig()
    recipe = recipe_config(name)
    unset = {}
    for key in switch_keys(name):
        mine, theirs = field_value(config, key), field_value(recipe, key)
        if mine == field_value(defaults, key):
            unset[key] = theirs
        elif dataclasses.is_dataclass(mine) and type(mine) is type(theirs):  # same surrogate
            unset[key] = _fill_defaults(mine, theirs)
        elif dataclasses.is_dataclass(mine):  # flags of a command whose default is not the recipe
            warn(
                f"recipe {name}: its {key} {_shown(theirs)} is replaced by the {key} given, "
                f"{_shown(mine)}; to keep the recipe's, name it (grpo.{key}:{theirs.name})"
            )
    return apply_overrides(config, unset)


def _fill_defaults(mine: Any, theirs: Any) -> Any:
    """`mine` with each field still at its class's default taken from `theirs` (same class)."""
    fresh = type(mine)()
    changes = {
        f.name: getattr(theirs, f.name)
        for f in dataclasses.fields(mine)
        if getattr(mine, f.name) == getattr(fresh, f.name)
    }
    return dataclasses.replace(mine, **changes)


def describe_recipe(name: str) -> str:
    """The recipe's switches, then every other setting it inherits, as YAML-like text (nested
    settings dotted, `critic.lam`; a surrogate whole)."""
    config = recipe_config(name)
    switches = switch_keys(name)
    lines = [f"# recipe {name}: switches it sets"]
    lines += [f"{k}: {_shown(field_value(config, k))}" for k in switches]
    lines.append("# inherited defaults")
    lines += [f"{k}: {_shown(v)}" for k, v in _leaves(config) if k not in switches]
    return "\n".join(lines)


def _leaves(config: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of each setting of `config`: nested configs opened, except a
    tagged one (a surrogate), shown whole."""
    leaves = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and not hasattr(value, "name"):
            leaves += _leaves(value, f"{prefix}{f.name}.")
        else:
            leaves.append((prefix + f.name, value))
    return leaves


def _shown(value: Any) -> str:
    """A value as YAML flow text: a config as `{name: cispo, epsilon_low: 1.0, ...}`."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return "{" + ", ".join(f"{f.name}: {_shown(getattr(value, f.name))}" for f in fields) + "}"
    return str(value)
