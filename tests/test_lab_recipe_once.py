"""The recipe is applied once (tyro's default instance, or a `LabConfig(recipe=...)` whose grpo
is left out), and the resolved configs are those the old double application gave.

tests/data/resolved_recipes.json was written by the code before the change (commit 5580cf1,
where `resolve` applied the recipe a second time and `cli._defaults_given` undid it): each
entry is the `recipe` and `grpo` of `resolve(parse_lab(ARGV))` or `resolve(LabConfig(recipe=R))`.
Its flat GRPO fields were then moved, values unchanged, to the nested parts that own them
(`train.config.RENAMED_FIELDS`; `share_prompt_forward: true` became `forward: auto`, what
`upgrade_flat_layout` makes of it), and the case names keep the flags as they were spelt then.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.cli import parse_lab
from rlvr.config import to_dict
from rlvr.pipelines.lab import LabConfig, recipe_lab_config, resolve

BEFORE = json.loads((Path(__file__).parent / "data" / "resolved_recipes.json").read_text())

ARGV = {
    "lab": [],
    "train dapo": ["dapo"],
    "train dapo --grpo.epsilon-high 0.3": ["dapo", "--grpo.surrogate.epsilon-high", "0.3"],
    "train dapo --grpo.no-dynamic-sampling": ["dapo", "--grpo.dynamic-sampling.no-enabled"],
    "train dapo --set beta=0.01": ["dapo", "--set", "beta=0.01"],
    "train dr_grpo": ["dr_grpo"],
    "train gspo --grpo.lr 3e-5": ["gspo", "--grpo.lr", "3e-5"],
    "train rloo": ["rloo"],
    "train grpo --grpo.beta 0": ["grpo", "--grpo.beta", "0"],
}


def _recorded(config: LabConfig) -> dict:
    return {"recipe": config.recipe, "grpo": to_dict(config.grpo)}


@pytest.mark.parametrize("name", list(ARGV))
def test_the_command_line_resolves_as_before(name):
    assert _recorded(resolve(parse_lab(ARGV[name]))) == BEFORE[name]


@pytest.mark.parametrize("recipe", ["dapo", "dr_grpo", "gspo", "rloo", "ppo"])
def test_the_library_resolves_as_before(recipe):
    assert _recorded(resolve(LabConfig(recipe=recipe))) == BEFORE[f"LabConfig(recipe={recipe!r})"]
    assert LabConfig(recipe=recipe) == recipe_lab_config(recipe)  # before resolve, too


def test_the_recorded_cases_differ():
    # the fixture is no copy of one config: the switches it records tell the cases apart
    dapo, plain = BEFORE["train dapo"]["grpo"], BEFORE["lab"]["grpo"]
    enabled = dapo["dynamic_sampling"]["enabled"]
    assert dapo != plain and enabled and not plain["dynamic_sampling"]["enabled"]
    no_sampling = BEFORE["train dapo --grpo.no-dynamic-sampling"]["grpo"]
    assert not no_sampling["dynamic_sampling"]["enabled"]
    assert BEFORE["train dapo --grpo.epsilon-high 0.3"]["grpo"]["surrogate"]["epsilon_high"] == 0.3
