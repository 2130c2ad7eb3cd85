"""The entry configs' shared parts: `RunPlace` and `TaskChoice` keep every flag spelled as
before, the registry builds the task from the `TaskChoice`, and saved configs of the flat
layout (before the parts were nested) still load, into the same values."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from rlvr.cli import parse_args, parse_lab
from rlvr.config import ConfigError, RunPlace, UserError, from_dict, read_yaml, to_dict
from rlvr.pipelines.dpo import DPOConfig, DPOPlace
from rlvr.pipelines.evaluate import EvalConfig
from rlvr.pipelines.lab import LabConfig, lab_task
from rlvr.pipelines.resume import resumed_config
from rlvr.pipelines.sample import SampleConfig
from rlvr.pipelines.sft import SFT_RESUME_FREE, SFTConfig, SFTTask
from rlvr.tasks.arithmetic import ArithmeticTaskConfig
from rlvr.tasks.reasoning import ReasoningTaskConfig
from rlvr.tasks.registry import TaskChoice, task_spec

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


def test_sft_and_dpo_flags_land_in_the_parts():
    sft = parse_args(
        SFTConfig,
        ["--task", "arithmetic", "--arithmetic.digits", "1", "--seed", "3", "--threads", "1"]
        + ["--device", "cpu", "--dtype", "float32", "--no-progress", "--overwrite"],
        "rlvr sft",
    )
    assert sft.place == RunPlace("cpu", "float32", 1, 3, False, True)
    assert sft.task == SFTTask("arithmetic", arithmetic=ArithmeticTaskConfig(digits=1))
    dpo = parse_args(
        DPOConfig,
        ["--task", "reasoning", "--reasoning.digits", "2", "--seed", "4", "--device", "cpu"]
        + ["--columns", "prompt=q"],
        "rlvr dpo",
    )
    assert dpo.place == DPOPlace(device="cpu", seed=4) and dpo.place.dtype == "float32"
    assert (dpo.task.name, dpo.task.reasoning.digits) == ("reasoning", 2)
    assert dpo.task.columns == "prompt=q"  # new: --columns, as `rlvr train` takes it


def test_sft_has_no_task_by_default_and_hides_what_it_lacks():
    assert SFTConfig().task == SFTTask() and SFTConfig().task.name is None
    assert parse_args(SFTConfig, ["--data", "d.jsonl"], "rlvr sft").task.name is None
    assert SFTConfig(task="code").task == SFTTask("code")  # a name alone, in Python
    with pytest.raises(UserError, match="Unrecognized options: --reasoning.digits"):
        parse_args(SFTConfig, ["--reasoning.digits", "2"], "rlvr sft")
    with pytest.raises(UserError, match="Unrecognized options: --dtype"):
        parse_args(DPOConfig, ["--dtype", "bfloat16"], "rlvr dpo")


def test_the_flat_sft_and_dpo_layouts_load():
    flat = {"seed": 3, "threads": 1, "progress": False, "overwrite": False, "device": "cpu"}
    sft = from_dict(
        SFTConfig,
        {**flat, "dtype": "float32", "task": "arithmetic", "columns": None}
        | {"arithmetic": {"digits": 1}, "steps": 5},
    )
    assert sft.place == RunPlace("cpu", "float32", 1, 3, False, False)
    assert sft.task == SFTTask("arithmetic", arithmetic=ArithmeticTaskConfig(digits=1))
    assert sft.steps == 5 and from_dict(SFTConfig, to_dict(sft)) == sft
    assert from_dict(SFTConfig, {"data": "d.jsonl", "task": None}).task == SFTTask()
    dpo = from_dict(DPOConfig, {**flat, "task": "reasoning", "reasoning": {"digits": 2}})
    assert dpo.place == DPOPlace("cpu", "float32", 1, 3, False, False)
    assert dpo.task == TaskChoice("reasoning", reasoning=ReasoningTaskConfig(digits=2))
    assert from_dict(DPOConfig, to_dict(dpo)) == dpo


def test_a_resume_of_a_flat_saved_sft_run_names_flags_as_spelled(tmp_path):
    saved = {"data": "d.jsonl", "steps": 5, "seed": 3, "device": "cpu", "threads": 1}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved | {"overwrite": False}))
    given = SFTConfig(place=RunPlace(device="cuda", threads=4, seed=3, progress=False))
    config = resumed_config(given, tmp_path, SFT_RESUME_FREE, "rlvr sft")
    assert (config.data, config.steps, config.place.seed) == ("d.jsonl", 5, 3)
    assert config.place == RunPlace(device="cuda", threads=4, seed=3, progress=False)
    other = SFTConfig(place=RunPlace(seed=7), task="code", lr=0.5)
    with pytest.raises(ConfigError, match="so they are refused: task, lr, seed$"):
        resumed_config(other, tmp_path, SFT_RESUME_FREE, "rlvr sft")
