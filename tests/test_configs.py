"""Typed configs (`rlvr.config`): every rule on hand-made dataclasses, then every builtin
pipeline YAML and every recipe bound to the real config classes, types checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import pytest
import yaml

import rlvr.pipelines
from rlvr.config import (
    ConfigError,
    UserError,
    apply_overrides,
    config_from_dict,
    from_dict,
    load_yaml_config,
    to_dict,
)
from rlvr.train.config import Critic, Distill, GRPOConfig, PPOClip, RolloutCorrection
from rlvr.train.recipes import RECIPES, field_value, switch_keys

BUILTIN = sorted((Path(rlvr.pipelines.__file__).parent / "builtin").glob("*.yaml"))


@dataclass(frozen=True)
class Optim:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: Literal["constant", "cosine"] = "constant"


@dataclass(frozen=True)
class Run:
    name: str
    steps: int = 10
    seed: int | None = None
    clip: Optional[float] = None  # noqa: UP045 (the typing spelling is supported too)
    greedy: bool = False
    level: Literal[1, 2, 3] = 1
    modes: tuple[str, ...] = ("default",)
    tags: list[str] = field(default_factory=list)
    shape: dict[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    anything: Any = None
    key: int | str = 0
    optim: Optim = field(default_factory=Optim)
    teacher: Optim | None = None


def error_of(call, *args, **kwargs) -> str:
    """The message of the ConfigError that `call` raises; it must be one line."""
    with pytest.raises(ConfigError) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- the rules, one by one --------------------------------------------------------------------


def test_nested_dataclasses_are_built_from_nested_mappings():
    run = from_dict(Run, {"name": "a", "optim": {"lr": 0.1}, "teacher": {"schedule": "cosine"}})
    assert run.optim == Optim(lr=0.1) and run.teacher == Optim(schedule="cosine")
    assert from_dict(Run, {"name": "a"}) == Run(name="a")  # absent keys keep their defaults


def test_yaml_1_1_number_strings_become_numbers():
    data = yaml.safe_load("name: a\nsteps: '20'\noptim: {lr: 5e-4}")
    assert data["optim"]["lr"] == "5e-4"  # PyYAML's YAML 1.1 reads this as a string
    run = from_dict(Run, data)
    assert run.optim.lr == 5e-4 and type(run.optim.lr) is float
    assert run.steps == 20 and type(run.steps) is int


def test_an_int_is_a_float_and_becomes_one():
    lr = from_dict(Optim, {"lr": 1}).lr
    assert lr == 1.0 and type(lr) is float


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"steps": True}, "steps: expected int, got True (bool)"),  # True is an int in Python
        ({"optim": {"lr": False}}, "optim.lr: expected float, got False (bool)"),
        ({"steps": 2.0}, "steps: expected int, got 2.0 (float)"),  # no float -> int
        ({"steps": "2.5"}, "steps: expected int, got '2.5' (str, not a valid int)"),
        (
            {"optim": {"lr": "5e-4x"}},
            "optim.lr: expected float, got '5e-4x' (str, not a valid float)",
        ),
        ({"greedy": 1}, "greedy: expected bool, got 1 (int)"),
        ({"greedy": "maybe"}, "greedy: expected bool, got 'maybe' (str, not a valid bool)"),
        ({"name": 3}, "name: expected str, got 3 (int)"),
        ({"seed": 1.5}, "seed: expected int, got 1.5 (float)"),  # X | None names X's error
        (
            {"optim": {"schedule": "linear"}},
            "optim.schedule: expected 'constant' | 'cosine', got 'linear' (str)",
        ),
        ({"level": 4}, "level: expected 1 | 2 | 3, got 4 (int)"),
        ({"modes": "default"}, "modes: expected tuple[str, ...], got 'default' (str)"),
        ({"modes": ["a", 2]}, "modes[1]: expected str, got 2 (int)"),
        (
            {"optim": {"betas": [0.9]}},
            "optim.betas: expected tuple[float, float], got [0.9] (list, 1 items)",
        ),
        (
            {"shape": {"layers": "two"}},
            "shape.layers: expected int, got 'two' (str, not a valid int)",
        ),
        ({"shape": {3: 1}}, "shape: key 3: expected str, got 3 (int)"),
        ({"optim": 0.1}, "optim: expected Optim, got 0.1 (float)"),
        ({"key": 1.5}, "key: expected int | str, got 1.5 (float)"),
    ],
)
def test_a_wrong_type_names_the_field_path_the_type_and_the_value(data, message):
    assert error_of(from_dict, Run, {"name": "a", **data}) == message


def test_where_prefixes_the_path_inside_a_larger_document():
    message = error_of(from_dict, Run, {"name": "a", "optim": {"lr": "5e-4x"}}, where="stages[2]")
    assert message == "stages[2].optim.lr: expected float, got '5e-4x' (str, not a valid float)"


def test_optional_fields_take_none_and_its_text():
    assert from_dict(Run, {"name": "a", "seed": None, "clip": 3}).clip == 3.0
    for text in ("none", "None", "null", ""):
        assert from_dict(Run, {"name": "a", "seed": text}).seed is None
    assert from_dict(Run, {"name": "a", "seed": "7"}).seed == 7


def test_text_for_bool_literal_and_unions():
    for text, value in [("true", True), ("False", False), ("yes", True), ("0", False)]:
        assert from_dict(Run, {"name": "a", "greedy": text}).greedy is value
    assert from_dict(Run, {"name": "a", "level": "2"}).level == 2  # Literal[1, 2, 3]
    assert from_dict(Run, {"name": "a", "key": "5"}).key == "5"  # int | str: exact type first
    assert from_dict(Run, {"name": "a", "key": 5}).key == 5


def test_containers_and_any():
    run = from_dict(
        Run,
        {
            "name": "a",
            "modes": ["x", "y"],
            "tags": ("t",),
            "anything": {1: [2]},
            "extra": {"beta": 0.1},
            "optim": {"betas": [0, 1]},
        },
    )
    assert run.modes == ("x", "y") and run.tags == ["t"] and run.anything == {1: [2]}
    assert run.optim.betas == (0.0, 1.0) and run.extra == {"beta": 0.1}


def test_unknown_and_missing_keys():
    message = error_of(from_dict, Run, {"name": "a", "optim": {"lrr": 1}})
    assert (
        message == "optim: unknown key 'lrr' (did you mean 'lr'?); valid keys: betas, lr, schedule"
    )
    message = error_of(from_dict, Run, {"nmae": "a"})
    assert message.startswith("unknown key 'nmae' (did you mean 'name'?); valid keys: anything,")
    assert error_of(from_dict, Run, {}) == "missing required key(s): name"
    assert error_of(from_dict, Optim, [1], where="stages[0]") == (
        "stages[0]: expected Optim, got [1] (list)"
    )


def test_config_error_is_a_user_error_and_a_value_error():
    assert issubclass(ConfigError, UserError) and issubclass(ConfigError, ValueError)
    assert config_from_dict(Optim, {"lr": "1e-2"}) == Optim(lr=0.01)


# --- overrides --------------------------------------------------------------------------------


def test_overrides_read_text_by_annotation_and_reach_into_nested_fields():
    run = apply_overrides(
        Run(name="a"),
        [
            "optim.lr=5e-4",
            "optim.schedule=cosine",
            "seed=none",
            "greedy=true",
            "steps=3",
            "level=3",
        ],
    )
    assert run.optim == Optim(lr=5e-4, schedule="cosine") and run.seed is None
    assert (run.greedy, run.steps, run.level) == (True, 3, 3)
    merged = apply_overrides(Run(name="a", optim=Optim(schedule="cosine")), {"optim": {"lr": 1}})
    assert merged.optim == Optim(lr=1.0, schedule="cosine")  # a mapping sets only its keys
    assert apply_overrides(Run(name="a"), {"optim": Optim(lr=2.0)}).optim == Optim(lr=2.0)


def test_override_errors_name_the_path():
    assert error_of(apply_overrides, Run(name="a"), ["optim.lr=fast"]) == (
        "optim.lr: expected float, got 'fast' (str, not a valid float)"
    )
    assert error_of(apply_overrides, Run(name="a"), {"steps": True}) == (
        "steps: expected int, got True (bool)"
    )
    assert error_of(apply_overrides, Run(name="a"), ["optim.lrr=1"]).startswith(
        "optim: unknown key 'lrr' (did you mean 'lr'?)"
    )
    assert (
        error_of(apply_overrides, Run(name="a"), ["name.x=1"]) == "name: str has no fields to set"
    )
    assert error_of(apply_overrides, Run(name="a"), ["steps"]) == "expected key=value, got 'steps'"
    assert error_of(apply_overrides, Run(name="a"), ["lr=1"], where="grpo").startswith(
        "grpo: unknown key 'lr'"
    )


def test_override_keys_may_use_dashes():
    config = apply_overrides(GRPOConfig(), ["dynamic-sampling.max-tries=5", "kl-in-reward=yes"])
    assert config.dynamic_sampling.max_tries == 5 and config.kl_in_reward is True


# --- to_dict and YAML files -------------------------------------------------------------------


def test_to_dict_is_plain_data_and_from_dict_inverts_it():
    run = Run(name="a", modes=("x",), seed=3, shape={"layers": 2}, teacher=Optim(lr=0.5))
    data = to_dict(run)
    assert data["modes"] == ["x"] and data["optim"] == {
        "lr": 1e-3,
        "betas": [0.9, 0.999],
        "schedule": "constant",
    }
    assert from_dict(Run, yaml.safe_load(yaml.safe_dump(data))) == run
    with pytest.raises(TypeError):
        to_dict(Run)


def test_load_yaml_config_names_the_file_in_every_error(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("name: a\noptim:\n  lr: 5e-4\n")
    assert load_yaml_config(Run, path) == Run(name="a", optim=Optim(lr=5e-4))
    path.write_text("")
    assert load_yaml_config(Optim, path) == Optim()
    path.write_text("name: a\noptim: {lr: 5e-4x}\n")
    assert error_of(load_yaml_config, Run, path) == (
        f"{path}: optim.lr: expected float, got '5e-4x' (str, not a valid float)"
    )
    path.write_text("name: [a\n")
    assert error_of(load_yaml_config, Run, path).startswith(f"{path}: invalid YAML at line 2")
    path.write_text("- a\n")
    assert error_of(load_yaml_config, Run, path) == f"{path}: Run: expected Run, got ['a'] (list)"
    missing = tmp_path / "absent.yaml"
    assert error_of(load_yaml_config, Run, missing).startswith(f"{missing}: cannot read the file")


# --- the real configs: builtin pipelines and recipes --------------------------------------------


def test_there_are_builtin_pipelines():
    assert len(BUILTIN) >= 4


@pytest.mark.parametrize("path", BUILTIN, ids=lambda p: p.stem)
def test_every_builtin_pipeline_is_typed(path):
    from rlvr.models.tiny import TinyModelConfig
    from rlvr.pipelines.stages import STAGE_KINDS
    from rlvr.tasks.reasoning import ReasoningTaskConfig

    data = yaml.safe_load(path.read_text())
    for key, cls in (("task", ReasoningTaskConfig), ("tiny", TinyModelConfig)):
        config = from_dict(cls, data.get(key, {}), where=key)
        assert from_dict(cls, to_dict(config)) == config
    for i, entry in enumerate(data["stages"]):
        where = f"stages[{i}]"
        params = {k: v for k, v in entry.items() if k not in ("name", "kind")}
        grpo = from_dict(GRPOConfig, params.get("grpo", {}), where=f"{where}.grpo")
        assert from_dict(GRPOConfig, to_dict(grpo)) == grpo
        settings = from_dict(STAGE_KINDS[entry["kind"]][0], params, where=where)
        assert from_dict(type(settings), to_dict(settings)) == settings


def test_a_pipeline_grpo_dict_is_typed_through_yaml():
    stage = yaml.safe_load("{name: rl, kind: grpo, grpo: {lr: 5e-4, beta: 0, mu: 2}}")
    grpo = from_dict(GRPOConfig, stage["grpo"], where="stages[2].grpo")
    assert (grpo.lr, grpo.beta, grpo.mu) == (5e-4, 0.0, 2) and type(grpo.beta) is float
    bad = yaml.safe_load("{grpo: {lr: 5e-4x}}")["grpo"]
    assert error_of(from_dict, GRPOConfig, bad, where="stages[2].grpo") == (
        "stages[2].grpo.lr: expected float, got '5e-4x' (str, not a valid float)"
    )


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_recipe_is_typed_and_round_trips(name):
    config = apply_overrides(GRPOConfig(), RECIPES[name])
    assert from_dict(GRPOConfig, RECIPES[name]) == config
    assert from_dict(GRPOConfig, to_dict(config)) == config
    text = []
    for key in switch_keys(name):
        raw = RECIPES[name]
        for part in key.split("."):
            raw = raw[part]
        value = field_value(config, key)
        if isinstance(raw, dict):  # a surrogate: its name, then its clips
            text.append(f"{key}={raw['name']}")
            text += [f"{key}.{k}={v}" for k, v in raw.items() if k != "name"]
            raw = {k: (v, type(v)) for k, v in raw.items()}
            value = {k: (getattr(value, k), type(getattr(value, k))) for k in raw}
        else:
            text.append(f"{key}={str(raw).lower() if isinstance(raw, bool) else raw}")
            raw, value = (raw, type(raw)), (value, type(value))
        assert raw == value  # nothing was coerced: the recipe's values have the fields' types
    assert apply_overrides(GRPOConfig(), text) == config  # the --set path gives the same


def test_grpo_config_round_trips_through_yaml_text():
    config = GRPOConfig(
        lr=5e-5,
        surrogate=PPOClip(clip_ratio_c=3.0),
        critic=Critic(lam=0.9),
        rollout_correction=RolloutCorrection(mode="icepop", cap=4.0),
        distill=Distill(teacher="t", reward_coef=0.5),
        max_new_tokens=64,
    )
    text = yaml.safe_dump(to_dict(config), sort_keys=False)
    assert from_dict(GRPOConfig, yaml.safe_load(text)) == config
