"""Recipes are sets of switches; --set overrides name valid keys; each recipe trains."""

import dataclasses

import pytest

from rlvr.cli import main
from rlvr.config import apply_overrides
from rlvr.train.config import CISPO, GRPOConfig, PPOClip, check_grpo_config
from rlvr.train.recipes import (
    RECIPES,
    apply_recipe,
    describe_recipe,
    recipe_config,
    switch_text,
)


def test_overrides_parse_by_field_type():
    config = apply_overrides(
        GRPOConfig(),
        [
            "surrogate.epsilon_high=0.28",
            "group_size=4",
            "dynamic_sampling.enabled=true",
            "surrogate.clip_ratio_c=3",
            "aggregation=seq-mean-token-mean",
            "critic.lam=0.95",
        ],
    )
    assert (config.surrogate.epsilon_high, config.group_size) == (0.28, 4)
    assert config.dynamic_sampling.enabled is True and config.critic.lam == 0.95
    assert config.surrogate.clip_ratio_c == 3.0 and config.aggregation == "seq-mean-token-mean"
    assert apply_overrides(config, ["surrogate.clip_ratio_c=none"]).surrogate.clip_ratio_c is None


def test_unknown_key_names_the_nearest_and_the_valid_ones():
    with pytest.raises(ValueError, match=r"did you mean 'beta'.*valid keys: .*aggregation"):
        apply_overrides(GRPOConfig(), ["betaa=0.3"])
    with pytest.raises(ValueError, match=r"did you mean 'epsilon_high'.*valid keys: .*epsilon_low"):
        apply_overrides(GRPOConfig(), ["surrogate.epsilon_hgih=0.3"])
    with pytest.raises(ValueError, match="not a valid int"):
        apply_overrides(GRPOConfig(), ["group_size=eight"])
    with pytest.raises(ValueError, match="key=value"):
        apply_overrides(GRPOConfig(), ["beta"])


def test_grpo_config_has_at_most_45_fields():
    # each component owns its settings in a nested config (issue 25, item 3): 62 flat -> 43
    assert len(dataclasses.fields(GRPOConfig)) <= 45


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_recipe_is_a_valid_set_of_switches(name):
    config = recipe_config(name)
    check_grpo_config(dataclasses.replace(config, max_new_tokens=48))
    changed = {
        f.name
        for f in dataclasses.fields(config)
        if getattr(config, f.name) != getattr(GRPOConfig(), f.name)
    }
    assert changed <= set(RECIPES[name])  # a recipe changes nothing it does not list
    assert describe_recipe(name).startswith(f"# recipe {name}")


def test_recipes_differ_where_the_papers_differ():
    grpo, rloo, dr, dapo, gspo = (
        recipe_config(n) for n in ("grpo", "rloo", "dr_grpo", "dapo", "gspo")
    )
    assert grpo.advantage_estimator == "grpo" and rloo.advantage_estimator == "rloo"
    assert dr.scale_rewards == "none" and dr.aggregation == "seq-mean-token-sum-norm"
    assert dapo.surrogate.epsilon_high > dapo.surrogate.epsilon_low
    assert dapo.dynamic_sampling.enabled and dapo.overlong.buffer == 8
    assert gspo.ratio_level == "sequence" and gspo.surrogate.epsilon_high < 1e-3
    with pytest.raises(ValueError, match="unknown recipe"):
        recipe_config("ppo2")


def test_recipes_command_lists_and_shows(capsys):
    main(["recipes"])
    assert "dapo" in capsys.readouterr().out
    main(["recipes", "show", "gspo"])
    assert "ratio_level: sequence" in capsys.readouterr().out


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_recipe_trains_a_few_steps(name, tmp_path):
    from tests.test_lab import TINY

    runs = tmp_path / "runs"
    main(
        [
            "train",
            name,
            "--runs-dir",
            str(runs),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--run-name",
            "r",
            *TINY,
        ]
    )
    from rlvr.report.run_dir import read_jsonl

    metrics = read_jsonl(runs / "r" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    config = (runs / "r" / "config.yaml").read_text()
    assert f"recipe: {name}" in config
    if name == "ppo":
        assert "value/mse" in metrics[1]
    if name == "dapo":
        assert metrics[1]["sampling/tries"] >= 1


def test_a_surrogate_of_another_kind_replaces_the_recipes_with_a_warning(capsys):
    # the same kind: each clip left at its default is the recipe's (gspo's floor 3e-4)
    gspo = apply_recipe("gspo", GRPOConfig(surrogate=PPOClip(epsilon_high=1e-3)))
    assert gspo.surrogate == PPOClip(epsilon_low=3e-4, epsilon_high=1e-3)
    assert capsys.readouterr().err == ""
    # another kind: the given one is kept, and said so (a flag that bound to ppo-clip)
    gmpo = apply_recipe("gmpo", GRPOConfig(surrogate=PPOClip(epsilon_low=0.3)))
    assert gmpo.surrogate == PPOClip(epsilon_low=0.3) and gmpo.aggregation == "seq-mean-token-mean"
    err = capsys.readouterr().err
    assert "recipe gmpo: its surrogate {name: gmpo," in err and "grpo.surrogate:gmpo" in err
    assert apply_recipe("dapo", GRPOConfig(surrogate=CISPO())).surrogate == CISPO()


def test_the_recipe_list_spells_nested_switches_dotted_and_a_surrogate_as_yaml():
    assert switch_text("ppo").endswith("kl_in_reward=True, critic.gamma=1.0, critic.lam=0.95")
    dapo = switch_text("dapo")
    assert "surrogate={name: ppo-clip, epsilon_low: 0.2, epsilon_high: 0.28}" in dapo
    assert "dynamic_sampling.enabled=True, overlong.buffer=8" in dapo
