"""The entry configs' shared parts: `RunPlace` and `TaskChoice` keep every flag spelled as
before, the registry builds the task from the `TaskChoice`, and saved configs of the flat
layout (before the parts were nested) still load, into the same values."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rlvr.cli import parse_args, parse_lab
from rlvr.config import ConfigError, RunPlace, UserError, from_dict, read_yaml, to_dict
from rlvr.pipelines.evaluate import EvalConfig
from rlvr.pipelines.lab import LabConfig, lab_task
from rlvr.pipelines.sample import SampleConfig
from rlvr.tasks.arithmetic import ArithmeticTaskConfig
from rlvr.tasks.registry import TaskChoice, build_task, task_spec

COURSE = Path(__file__).resolve().parents[1] / "course" / "results"


def test_lab_flags_land_in_the_parts():
    config = parse_lab(
        ["--seed", "3", "--threads", "1", "--device", "cpu", "--dtype", "float32"]
        + ["--no-progress", "--overwrite", "--task", "reasoning", "--reasoning.digits", "3"]
        + ["--arithmetic.digits", "1"]
    )
    assert config.place == RunPlace("cpu", "float32", 1, 3, False, True)
    assert (config.task.name, config.task.reasoning.digits) == ("reasoning", 3)
    assert config.task.arithmetic == ArithmeticTaskConfig(digits=1)


def test_sample_and_eval_flags_land_in_the_parts():
    sample = parse_args(
        SampleConfig,
        ["--model", "m", "--output", "o.jsonl", "--seed", "4", "--threads", "3", "--overwrite"]
        + ["--columns", "prompt=q", "--task", "f.jsonl"],
        "rlvr sample",
    )
    assert sample.sampling.seed == 4  # --seed is the sampling's, as before
    assert (sample.place.threads, sample.place.overwrite) == (3, True)
    assert (sample.task.name, sample.task.columns) == ("f.jsonl", "prompt=q")
    evaluate = parse_args(EvalConfig, ["--model", "m", "--seed", "2", "--dtype", "float32"], "e")
    assert (evaluate.place.seed, evaluate.place.dtype) == (2, "float32")


@pytest.mark.parametrize("hidden", ["--progress", "--overwrite", "--threads"])
def test_eval_hides_what_it_does_not_use(hidden):
    with pytest.raises(UserError, match=f"Unrecognized options: {hidden}"):
        parse_args(EvalConfig, ["--model", "m", hidden, "1"], "rlvr eval")


def test_the_registry_dispatches_on_the_choice():
    choice = TaskChoice(arithmetic=ArithmeticTaskConfig(digits=1, held_out_size=5))
    spec = task_spec(choice, seed=0)
    assert spec.name == "arithmetic" and len(spec.held_out_rows()) == 5
    flat = build_task("arithmetic", ArithmeticTaskConfig(digits=1, held_out_size=5))
    assert flat.held_out_rows() == spec.held_out_rows()
    assert task_spec(TaskChoice("code")).name == "code"
    with pytest.raises(ValueError, match="--columns 'prompt=q' maps a dataset file"):
        task_spec(TaskChoice("arithmetic", columns="prompt=q"))


def test_a_flat_saved_lab_config_loads_into_the_parts():
    flat = {"seed": 3, "threads": 1, "progress": False, "device": "cpu", "task": "reasoning"}
    flat |= {"arithmetic": {"digits": 1}, "columns": None, "run_name": "r"}
    config = from_dict(LabConfig, flat)
    assert config.place == RunPlace(device="cpu", threads=1, seed=3, progress=False)
    assert config.task == TaskChoice("reasoning", arithmetic=ArithmeticTaskConfig(digits=1))
    assert config.run_name == "r"
    assert from_dict(LabConfig, to_dict(config)) == config  # the nested form round-trips


def test_a_key_in_both_layouts_is_refused():
    with pytest.raises(ConfigError, match="seed and place.seed both given"):
        from_dict(LabConfig, {"seed": 1, "place": {"seed": 2}})


@pytest.mark.parametrize("run", ["lab", "hacking_weak"])
def test_the_course_results_saved_configs_still_load(run):
    data = read_yaml(COURSE / run / "config.yaml")
    assert "seed" in data and "place" not in data  # saved in the flat layout
    config = from_dict(LabConfig, data)
    assert config.place.seed == data["seed"] and config.task.name == data["task"]
    assert config.verifier == data["verifier"]
    assert to_dict(config.task.arithmetic) == data["arithmetic"]
    assert lab_task(config).name == data["task"]


def test_the_flat_eval_and_sample_layouts_load():
    evaluate = from_dict(EvalConfig, {"model": "m", "seed": 5, "task": "code"})
    assert (evaluate.place.seed, evaluate.task.name) == (5, "code")
    sample = from_dict(SampleConfig, {"model": "m", "output": "o", "threads": 4, "overwrite": True})
    assert dataclasses.astuple(sample.place)[2:] == (4, 0, True, True)


def test_a_task_name_alone_is_a_choice():
    # course/lab.md's library call: LabConfig(task="rows.jsonl", ...)
    assert LabConfig(task="rows.jsonl").task == TaskChoice("rows.jsonl")
    assert LabConfig(task="reasoning") == LabConfig(task=TaskChoice("reasoning"))
