"""`rlvr sft` survives: kill -9 after a checkpoint and `--resume` to the uninterrupted run's
weights and metrics, bit for bit; a run killed before its first checkpoint restarts cleanly;
SIGTERM checkpoints and says how to resume; other settings on a resume are refused; NaN
updates are skipped and counted, then stop the run."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import rlvr.train.sft as sft
from rlvr.cli import main
from rlvr.report.run_dir import read_jsonl
from rlvr.train.checkpoint import latest_checkpoint
from tests.helpers import TINY_MODEL_FLAGS
from tests.test_cli import cli_error
from tests.test_resume import start_subprocess

STEPS = 300


def _pairs(path: Path) -> Path:
    rng = random.Random(0)
    with path.open("w") as f:
        for _ in range(40):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "completion": str(a + b)}) + "\n")
    return path


def _args(tmp_path: Path, name: str, every: int = 10) -> list[str]:
    data = tmp_path / "pairs.jsonl"
    if not data.exists():
        _pairs(data)
    return [
        "sft",
        "--data",
        str(data),
        "--eval-data",
        str(data),
        "--eval-every",
        "50",
        "--run-dir",
        str(tmp_path / name),
        "--steps",
        str(STEPS),
        "--batch-size",
        "4",
        "--checkpoint-every",
        str(every),
        *TINY_MODEL_FLAGS,
        "--no-progress",
    ]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "model" / "model.safetensors")


def _same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """The uninterrupted run."""
    root = tmp_path_factory.mktemp("sft")
    main(_args(root, "whole"))
    records = read_jsonl(root / "whole" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(STEPS + 1))
    assert records[-1]["eval/loss"] < records[0]["eval/loss"]  # it learns: the weights move
    return root / "whole"


def _wait_for_checkpoint(run: Path, process: subprocess.Popen) -> None:
    deadline = time.time() + 120
    while time.time() < deadline:
        if latest_checkpoint(run / "checkpoints") is not None:
            return
        if process.poll() is not None:
            raise AssertionError(f"run ended early: {process.stderr.read()}")
        time.sleep(0.02)
    raise AssertionError("no checkpoint in time")


def test_kill_9_after_a_checkpoint_and_resume_gives_the_uninterrupted_run(whole, capsys):
    root = whole.parent
    run = root / "killed"
    process = start_subprocess(_args(root, "killed"))
    _wait_for_checkpoint(run, process)
    time.sleep(0.3)  # a few steps past the checkpoint: those rows must be cut and redone
    process.send_signal(signal.SIGKILL)
    process.wait()
    written = read_jsonl(run / "metrics.jsonl")
    last = latest_checkpoint(run / "checkpoints")
    assert last is not None and len(written) < STEPS + 1, "killed too late to test"
    assert not (run / "model").exists()

    capsys.readouterr()
    main(["sft", "--resume", str(run), "--no-progress"])
    assert f"resumed from {last} (step {int(last.name[5:])})" in capsys.readouterr().err
    assert read_jsonl(run / "metrics.jsonl") == read_jsonl(whole / "metrics.jsonl")
    assert _same_weights(_weights(run), _weights(whole))


def test_a_run_killed_before_its_first_checkpoint_restarts_cleanly(whole):
    run = whole.parent / "no-checkpoint"
    shutil.copytree(whole, run, ignore=shutil.ignore_patterns("checkpoints", "model"))
    with (run / "metrics.jsonl").open("a") as f:  # a dead run's rows beyond its last step
        f.write(json.dumps({"step": 7, "loss": 0.0}) + "\n")
    main(["sft", "--resume", str(run), "--no-progress"])
    assert read_jsonl(run / "metrics.jsonl") == read_jsonl(whole / "metrics.jsonl")
    assert _same_weights(_weights(run), _weights(whole))


def test_resume_refuses_other_settings_and_a_run_without_config(whole, capsys):
    message = cli_error(["sft", "--resume", str(whole), "--lr", "0.5"], capsys)
    assert message.endswith("so they are refused: lr"), message
    message = cli_error(["sft", "--resume", str(whole), "--overwrite"], capsys)
    assert "drop --overwrite" in message
    never = whole.parent / "never-started"
    assert cli_error(["sft", "--resume", str(never)], capsys).endswith("nothing to resume")
    before = read_jsonl(whole / "metrics.jsonl")
    main(["sft", "--resume", str(whole), "--no-progress"])  # finished: nothing to redo
    assert read_jsonl(whole / "metrics.jsonl") == before


def test_sigterm_finishes_the_step_checkpoints_and_says_how_to_resume(tmp_path):
    args = _args(tmp_path, "term", every=0)  # only the stop (and the end) checkpoint
    args[args.index("--steps") + 1] = "100000"
    process = start_subprocess(args)
    run = tmp_path / "term"
    deadline = time.time() + 120
    while len(read_jsonl(run / "metrics.jsonl")) < 5 and time.time() < deadline:
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert f"Resume with: rlvr sft --resume {run}" in stderr
    steps_done = read_jsonl(run / "metrics.jsonl")[-1]["step"]
    assert latest_checkpoint(run / "checkpoints") == run / "checkpoints" / f"step-{steps_done:06d}"


def test_nonfinite_updates_are_skipped_counted_then_stop_the_run(tmp_path, monkeypatch):
    real = sft.completion_loss

    def nan_loss(*args, **kwargs):
        loss, n = real(*args, **kwargs)
        return loss * float("nan"), n

    monkeypatch.setattr(sft, "completion_loss", nan_loss)
    args = _args(tmp_path, "nan")
    at = args.index("--eval-data")  # no held-out loss: the patched loss would be NaN there too
    del args[at : at + 2]
    with pytest.raises(FloatingPointError, match="3 updates in a row had a NaN/Inf"):
        main(args)
    records = read_jsonl(tmp_path / "nan" / "metrics.jsonl")
    assert [r["update/nonfinite"] for r in records] == [1.0, 1.0]
    assert all(r["lr"] == records[0]["lr"] for r in records)  # the schedule did not advance
