"""The front door: a user error is one `rlvr: error: ...` line and exit 2, no traceback;
`--debug` or RLVR_DEBUG=1 shows the exception; recipes are subcommands of the one config."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rlvr.cli import main, parse_lab
from rlvr.config import RunPlace, UserError
from rlvr.pipelines.lab import LabConfig, resolve
from rlvr.train.config import GMPO, GRPOConfig, PPOClip
from rlvr.train.recipes import RECIPES, recipe_config


def cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one-line message `main(argv)` prints for a user error (it must exit 2)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlvr: error: "), err
    assert "Traceback" not in err[0]
    return err[0].removeprefix("rlvr: error: ")


@pytest.fixture
def no_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLVR_DEBUG", raising=False)


def test_unknown_task(tmp_path, capsys, no_debug):
    message = cli_error(["train", "--task", "poetry", "--runs-dir", str(tmp_path)], capsys)
    assert message.startswith("unknown task 'poetry'") and "FILE.jsonl" in message


def test_unknown_key_names_the_nearest(tmp_path, capsys, no_debug):
    message = cli_error(["train", "--set", "betta=0.1", "--runs-dir", str(tmp_path)], capsys)
    assert "unknown key 'betta'" in message and "did you mean 'beta'" in message


def test_wrong_type(tmp_path, capsys, no_debug):
    message = cli_error(["train", "--set", "group_size=eight", "--runs-dir", str(tmp_path)], capsys)
    assert message == "group_size: expected int, got 'eight' (str, not a valid int)"


def test_impossible_setting_from_the_one_validator(tmp_path, capsys, no_debug):
    message = cli_error(["train", "--grpo.group-size", "1", "--runs-dir", str(tmp_path)], capsys)
    assert "group_size must be >= 2" in message


def test_malformed_jsonl(tmp_path, capsys, no_debug):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="\n')
    message = cli_error(["train", "--task", str(rows), "--runs-dir", str(tmp_path)], capsys)
    assert message.startswith(f"{rows}:2: not valid JSON")
    missing = tmp_path / "none.jsonl"
    message = cli_error(["sft", "--data", str(missing), "--run-dir", str(tmp_path / "s")], capsys)
    assert message.startswith(f"{missing}: cannot read the file")


def test_malformed_pipeline_yaml(tmp_path, capsys, no_debug):
    bad = tmp_path / "p.yaml"
    bad.write_text("stages: [{name: a, kind: base, steps: 3\n")
    assert cli_error(["pipeline", str(bad)], capsys).startswith(f"{bad}: invalid YAML at line")
    bad.write_text("stages:\n  - {name: rl, kind: grpo, grpo: {lr: 5e-4x}}\n")
    assert cli_error(["pipeline", str(bad)], capsys) == (
        f"{bad}: stages[0].grpo.lr: expected float, got '5e-4x' (str, not a valid float)"
    )


def test_missing_model_directory(tmp_path, capsys, no_debug):
    message = cli_error(["eval", "--model", str(tmp_path / "nope")], capsys)
    assert message == f"--model: model directory {tmp_path / 'nope'} does not exist"


def test_run_directory_exists(tmp_path, capsys, no_debug):
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "metrics.jsonl").write_text("")
    message = cli_error(["train", "--runs-dir", str(tmp_path), "--no-progress"], capsys)
    assert "already exists; pass --overwrite" in message


def test_unknown_recipe_and_the_old_recipe_flag(capsys, no_debug):
    assert cli_error(["train", "dapoo"], capsys).startswith("unknown recipe 'dapoo'")
    message = cli_error(["train", "--recipe", "dapo"], capsys)
    assert "rlvr train NAME" in message and "rlvr train dapo" in message
    assert "rlvr train NAME" in cli_error(["train", "--recipe=dapo"], capsys)


def test_unknown_command_is_one_line(capsys, no_debug):
    assert cli_error(["trian"], capsys).startswith("unknown command 'trian'")


def test_debug_shows_the_exception(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_DEBUG", "1")
    with pytest.raises(UserError, match="unknown task 'poetry'"):
        main(["train", "--task", "poetry", "--runs-dir", str(tmp_path)])
    monkeypatch.delenv("RLVR_DEBUG")
    with pytest.raises(UserError, match="unknown task 'poetry'"):
        main(["train", "--task", "poetry", "--debug", "--runs-dir", str(tmp_path)])
    with pytest.raises(UserError, match="unknown task 'poetry'"):
        main(["--debug", "train", "--task", "poetry", "--runs-dir", str(tmp_path)])


def test_programming_errors_keep_their_traceback(monkeypatch, no_debug):
    import rlvr.cli

    def broken(config):
        raise KeyError("a bug")

    monkeypatch.setitem(rlvr.cli.COMMANDS, "verify", (broken, rlvr.cli.VerifyConfig, ""))
    with pytest.raises(KeyError, match="a bug"):
        main(["verify"])


# --- recipes are base configs of the one dataclass -----------------------------------------


@pytest.mark.parametrize("name", list(RECIPES))
def test_the_library_does_what_the_cli_does(name):
    assert resolve(LabConfig(recipe=name)) == resolve(parse_lab([name]))
    assert resolve(LabConfig(recipe=name)).grpo.max_new_tokens == 48


def test_no_recipe_keeps_the_defaults():
    assert parse_lab([]) == LabConfig()
    assert resolve(LabConfig()).grpo == GRPOConfig(max_new_tokens=48)


def test_flags_override_the_recipe():
    argv = ["dapo", "--grpo.lr", "3e-5", "--grpo.surrogate.epsilon-high", "0.3"]
    config = resolve(parse_lab(argv))
    assert config.recipe == "dapo" and config.grpo.dynamic_sampling.enabled
    assert (config.grpo.lr, config.grpo.surrogate.epsilon_high) == (3e-5, 0.3)
    dapo = recipe_config("dapo")
    surrogate = dataclasses.replace(dapo.surrogate, epsilon_high=0.3)
    library = LabConfig(recipe="dapo", grpo=dataclasses.replace(dapo, lr=3e-5, surrogate=surrogate))
    assert resolve(library) == config
    # a grpo given in Python is taken as it is: the recipe fills only a grpo left out
    given = LabConfig(recipe="dapo", grpo=GRPOConfig(lr=3e-5))
    assert not resolve(given).grpo.dynamic_sampling.enabled
    # on the command line a clip left at its default is the recipe's: gspo's floor 3e-4
    config = resolve(parse_lab(["gspo", "--grpo.surrogate.epsilon-high", "1e-3"]))
    assert config.grpo.surrogate == PPOClip(epsilon_low=3e-4, epsilon_high=1e-3)


def test_a_recipe_switch_set_back_to_the_default_stays_set():
    # dynamic_sampling.enabled=False is GRPOConfig's default; the recipe must not fill it again
    argv = ["dapo", "--grpo.dynamic-sampling.no-enabled", "--grpo.beta", "0.0"]
    config = resolve(parse_lab(argv))
    assert not config.grpo.dynamic_sampling.enabled
    assert config.grpo.surrogate.epsilon_high == 0.28
    # so must a surrogate given back its default (ppo-clip's 0.2 / 0.2) on recipe cispo
    config = resolve(parse_lab(["cispo", "grpo.surrogate:ppo-clip"]))
    assert config.grpo.surrogate == PPOClip() and config.grpo.aggregation == "token-mean"
    grpo = resolve(parse_lab(["grpo", "--grpo.beta", "0"])).grpo
    assert grpo.beta == 0.0 and grpo.aggregation == recipe_config("grpo").aggregation


def test_set_is_sugar_for_the_typed_path():
    by_set = resolve(parse_lab(["dapo", "--set", "surrogate.epsilon_high=0.3", "beta=0.01"]))
    flags = ["--grpo.surrogate.epsilon-high", "0.3", "--grpo.beta", "0.01"]
    by_flags = resolve(parse_lab(["dapo", *flags]))
    assert by_set == by_flags and by_set.set == ()
    library = resolve(LabConfig(recipe="dapo", set=("surrogate.epsilon_high=0.3", "beta=0.01")))
    assert library == by_set
    gmpo = resolve(parse_lab(["--set", "surrogate=gmpo", "surrogate.epsilon_low=0.3"]))
    assert gmpo.grpo.surrogate == GMPO(epsilon_low=0.3)
    assert gmpo == resolve(
        parse_lab(["grpo.surrogate:gmpo", "--grpo.surrogate.epsilon-low", "0.3"])
    )


def test_resume_refuses_other_settings(tmp_path: Path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text("recipe: dapo\nseed: 3\nresume: false\ngrpo: {lr: 0.001}\n")
    config = resolve(LabConfig(resume=str(run), place=RunPlace(progress=False)))
    assert (config.place.seed, config.grpo.lr, config.recipe) == (3, 0.001, "dapo")
    assert (config.runs_dir, config.run_name, config.resume) == (str(tmp_path), "r", str(run))
    assert (
        resolve(LabConfig(resume=str(run), place=RunPlace(seed=3))).place.seed == 3
    )  # the saved value is fine
    with pytest.raises(UserError, match="refused: threads, grpo.lr"):
        resolve(LabConfig(resume=str(run), place=RunPlace(threads=4), grpo=GRPOConfig(lr=0.5)))


def test_resume_of_a_run_with_the_old_flat_fields_loads_them_in_their_parts(tmp_path: Path):
    # config.yaml as rlvr wrote it before the settings were grouped (every field flat)
    run = tmp_path / "old"
    run.mkdir()
    old = (
        "grpo: {lr: 0.001, epsilon_low: 0.2, epsilon_high: 0.28, surrogate: ppo-clip,\n"
        "  cispo_epsilon_high: 4.0, dynamic_sampling: true, max_sampling_tries: 5,\n"
        "  critic_lr: 0.0001, monitor_every: 0, rollout_correction: null, teacher: null}\n"
    )
    (run / "config.yaml").write_text(old)
    grpo = resolve(LabConfig(resume=str(run), place=RunPlace(progress=False))).grpo
    assert grpo.surrogate == PPOClip(epsilon_low=0.2, epsilon_high=0.28)
    assert (grpo.dynamic_sampling.enabled, grpo.dynamic_sampling.max_tries) == (True, 5)
    assert (grpo.critic.lr, grpo.monitor.every, grpo.lr) == (1e-4, 0, 1e-3)
    assert grpo.rollout_correction.mode is None and grpo.distill.teacher is None


def test_an_old_field_name_in_set_names_its_new_place(capsys, no_debug):
    message = cli_error(["lab", "--set", "epsilon_high=0.28"], capsys)
    assert "'epsilon_high' was renamed: write surrogate.epsilon_high" in message
