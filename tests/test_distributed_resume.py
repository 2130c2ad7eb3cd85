"""`torchrun --nproc-per-node 2` runs that are killed and resumed (issue 28), end to end.

- kill -9 of the launcher's process group before the first checkpoint and after it, each
  resumed: metrics, samples and final weights bit-identical to the uninterrupted 2-rank run,
  and no rank outlives its launcher (torchrun starts each rank in a session of its own: before
  `die_with_parent` they went on training beside the resumed run, in the same directory);
- kill -9 of one rank alone: the other ends at once, naming the lost rank;
- every run, fresh or resumed, exits within seconds of its last write.

Two gloo ranks on 127.0.0.1, the tiny model; marked `dist` (about two minutes each on two
CPU cores): `pytest -m dist tests/test_distributed_resume.py`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.report.run_dir import read_jsonl
from rlvr.train.checkpoint import latest_checkpoint
from tests.test_lab import TINY
from tests.test_resume import LEARNS, stable

pytestmark = pytest.mark.dist

STEPS = 6
FLAGS = [*TINY, *LEARNS, "--grpo.steps", str(STEPS), "--grpo.checkpoint-every", "3"]
FLAGS += ["--grpo.cpu-workers", "1", "--grpo.worker-timeout-s", "60", "--no-progress"]
"""Six steps of the tiny model on rewards that vary, a checkpoint every 3, one sampling worker
on rank 0 (so that it samples as one process does), collectives bounded at 60 s."""
EXIT_S = 20.0
"""How soon after its last write a run must have exited (the hang of issue 28 was minutes)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(args: list[str], log: Path) -> subprocess.Popen:
    """torchrun x2 of `rlvr ARGS`, in a process group of its own (the one a kill of the job
    reaches); its output to `log`."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1"}
    env |= {"OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    torchrun += ["--master-addr", "127.0.0.1", "--master-port", str(_free_port())]
    with log.open("w") as out:
        return subprocess.Popen(
            [*torchrun, "-m", "rlvr", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _train(runs: Path, cache: Path, name: str) -> list[str]:
    return ["train", "--runs-dir", str(runs), "--cache-dir", str(cache), "--run-name", name, *FLAGS]


def _finish(process: subprocess.Popen, run: Path, log: Path, timeout_s: float = 240) -> None:
    """Wait for a run that should succeed; it must exit 0 within EXIT_S of its last write."""
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError(f"{run.name} did not end: {log.read_text()[-3000:]}") from None
    ended = time.time()
    assert process.returncode == 0, log.read_text()[-3000:]
    last_write = max(p.stat().st_mtime for p in run.rglob("*") if p.is_file())
    assert ended - last_write < EXIT_S, f"{run.name} exited {ended - last_write:.0f} s late"


def _children(pid: int) -> list[int]:
    """The live child processes of `pid` (the ranks of a torchrun launcher), from /proc."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines())
        except (OSError, ValueError):
            continue
        if fields.get("PPid", "").strip() == str(pid) and not _dead(int(status.parent.name)):
            found.append(int(status.parent.name))
    return found


def _dead(pid: int) -> bool:
    """Exited (a zombie counts: a container's init may never reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _rank_of(pid: int) -> int:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(v for v in environ if v.startswith(b"RANK="))[5:])


def _wait_for_rows(run: Path, rows: int, process: subprocess.Popen, log: Path) -> None:
    deadline = time.time() + 240
    while time.time() < deadline:
        if len(read_jsonl(run / "metrics.jsonl")) >= rows:
            return
        if process.poll() is not None:
            raise AssertionError(f"the run ended early: {log.read_text()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError("the run did not reach the kill point in time")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """The uninterrupted 2-rank run (its rank 0 also trains the cached base)."""
    root = tmp_path_factory.mktemp("dist")
    runs, cache = root / "runs", root / "cache"
    log = root / "whole.log"
    _finish(_launch(_train(runs, cache, "whole"), log), runs / "whole", log)
    records = read_jsonl(runs / "whole" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(STEPS + 1))
    assert sum(r.get("grad_norm", 0) > 0 for r in records) >= 3  # the weights move
    return runs / "whole"


@pytest.mark.parametrize(("kill_after", "checkpoint"), [(1, None), (4, "step-000003")])
def test_a_killed_launcher_takes_its_ranks_and_the_resume_is_bit_identical(
    uninterrupted, kill_after, checkpoint
):
    runs = uninterrupted.parent
    cache, name = runs.parent / "cache", f"killed-{kill_after}"
    run, log = runs / name, runs.parent / f"{name}.log"
    process = _launch(_train(runs, cache, name), log)
    _wait_for_rows(run, kill_after + 1, process, log)
    ranks = _children(process.pid)
    assert len(ranks) == 2, ranks
    os.killpg(process.pid, signal.SIGKILL)  # the launcher's group: the ranks are not in it
    process.wait()
    time.sleep(2)  # ranks left running would log a step or more in this time
    assert all(map(_dead, ranks)), "a rank outlived its launcher"
    assert not (run / "summary.json").exists(), "ranks outlived their launcher and finished"
    last = latest_checkpoint(run / "checkpoints")
    assert (last.name if last else None) == checkpoint, "killed too late to test"

    resume_log = runs.parent / f"{name}-resume.log"
    _finish(_launch(["train", "--resume", str(run)], resume_log), run, resume_log)
    expected = stable(read_jsonl(uninterrupted / "metrics.jsonl"))
    assert stable(read_jsonl(run / "metrics.jsonl")) == expected
    assert read_jsonl(run / "samples.jsonl") == read_jsonl(uninterrupted / "samples.jsonl")
    weights = load_file(run / "model" / "model.safetensors")
    expected_weights = load_file(uninterrupted / "model" / "model.safetensors")
    assert weights.keys() == expected_weights.keys()
    assert all(torch.equal(weights[k], expected_weights[k]) for k in weights)


def test_a_killed_rank_ends_the_other_naming_it(uninterrupted):
    runs = uninterrupted.parent
    run, log = runs / "lost-rank", runs.parent / "lost-rank.log"
    args = _train(runs, runs.parent / "cache", "lost-rank")
    args[args.index("--grpo.steps") + 1] = "200"  # still running when rank 1 is killed
    process = _launch(args, log)
    _wait_for_rows(run, 3, process, log)
    rank1 = next(pid for pid in _children(process.pid) if _rank_of(pid) == 1)
    killed = time.time()
    os.kill(rank1, signal.SIGKILL)
    try:
        process.wait(timeout=90)  # the collective timeout is 60 s; gloo sees a reset at once
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError(f"rank 0 went on without rank 1: {log.read_text()[-3000:]}") from None
    assert process.returncode != 0
    assert time.time() - killed < 70
    lines = [line for line in log.read_text().splitlines() if line.startswith("rlvr: error:")]
    assert lines and lines[0].startswith("rlvr: error: rank 1: lost during"), lines
