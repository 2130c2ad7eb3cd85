"""End-to-end smoke of the lab and the CLI on a deliberately tiny configuration."""

import dataclasses
import json

import pytest

from rlvr.cli import main
from rlvr.config import RunPlace
from rlvr.models.tiny import TinyModelConfig
from rlvr.pipelines.base_model import BaseConfig
from rlvr.pipelines.lab import LabConfig, build_base_model, lab_base_dir, lab_task
from rlvr.report.run_dir import read_jsonl
from rlvr.tasks.arithmetic import ArithmeticTaskConfig
from rlvr.tasks.registry import TaskChoice
from tests.helpers import SMALL_TRAIN_FLAGS, TINY_MODEL_FLAGS
from tests.test_cli import cli_error

TINY = [
    "--arithmetic.digits",
    "2",
    "--arithmetic.held-out-size",
    "16",
    *TINY_MODEL_FLAGS,
    "--base.steps",
    "4",
    "--base.batch-size",
    "8",
    "--grpo.steps",
    "3",
    "--grpo.prompts-per-step",
    "2",
    "--grpo.group-size",
    "4",
    "--grpo.eval-every",
    "4",
    "--grpo.max-new-tokens",
    "30",
    "--eval-samples",
    "1",
    "--no-progress",
]


def test_lab_writes_a_complete_run_directory(tmp_path, capsys):
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    args = ["lab", "--runs-dir", str(runs), "--cache-dir", str(cache), "--run-name", "smoke"]
    main(args + TINY)
    run = runs / "smoke"
    for name in (
        "config.yaml",
        "metrics.jsonl",
        "samples.jsonl",
        "reward_curve.png",
        "summary.json",
        "model/config.json",
    ):
        assert (run / name).exists(), name

    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    # evaluated before the start, at powers of two below eval_every, at multiples, at the end
    assert [m["step"] for m in metrics if "eval/greedy_acc" in m] == [0, 1, 2, 3]
    for key in (
        "reward/mean",
        "reward/std",
        "frac_zero_std_groups",
        "completion/len_mean",
        "policy/clip_frac",
        "policy/approx_kl",
        "time/generate_s",
        "time/verify_s",
        "time/update_s",
    ):
        assert key in metrics[1], key
    samples = read_jsonl(run / "samples.jsonl")
    assert len(samples) == 3 * 4 and {"prompt", "completion", "reward"} <= set(samples[0])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3
    assert 0 <= summary["final_greedy_acc"] <= 1

    # an existing run directory is never overwritten silently
    assert "--overwrite" in cli_error(args + TINY, capsys)

    # the trained model evaluates from its directory
    capsys.readouterr()
    main(
        [
            "eval",
            "--model",
            str(run / "model"),
            "--arithmetic.digits",
            "2",
            "--arithmetic.held-out-size",
            "16",
            "--max-new-tokens",
            "30",
        ]
    )
    result = json.loads(capsys.readouterr().out)
    assert result["problems"] == 16 and 0 <= result["accuracy"] <= 1
    low, high = result["ci95"]["accuracy"]
    assert low <= result["accuracy"] <= high  # one greedy sample: the Wilson interval

    # sampled: mean@4 and the unbiased pass@1 <= pass@2 <= pass@4, each with an interval
    evaluate = ["eval", "--model", str(run / "model"), "--arithmetic.digits", "2"]
    evaluate += ["--arithmetic.held-out-size", "16", "--max-new-tokens", "30"]
    main([*evaluate, "--temperature", "1.0", "--num-samples", "4"])
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["samples_per_problem"] == 4
    assert result["pass@1"] == pytest.approx(result["mean@4"])  # 0/1 scores
    assert result["pass@1"] <= result["pass@2"] <= result["pass@4"]
    for name in ("mean@4", "pass@1", "pass@2", "pass@4"):
        assert result["ci95"][name][0] <= result[name] <= result["ci95"][name][1]
    assert "pass@4" in captured.err and "95% intervals" in captured.err
    assert "--temperature" in cli_error([*evaluate, "--num-samples", "4"], capsys)


def test_base_model_is_cached_by_config_hash(tmp_path):
    config = LabConfig(
        cache_dir=str(tmp_path),
        place=RunPlace(progress=False),
        task=TaskChoice(arithmetic=ArithmeticTaskConfig(digits=1, held_out_size=5)),
        tiny=TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32),
        base=BaseConfig(steps=2, batch_size=4),
    )
    task = lab_task(config)
    first, cached_first = build_base_model(config, task)
    second, cached_second = build_base_model(config, task)
    assert (first, cached_first, cached_second) == (second, False, True)
    other_config = dataclasses.replace(config, base=BaseConfig(steps=3, batch_size=4))
    other, cached_other = build_base_model(other_config, task)
    assert other != first and not cached_other
    # the weak-verifier demo's base hedges, so it is a different base
    weak = dataclasses.replace(config, verifier="weak")
    assert lab_base_dir(weak) != lab_base_dir(config)
    assert lab_base_dir(config) == first


def test_verify_command_explains_its_grade(capsys):
    main(["verify", "--completion", "7+8+0=15 #### 15", "--answer", "15"])
    assert json.loads(capsys.readouterr().out)["reward"] == 1.0
    main(["verify", "--completion", "<think>#### 15</think>", "--answer", "15"])
    assert json.loads(capsys.readouterr().out)["reward"] == 0.0
    # --explain names the rule that decided; --prompt refuses an echo of the question
    main(["verify", "--completion", "The answer is 2^6.", "--answer", "64", "--explain"])
    first, *why = capsys.readouterr().out.splitlines()
    assert json.loads(first)["reward"] == 1.0 and why[-1] == "reward 1 (correct)"
    assert any("phrase" in line for line in why)
    echo = ["verify", "--completion", "#### 7+8", "--answer", "15", "--prompt", "7+8="]
    main(echo)
    assert json.loads(capsys.readouterr().out)["reward"] == 0.0


def test_unknown_command_and_too_small_budget_are_refused(tmp_path, capsys):
    assert "unknown command 'trian'" in cli_error(["trian"], capsys)
    args = ["lab", "--runs-dir", str(tmp_path), "--grpo.max-new-tokens", "10", "--no-progress"]
    assert "max_new_tokens=10 is below" in cli_error(args, capsys)


def test_eval_schedule_is_dense_early():
    from rlvr.train.grpo import is_eval_step

    assert [s for s in range(1, 101) if is_eval_step(s, 20, 100)] == [
        1,
        2,
        4,
        8,
        16,
        20,
        40,
        60,
        80,
        100,
    ]
    assert [s for s in range(1, 8) if is_eval_step(s, 3, 7)] == [1, 2, 3, 6, 7]
    assert [s for s in range(1, 8) if is_eval_step(s, 0, 7)] == [7]  # 0: the end only


@pytest.mark.parametrize("task", ["code", "tool"])
def test_code_and_tool_tasks_train_end_to_end(task, tmp_path):
    small = SMALL_TRAIN_FLAGS
    main(
        [
            "train",
            "--task",
            task,
            "--runs-dir",
            str(tmp_path),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--run-name",
            task,
            *small,
        ]
    )
    metrics = read_jsonl(tmp_path / task / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert 0 <= metrics[1][f"reward/{task}_task_reward"] <= 1
    summary = json.loads((tmp_path / task / "summary.json").read_text())
    assert summary["held_out_problems"] > 0


def test_a_base_that_never_writes_a_readable_answer_is_warned_about(tmp_path, capsys):
    untrained = list(TINY)
    untrained[untrained.index("--base.steps") + 1] = "1"  # one step: no '####' answer yet
    runs, cache = ["--runs-dir", str(tmp_path)], ["--cache-dir", str(tmp_path / "cache")]
    main(["lab", *runs, *cache, "--run-name", "untrained", *untrained])
    err = capsys.readouterr().err
    assert "wrote no answer the verifier can read in any of its 16" in err
