"""`torchrun --nproc-per-node 2 -m rlvr train ...` end to end: two gloo ranks on 127.0.0.1 train
an FSDP2-sharded policy on rank 0's rollouts and log what one process logs for the same run."""

import json
import os
import socket
import subprocess
import sys

import pytest

from rlvr.cli import main
from tests.test_lab import TINY

# one sampling worker: rank 0 samples as one process with one worker does (several workers
# draw a random stream per shard of prompts)
ARGS = [*TINY, "--grpo.steps", "3", "--grpo.checkpoint-every", "2", "--grpo.cpu-workers", "1"]
COMPARED = ("reward/mean", "completion/len_mean", "frac_zero_std_groups")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def records(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "reward/mean" in r]


def train_on_two_ranks(args: list[str], timeout_s: float = 300) -> None:
    """`torchrun --nproc-per-node 2 -m rlvr train ARGS` on 127.0.0.1, asserted to succeed."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    torchrun += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    done = subprocess.run(
        [*torchrun, "-m", "rlvr", "train", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_two_ranks_log_what_one_process_logs(tmp_path):
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    common = ["--runs-dir", str(runs), "--cache-dir", str(cache), *ARGS]
    main(["train", "--run-name", "one", *common])  # also builds the cached base
    train_on_two_ranks(["--run-name", "two", *common])
    one, two = records(runs / "one"), records(runs / "two")
    assert len(one) == len(two) == 3
    for a, b in zip(one, two):
        for key in COMPARED:  # the same rollouts: rank 0 samples them as one process does
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["step"], key)
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4, abs=1e-6)
    # rank 0 alone wrote the logs; both ranks wrote the sharded checkpoints
    step = runs / "two" / "checkpoints" / "step-000003"
    assert {"rng-0.pt", "rng-1.pt", "meta.json"} <= {p.name for p in step.iterdir()}
    assert (runs / "two" / "summary.json").exists() and (runs / "two" / "model").is_dir()
