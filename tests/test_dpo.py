"""DPO pairs, the `rlvr dpo` run directory and the stage kinds (the error kinds:
test_error_kinds.py)."""

from __future__ import annotations

import json
import math
import random

import pytest

from rlvr.config import ConfigError, RunPlace
from rlvr.devices import resolve_precision
from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model, save_model
from rlvr.pipelines import stages
from rlvr.pipelines.base_model import BaseConfig
from rlvr.pipelines.common import user_task
from rlvr.pipelines.dpo import (
    DPOConfig,
    DPOPlace,
    DPOStage,
    _model_dir,
    check_dpo_config,
    dpo_completions,
    dpo_run,
    run_dpo,
)
from rlvr.pipelines.lab import LabConfig, build_base_model, lab_base_dir, lab_task
from rlvr.pipelines.pipeline import load_pipeline, parse_pipeline
from rlvr.report.run_dir import RunDirectory, read_jsonl
from rlvr.tasks.registry import TaskChoice
from rlvr.tasks.spec import TaskSpec
from rlvr.train.dpo import pairs_of_prompt

# --- pairs -------------------------------------------------------------------------------------


def test_pairs_are_a_correct_and_a_wrong_completion_of_the_same_prompt():
    completions = ["a", "b", "c", "a", "d"]
    scores = [1.0, 0.0, 1.0, 1.0, 0.0]  # correct: a, c (a twice); wrong: b, d
    pairs = pairs_of_prompt("p", completions, scores, 5, random.Random(0))
    assert len(pairs) == 2  # min(2 distinct correct, 2 wrong, cap 5)
    assert {p.chosen for p in pairs} == {"a", "c"}
    assert {p.rejected for p in pairs} == {"b", "d"}
    assert all(p.prompt == "p" for p in pairs)
    assert len(pairs_of_prompt("p", completions, scores, 1, random.Random(0))) == 1


def test_no_pairs_when_all_right_or_all_wrong():
    assert pairs_of_prompt("p", ["a", "b"], [1.0, 1.0], 4, random.Random(0)) == []
    assert pairs_of_prompt("p", ["a", "b"], [0.0, 0.0], 4, random.Random(0)) == []


# --- a tiny run end to end ---------------------------------------------------------------------

SHAPE = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def _toy_task() -> TaskSpec:
    """Prompts `k:`; a completion is 'correct' when its length is even (about half of a
    fresh model's samples), so a random model's samples give pairs."""
    rows = [{"prompt": f"{k}:", "answer": ""} for k in range(4)]

    def train_rows(seed: int):
        k = 0
        while True:
            yield {"prompt": f"{k % 50 + 10}:", "answer": ""}
            k += 1

    return TaskSpec(
        name="toy",
        held_out_rows=lambda: rows,
        train_rows=train_rows,
        corpus=lambda seed, flaw: iter(()),
        reward_fn=lambda prompts, completions, **kw: [float(len(c) % 2 == 0) for c in completions],
        score=lambda completion, row: float(len(completion) % 2 == 0),
        max_new_tokens=6,
        describe="toy",
    )


@pytest.fixture
def tiny_model_dir(tmp_path):
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(SHAPE, tokenizer, seed=0)
    return save_model(model, tokenizer, tmp_path / "init")


def test_a_three_step_run_writes_its_directory_and_the_loss_goes_down(tmp_path, tiny_model_dir):
    config = DPOConfig(
        steps=3,
        pairs_per_step=8,
        micro_batch_pairs=4,
        prompts_per_round=8,
        lr=3e-3,
        beta=0.5,
        eval_every=0,
        place=DPOPlace(device="cpu", progress=False),
    )
    run = RunDirectory(tmp_path, "run")
    model_dir = dpo_run(
        config, _toy_task(), tiny_model_dir, run, resolve_precision("cpu", "float32")
    )
    assert (model_dir / "config.json").exists()
    for name in ("config.yaml", "metrics.jsonl", "pools.jsonl", "summary.json"):
        assert (run.path / name).exists(), name
    records = read_jsonl(run.path / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert {"eval/greedy_acc", "eval/sampled_acc"} <= records[0].keys() & records[-1].keys()
    # step 1: the policy is the reference, h = 0 for every pair, so the loss is log 2 exactly
    assert records[1]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert records[3]["loss"] < records[1]["loss"]
    assert records[3]["rewards/margin"] > 0
    summary = json.loads((run.path / "summary.json").read_text())
    assert summary["completions_generated"] == 8 * 8 == records[-1]["completions"]
    low, high = summary["eval_after"]["ci95"]["greedy_acc"]
    assert low <= summary["eval_after"]["greedy_acc"] <= high


def test_iterated_dpo_samples_a_new_pool_every_k_steps(tmp_path, tiny_model_dir):
    config = DPOConfig(
        steps=3,
        pairs_per_step=4,
        prompts_per_round=4,
        iterate_every=2,
        eval_every=0,
        place=DPOPlace(device="cpu", progress=False),
    )
    run = RunDirectory(tmp_path, "run")
    dpo_run(config, _toy_task(), tiny_model_dir, run, resolve_precision("cpu", "float32"))
    pools = read_jsonl(run.path / "pools.jsonl")
    assert [p["step"] for p in pools] == [0, 2]  # before steps 1 and 3
    assert dpo_completions(config) == 2 * 4 * 8 == sum(p["completions"] for p in pools)


def test_a_model_whose_samples_give_no_pairs_is_refused_naming_the_flag(tmp_path, tiny_model_dir):
    task = _toy_task()
    never = TaskSpec(**{**task.__dict__, "score": lambda completion, row: 0.0})
    run = RunDirectory(tmp_path, "run")
    config = DPOConfig(steps=1, prompts_per_round=2, place=DPOPlace(progress=False), eval_every=0)
    with pytest.raises(ConfigError, match="--samples-per-prompt"):
        dpo_run(config, never, tiny_model_dir, run, resolve_precision("cpu", "float32"))


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"beta": 0.0}, "--beta"),
        ({"loss_type": "hinge"}, "--loss-type"),
        ({"loss_type": "ipo", "label_smoothing": 0.1}, "--label-smoothing"),
        ({"samples_per_prompt": 1}, "--samples-per-prompt"),
        ({"iterate_every": -1}, "--iterate-every"),
    ],
)
def test_bad_settings_are_one_line_errors_naming_the_flag(changes, flag):
    with pytest.raises(ConfigError, match=flag):
        check_dpo_config(DPOConfig(**changes))


def test_run_dpo_refuses_a_model_that_is_not_a_directory(tmp_path):
    with pytest.raises(ConfigError, match="--model"):
        run_dpo(DPOConfig(model=str(tmp_path / "nope"), run_dir=str(tmp_path / "r")))


@pytest.mark.parametrize(
    ("task", "base"),
    [
        ("arithmetic", BaseConfig(steps=2, batch_size=2)),
        ("reasoning", BaseConfig(steps=2, batch_size=2, hedge_prob=0.2, seed=3)),
    ],
)
def test_model_lab_is_the_labs_cached_base(tmp_path, monkeypatch, task, base):
    # `--model lab` trains (or finds) the base `rlvr lab` would: the same cache key and directory
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    config = DPOConfig(task=task, tiny=SHAPE, base=base, place=DPOPlace(progress=False))
    directory = _model_dir(config, user_task(config.task))
    lab = LabConfig(task=TaskChoice(task), tiny=SHAPE, base=base, place=RunPlace(progress=False))
    assert directory == lab_base_dir(lab)
    assert (directory / "config.json").exists()
    assert build_base_model(lab, lab_task(lab)) == (directory, True)  # the lab finds it cached


# --- stage kinds -------------------------------------------------------------------------------


def test_the_dpo_stage_kinds_parse_and_refuse_what_the_stage_sets():
    data = {
        "stages": [
            {"name": "base", "kind": "base", "steps": 10},
            {"name": "d", "kind": "dpo", "model": "base", "dpo": {"steps": 5, "iterate_every": 2}},
            {"name": "e", "kind": "error_kinds", "models": ["base", "d"]},
        ]
    }
    pipeline = parse_pipeline(data, "p", "p.yaml")
    settings = pipeline.stages[1].settings
    assert isinstance(settings, DPOStage) and settings.dpo.iterate_every == 2
    assert pipeline.stages[2].settings.models == ("base", "d")
    bad = {"stages": [{"name": "d", "kind": "dpo", "dpo": {"run_dir": "x"}}]}
    with pytest.raises(ConfigError, match="run_dir"):
        parse_pipeline(bad, "p", "p.yaml")
    bad = {"stages": [{"name": "d", "kind": "dpo", "dpo": {"beta": -1.0}}]}
    with pytest.raises(ConfigError, match="--beta"):
        parse_pipeline(bad, "p", "p.yaml")
    assert "dpo" in stages.STAGE_KINDS


def test_the_builtin_pipeline_matches_completions_across_its_branches():
    pipeline = load_pipeline("dpo-vs-grpo")
    by_name = {s.name: s.settings for s in pipeline.stages}
    grpo = by_name["grpo"].grpo
    per_grpo = grpo.steps * grpo.prompts_per_step * grpo.group_size
    assert dpo_completions(by_name["dpo"].dpo) == per_grpo
    assert dpo_completions(by_name["dpo-iterated"].dpo) == per_grpo
    assert {by_name[n].model for n in ("dpo", "dpo-iterated", "grpo")} == {"base"}


def test_rlvr_dpo_refuses_a_bad_flag_in_one_line(capsys):
    from tests.test_cli import cli_error

    message = cli_error(["dpo", "--loss-type", "nope", "--model", "/nonexistent"], capsys)
    assert message.startswith("--loss-type must be one of")
