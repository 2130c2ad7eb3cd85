"""`rlvr sft` and `rlvr dpo` under `torchrun --nproc-per-node 2`: each rank trains its share of
every batch on an FSDP2-sharded policy with the whole batch's divisor, so the two ranks' final
weights equal one process's within fp32 rounding (measured: at most 1.4e-6 apart, weights of
size up to 1.5; the bound is 2e-5), and their losses too. A 2-rank SFT run stopped with SIGKILL
resumes under torchrun to the uninterrupted 2-rank run, bit for bit.

Two gloo ranks on 127.0.0.1, the tiny model; marked `dist` (about a minute each on two CPU
cores): `pytest -m dist tests/test_distributed_trainers.py`.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.cli import main
from rlvr.report.run_dir import read_jsonl
from rlvr.train.checkpoint import latest_checkpoint_step
from tests.helpers import TINY_MODEL_FLAGS
from tests.test_distributed_resume import _finish, _launch
from tests.test_dpo_resume import BASE

pytestmark = pytest.mark.dist

WEIGHTS_ATOL = 2e-5
"""Two ranks against one process: the sums of the loss and gradients run in another order."""
LOSS_RTOL = 1e-5


def _pairs(path: Path) -> Path:
    rng = random.Random(0)
    with path.open("w") as f:
        for _ in range(40):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "completion": str(a + b)}) + "\n")
    return path


def _close(one: Path, two: Path) -> None:
    """The runs' final weights within WEIGHTS_ATOL and their losses within LOSS_RTOL."""
    a, b = (load_file(run / "model" / "model.safetensors") for run in (one, two))
    assert a.keys() == b.keys()
    gap = max((a[k] - b[k]).abs().max().item() for k in a)
    assert gap <= WEIGHTS_ATOL, gap
    first, second = read_jsonl(one / "metrics.jsonl"), read_jsonl(two / "metrics.jsonl")
    assert [r["step"] for r in first] == [r["step"] for r in second]
    for r, s in zip(first, second, strict=True):
        if "loss" in r:
            assert s["loss"] == pytest.approx(r["loss"], rel=LOSS_RTOL), r["step"]


def _sft(root: Path, name: str, steps: int = 20) -> list[str]:
    data = root / "pairs.jsonl"
    if not data.exists():
        _pairs(data)
    return [
        "sft",
        "--data",
        str(data),
        "--eval-data",
        str(data),
        "--eval-every",
        "10",
        "--run-dir",
        str(root / name),
        "--steps",
        str(steps),
        "--batch-size",
        "5",  # odd: the ranks get 3 and 2 rows, and still divide by the batch's tokens
        "--checkpoint-every",
        "10",
        *TINY_MODEL_FLAGS,
        "--no-progress",
    ]


def test_sft_on_two_ranks_equals_one_process(tmp_path):
    main(_sft(tmp_path, "one"))
    log = tmp_path / "two.log"
    _finish(_launch(_sft(tmp_path, "two"), log), tmp_path / "two", log)
    _close(tmp_path / "one", tmp_path / "two")
    assert (tmp_path / "two" / "checkpoints" / "step-000020" / "rng-1.pt").exists()  # sharded


def test_sft_killed_on_two_ranks_resumes_to_the_uninterrupted_two_rank_run(tmp_path):
    steps = 400
    log = tmp_path / "whole.log"
    _finish(_launch(_sft(tmp_path, "whole", steps), log), tmp_path / "whole", log)
    run, log = tmp_path / "killed", tmp_path / "killed.log"
    process = _launch(_sft(tmp_path, "killed", steps), log)
    deadline = time.time() + 180
    while (latest_checkpoint_step(run / "checkpoints") or 0) < 10 and time.time() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert latest_checkpoint_step(run / "checkpoints") < steps, "killed too late to test"
    resume_log = tmp_path / "resume.log"
    _finish(_launch(["sft", "--resume", str(run), "--no-progress"], resume_log), run, resume_log)
    assert read_jsonl(run / "metrics.jsonl") == read_jsonl(tmp_path / "whole" / "metrics.jsonl")
    a = load_file(run / "model" / "model.safetensors")
    b = load_file(tmp_path / "whole" / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _dpo(root: Path, name: str) -> list[str]:
    return [
        "dpo",
        "--model",
        "lab",
        "--run-dir",
        str(root / name),
        *TINY_MODEL_FLAGS,
        *BASE,
        "--steps",
        "12",
        "--pairs-per-step",
        "5",  # the ranks get 3 and 2 pairs: rank 1 runs a zero-weight second pass
        "--micro-batch-pairs",
        "2",
        "--prompts-per-round",
        "16",
        "--samples-per-prompt",
        "8",
        "--iterate-every",
        "6",
        "--checkpoint-every",
        "6",
        "--eval-every",
        "0",
        "--lr",
        "1e-3",
        "--no-progress",
    ]


def test_dpo_on_two_ranks_equals_one_process(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    main(_dpo(tmp_path, "one"))  # trains the cached base the ranks then find
    log = tmp_path / "two.log"
    _finish(_launch(_dpo(tmp_path, "two"), log), tmp_path / "two", log)
    _close(tmp_path / "one", tmp_path / "two")
    pools = [read_jsonl(tmp_path / run / "pools.jsonl") for run in ("one", "two")]
    assert [p["step"] for p in pools[0]] == [p["step"] for p in pools[1]] == [0, 6]
    assert pools[0][0] == pools[1][0]  # the first from the same weights: the same pairs
