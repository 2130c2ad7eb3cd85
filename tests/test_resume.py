"""Runs that survive: kill -9 at random steps and resume to the same result; graceful stop;
NaN updates skipped and counted; resuming with other settings is refused."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.cli import main
from rlvr.config import RunPlace, UserError
from rlvr.pipelines.lab import LabConfig, run_lab
from rlvr.report.run_dir import RunDirectory, read_jsonl
from rlvr.train.checkpoint import latest_checkpoint
from tests.test_cli import cli_error
from tests.test_lab import TINY

STEPS = 12
ARGS = [*TINY, "--grpo.steps", str(STEPS), "--grpo.checkpoint-every", "1"]
VOLATILE = ("time/", "throughput/")  # wall-clock measurements differ between runs
LEARNS = ["--arithmetic.digits", "1", "--base.steps", "300", "--base.batch-size", "16"]
LEARNS += ["--verifier", "weak"]
"""Flags after `ARGS` for a run whose rewards vary within groups, so that every step updates
the weights (the 4-step base of `TINY` writes no answer: rewards 0, nothing learnt): a
300-step base of one-digit sums and the weak (substring) verifier. About 10 s of base."""


def lab_args(tmp_path: Path, name: str) -> list[str]:
    return [
        "lab",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--run-name",
        name,
        *ARGS,
    ]


def stable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in records]


def start_subprocess(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "rlvr.cli", *args]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def wait_for_steps(metrics: Path, steps: int, process: subprocess.Popen) -> None:
    deadline = time.time() + 120
    while time.time() < deadline:
        if metrics.exists() and len(read_jsonl(metrics)) >= steps + 1:
            return
        if process.poll() is not None:
            raise AssertionError(f"run ended early: {process.stderr.read()}")
        time.sleep(0.05)
    raise AssertionError("the run did not reach the kill point in time")


def test_kill_and_resume_gives_the_uninterrupted_result(tmp_path):
    main(lab_args(tmp_path, "whole"))
    whole = tmp_path / "runs" / "whole"
    expected = stable(read_jsonl(whole / "metrics.jsonl"))
    expected_weights = load_file(whole / "model" / "model.safetensors")

    for kill_at in sorted(random.Random(0).sample(range(1, STEPS - 3), 3)):
        name = f"killed-{kill_at}"
        process = start_subprocess(lab_args(tmp_path, name))
        run = tmp_path / "runs" / name
        wait_for_steps(run / "metrics.jsonl", kill_at, process)
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert len(read_jsonl(run / "metrics.jsonl")) < STEPS + 1, "killed too late to test"

        main(["lab", "--resume", str(run), "--no-progress"])
        assert stable(read_jsonl(run / "metrics.jsonl")) == expected
        weights = load_file(run / "model" / "model.safetensors")
        assert all(torch.equal(weights[k], expected_weights[k]) for k in expected_weights)
        samples = read_jsonl(run / "samples.jsonl")
        assert [s["step"] for s in samples] == sorted(s["step"] for s in samples)
        assert len(samples) == len(read_jsonl(whole / "samples.jsonl"))


def test_sigterm_finishes_the_step_and_checkpoints(tmp_path):
    args = lab_args(tmp_path, "term")
    args[args.index("--grpo.checkpoint-every") + 1] = "0"  # only the stop itself checkpoints
    process = start_subprocess(args)
    run = tmp_path / "runs" / "term"
    wait_for_steps(run / "metrics.jsonl", 2, process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert f"Resume with: rlvr train --resume {run}" in stderr
    steps_done = len(read_jsonl(run / "metrics.jsonl")) - 1
    assert (run / "checkpoints" / f"step-{steps_done:06d}" / "COMPLETE").exists()


def test_resume_takes_the_saved_config_and_refuses_other_flags(tmp_path, capsys):
    main(lab_args(tmp_path, "a"))
    run = tmp_path / "runs" / "a"
    message = cli_error(["train", "--resume", str(run), "--grpo.lr", "0.5"], capsys)
    assert message.endswith("so they are refused: grpo.lr")
    never = tmp_path / "runs" / "never-started"
    assert cli_error(["train", "--resume", str(never)], capsys).endswith("nothing to resume")
    before = read_jsonl(run / "metrics.jsonl")
    main(["train", "--resume", str(run), "--no-progress"])  # finished run: nothing to redo
    assert stable(read_jsonl(run / "metrics.jsonl")) == stable(before)
    # the saved config is what a resume uses, also from the library with none of the flags
    run_lab(LabConfig(resume=str(run), place=RunPlace(progress=False)))
    assert stable(read_jsonl(run / "metrics.jsonl")) == stable(before)
    with pytest.raises(UserError, match="refused: seed"):
        run_lab(LabConfig(resume=str(run), place=RunPlace(seed=5)))
    # a run directory another live process writes (here: this one, through another handle) is
    # refused before anything is written, and free again once that process lets it go
    holder = RunDirectory(run.parent, run.name, resume=True, claim=True)
    message = cli_error(["train", "--resume", str(run), "--no-progress"], capsys)
    assert f"{run} is in use by a live process (pid {os.getpid()}); let it finish" in message
    assert stable(read_jsonl(run / "metrics.jsonl")) == stable(before)
    holder.close()
    main(["train", "--resume", str(run), "--no-progress"])


def test_nonfinite_updates_are_skipped_then_stop_the_run(tmp_path, monkeypatch):
    import rlvr.train.grpo as grpo

    real = grpo.algo.policy_loss

    def nan_loss(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(grpo.algo, "policy_loss", nan_loss)
    # every row carries a gradient (the tiny run's groups could all be zero-variance, and
    # those rows never reach the loss)
    monkeypatch.setitem(grpo.algo.ADVANTAGE_ESTIMATORS, "grpo", lambda r, g, **_: r * 0 + 1)
    with pytest.raises(FloatingPointError, match="3 updates in a row had a NaN/Inf"):
        main(lab_args(tmp_path, "nan"))
    records = read_jsonl(tmp_path / "runs" / "nan" / "metrics.jsonl")
    assert [r.get("update/nonfinite") for r in records[1:]] == [1.0, 1.0]


def test_bad_inputs_are_refused_before_any_compute(tmp_path, capsys):
    runs = ["--runs-dir", str(tmp_path / "runs")]
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "  ", "answer": "3"}\n')
    assert "rows.jsonl:2: field 'prompt'" in cli_error(
        ["train", "--task", str(data), *runs], capsys
    )
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n')
    assert "rows.jsonl:2: missing field 'answer'" in cli_error(
        ["train", "--task", str(data), *runs], capsys
    )
    assert "unknown task" in cli_error(["train", "--task", "poetry", *runs], capsys)
    message = cli_error(["train", "--set", "betaa=0.1", *runs], capsys)
    assert "did you mean 'beta'" in message
    message = cli_error(["train", "--grpo.group-size", "1", *runs], capsys)
    assert "group_size must be >= 2" in message
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o500)
    if os.access(read_only, os.W_OK):  # root ignores permission bits: simulate with a file
        read_only.chmod(0o700)
        read_only = tmp_path / "a-file"
        read_only.write_text("")
    with pytest.raises(UserError):  # the library's error: PermissionError or NotADirectoryError
        run_lab(LabConfig(runs_dir=str(read_only), place=RunPlace(progress=False)))
    assert cli_error(["train", "--runs-dir", str(read_only), "--no-progress"], capsys)


def test_a_kill_before_and_after_the_first_checkpoint_resumes_to_the_same_logs(tmp_path):
    """`rlvr train dapo`, a checkpoint every 3 of 6 steps, SIGKILL after step 1 (no checkpoint
    yet: the resume restarts from nothing) and after step 4 (from step 3): every metrics row
    and sample and the final weights equal the uninterrupted run's (issue 23, finding 6)."""

    def args(name: str) -> list[str]:
        flags = [*lab_args(tmp_path, name)[1:], *LEARNS, "--grpo.steps", "6"]
        return ["train", "dapo", *flags, "--grpo.checkpoint-every", "3"]

    main([*args("whole"), "--no-progress"])
    whole = tmp_path / "runs" / "whole"
    expected = stable(read_jsonl(whole / "metrics.jsonl"))
    assert [r["step"] for r in expected] == list(range(7))
    assert sum(r.get("grad_norm", 0) > 0 for r in expected) >= 3  # the weights move
    expected_samples = read_jsonl(whole / "samples.jsonl")
    expected_weights = load_file(whole / "model" / "model.safetensors")
    for kill_after, checkpoint in ((1, None), (4, "step-000003")):
        name = f"killed-{kill_after}"
        process = start_subprocess(args(name))
        run = tmp_path / "runs" / name
        wait_for_steps(run / "metrics.jsonl", kill_after, process)
        process.send_signal(signal.SIGKILL)
        process.wait()
        last = latest_checkpoint(run / "checkpoints")
        assert (last.name if last else None) == checkpoint, "killed too late to test"
        assert len(read_jsonl(run / "metrics.jsonl")) > 1  # the dead run's rows are there

        main(["lab", "--resume", str(run), "--no-progress"])
        assert stable(read_jsonl(run / "metrics.jsonl")) == expected, name
        assert read_jsonl(run / "samples.jsonl") == expected_samples, name
        weights = load_file(run / "model" / "model.safetensors")
        assert all(torch.equal(weights[k], expected_weights[k]) for k in expected_weights)
