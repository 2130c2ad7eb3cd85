"""`rlvr dpo` survives: iterated DPO killed with SIGKILL inside a round and at or after a round's
end, then `--resume`d, ends with the uninterrupted run's weights, metrics rows and pools, bit
for bit (the round's pool comes back from the checkpoint; the next round samples the same
prompts from the same weights); other settings on a resume are refused."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.cli import main
from rlvr.report.run_dir import read_jsonl
from rlvr.train.checkpoint import latest_checkpoint_step
from tests.helpers import TINY_MODEL_FLAGS
from tests.test_cli import cli_error
from tests.test_resume import stable, start_subprocess

STEPS, EVERY, ROUND = 30, 5, 10
BASE = ["--arithmetic.digits", "1", "--arithmetic.held-out-size", "16"]
BASE += ["--base.steps", "600", "--base.batch-size", "32"]
"""A lab base of one-digit sums that is right about half the time (about 25 s to train, once:
the cache is shared), so that its samples give pairs."""


def _args(root: Path, name: str) -> list[str]:
    return [
        "dpo",
        "--model",
        "lab",
        "--run-dir",
        str(root / name),
        *TINY_MODEL_FLAGS,
        *BASE,
        "--steps",
        str(STEPS),
        "--pairs-per-step",
        "4",
        "--micro-batch-pairs",
        "3",
        "--prompts-per-round",
        "16",
        "--samples-per-prompt",
        "8",
        "--iterate-every",
        str(ROUND),
        "--checkpoint-every",
        str(EVERY),
        "--eval-every",
        "15",
        "--lr",
        "1e-3",
        "--no-progress",
    ]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "model" / "model.safetensors")


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The uninterrupted run (it trains the cached base the others reuse)."""
    root = tmp_path_factory.mktemp("dpo")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RLVR_CACHE", str(root / "cache"))
        main(_args(root, "whole"))
        run = root / "whole"
        pools = read_jsonl(run / "pools.jsonl")
        assert [p["step"] for p in pools] == [0, 10, 20]
        assert all(p["pairs"] > 0 for p in pools)
        yield run


def _kill_after_checkpoint(run: Path, step: int, process: subprocess.Popen) -> int:
    """SIGKILL `process` once a checkpoint of `step` or later exists; returns the newest."""
    deadline = time.time() + 180
    while time.time() < deadline:
        newest = latest_checkpoint_step(run / "checkpoints")
        if newest is not None and newest >= step:
            process.send_signal(signal.SIGKILL)
            process.wait()
            return latest_checkpoint_step(run / "checkpoints")
        if process.poll() is not None:
            raise AssertionError(f"run ended early: {process.stderr.read()}")
        time.sleep(0.01)
    raise AssertionError("no checkpoint in time")


@pytest.mark.parametrize("kill_after", [EVERY, 2 * EVERY])
def test_kill_9_and_resume_gives_the_uninterrupted_run(whole, kill_after, capsys):
    root = whole.parent
    run = root / f"killed-{kill_after}"
    process = start_subprocess(_args(root, run.name))
    newest = _kill_after_checkpoint(run, kill_after, process)
    assert newest < STEPS and not (run / "model").exists(), "killed too late to test"

    capsys.readouterr()
    main(["dpo", "--resume", str(run), "--no-progress"])
    assert f"step-{newest:06d} (step {newest})" in capsys.readouterr().err  # not from scratch
    assert stable(read_jsonl(run / "metrics.jsonl")) == stable(read_jsonl(whole / "metrics.jsonl"))
    assert read_jsonl(run / "pools.jsonl") == read_jsonl(whole / "pools.jsonl")
    weights, expected = _weights(run), _weights(whole)
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[k], expected[k]) for k in weights)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completions_generated"] == 3 * 16 * 8 == summary["rounds"] * 128


def test_resume_refuses_other_settings(whole, capsys):
    message = cli_error(["dpo", "--resume", str(whole), "--beta", "0.5"], capsys)
    assert message.endswith("so they are refused: beta"), message
    never = whole.parent / "never-started"
    assert cli_error(["dpo", "--resume", str(never)], capsys).endswith("nothing to resume")
