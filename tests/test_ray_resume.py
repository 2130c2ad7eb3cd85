"""A Ray run killed and resumed (issue 28), end to end: `rlvr train --ray --rollout-workers 2`
(the README's scale-out command) with its driver's process group killed by SIGKILL after the
step-2 checkpoint.

- Every process of the run's Ray (GCS, raylet, agents, the two rollout actors: each in a
  session of its own) is gone within seconds of the driver: no actor outlives its run.
- Resumed on as many actors (`rlvr train --resume RUN --ray --rollout-workers 2`): metrics
  (all but timings, throughput, memory), samples and the final weights are bit-identical to the
  uninterrupted Ray run's with the same seed. The actors keep no random state between calls:
  each call seeds actor i with one draw of the learner's checkpointed generator plus i, and the
  resumed run pushes the loaded weights to its fresh actors before its first step.
- Resumed bare (`rlvr train --resume RUN`, the command the lost-actor line prints): the
  saved placement is kept when the call names none, so the same, bit for bit. (It used to
  continue in one process on other random streams: the in-process sampler seeds its worker
  threads with one draw each, not one draw plus the actor's index.)

A local Ray on 127.0.0.1 per run (its files under the test's own RAY_TMPDIR), the tiny model;
marked `dist` (about 1.5-3 minutes on two CPU cores): `pytest -m dist tests/test_ray_resume.py`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.report.run_dir import read_jsonl
from rlvr.train.checkpoint import latest_checkpoint
from tests.test_distributed_resume import _dead, _finish, _wait_for_rows
from tests.test_lab import TINY
from tests.test_resume import LEARNS, stable

pytest.importorskip("ray")
pytestmark = pytest.mark.dist

STEPS = 6
ON_RAY = ["--ray", "--rollout-workers", "2"]
FLAGS = [*TINY, *LEARNS, "--grpo.steps", str(STEPS), "--grpo.checkpoint-every", "2"]
FLAGS += ["--grpo.worker-timeout-s", "60", "--no-progress", *ON_RAY]
"""Six steps of the tiny model on rewards that vary, a checkpoint every 2, two Ray rollout
actors (`--placement separate`: one CPU each), every wait on them bounded at 60 s."""
KILL_AFTER = 3
"""The kill comes once step 3 is logged: after the step-2 checkpoint, before the step-4 one."""


def _launch(args: list[str], log: Path, ray_dir: Path) -> subprocess.Popen:
    """`python -m rlvr ARGS` in a process group of its own (the one a kill of the job
    reaches), its local Ray's files under `ray_dir`; its output to `log`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    env |= {"PYTHONUNBUFFERED": "1", "RAY_TMPDIR": str(ray_dir)}
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "rlvr", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _train(runs: Path, cache: Path, name: str) -> list[str]:
    return ["train", "--runs-dir", str(runs), "--cache-dir", str(cache), "--run-name", name, *FLAGS]


def _ray_processes(ray_dir: Path) -> dict[int, str]:
    """{pid: command line} of the live processes started with RAY_TMPDIR=`ray_dir` but this
    one: the driver and everything its local Ray started (they inherit its environment)."""
    mark, found = f"RAY_TMPDIR={ray_dir}".encode(), {}
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        try:
            if pid == os.getpid() or mark not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if not _dead(pid):
            found[pid] = command.strip()
    return found


def _same_weights(run: Path, expected: Path) -> bool:
    weights = load_file(run / "model" / "model.safetensors")
    expected_weights = load_file(expected / "model" / "model.safetensors")
    assert weights.keys() == expected_weights.keys()
    return all(torch.equal(weights[k], expected_weights[k]) for k in weights)


@pytest.fixture(scope="module")
def ray_dirs() -> Iterator[Path]:
    """A short directory for the runs' RAY_TMPDIRs (Ray's socket paths under it must stay
    within 107 bytes, which pytest's temporary directories are too deep for)."""
    path = Path(tempfile.mkdtemp(prefix="rlvr-ray-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, ray_dirs) -> Path:
    """The uninterrupted Ray run (it also trains the cached base the others load)."""
    root = tmp_path_factory.mktemp("ray-resume")
    runs, cache, log = root / "runs", root / "cache", root / "whole.log"
    _finish(_launch(_train(runs, cache, "whole"), log, ray_dirs / "w"), runs / "whole", log)
    records = read_jsonl(runs / "whole" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(STEPS + 1))
    assert sum(r.get("grad_norm", 0) > 0 for r in records) >= 3  # the weights move
    return runs / "whole"


@pytest.fixture(scope="module")
def killed(uninterrupted, ray_dirs) -> tuple[Path, Path]:
    """(run, copy): a Ray run whose driver's process group was SIGKILLed after the step-2
    checkpoint, and a copy of its directory made before either is resumed."""
    root = uninterrupted.parent.parent
    run, log, ray_dir = uninterrupted.parent / "killed", root / "killed.log", ray_dirs / "k"
    process = _launch(_train(run.parent, root / "cache", run.name), log, ray_dir)
    _wait_for_rows(run, KILL_AFTER + 1, process, log)
    started = _ray_processes(ray_dir)
    actors = [pid for pid, command in started.items() if command.startswith("ray::RolloutActor")]
    assert len(actors) == 2, started
    os.killpg(process.pid, signal.SIGKILL)  # the driver's group; Ray's processes are not in it
    process.wait()
    deadline = time.time() + 30
    while _ray_processes(ray_dir) and time.time() < deadline:
        time.sleep(0.2)
    assert not _ray_processes(ray_dir), f"outlived their driver: {_ray_processes(ray_dir)}"
    assert not (run / "summary.json").exists()
    last = latest_checkpoint(run / "checkpoints")
    assert (last.name if last else None) == "step-000002", "killed too late to test"
    copy = run.with_name("killed-bare")
    shutil.copytree(run, copy)
    return run, copy


def test_a_killed_ray_run_resumed_on_as_many_actors_is_bit_identical(
    uninterrupted, killed, ray_dirs
):
    run = killed[0]
    log = run.parent.parent / "resume.log"
    args = ["train", "--resume", str(run), *ON_RAY]
    _finish(_launch(args, log, ray_dirs / "r"), run, log)
    assert "resumed from" in log.read_text() and "step-000002" in log.read_text()
    assert stable(read_jsonl(run / "metrics.jsonl")) == stable(
        read_jsonl(uninterrupted / "metrics.jsonl")
    )
    assert read_jsonl(run / "samples.jsonl") == read_jsonl(uninterrupted / "samples.jsonl")
    assert _same_weights(run, uninterrupted)


def test_a_bare_resume_of_a_ray_run_keeps_its_placement_and_is_bit_identical(
    uninterrupted, killed, ray_dirs
):
    """`rlvr train --resume RUN` alone (the command the lost-actor line prints) takes the
    saved placement (Ray, as many actors): the uninterrupted run's rows and weights. Before,
    it continued in one process on other random streams (the in-process sampler seeds each
    thread with a draw of its own; the actors get one draw plus their index)."""
    run = killed[1]
    log = run.parent.parent / "resume-bare.log"
    _finish(_launch(["train", "--resume", str(run)], log, ray_dirs / "b"), run, log)
    records, expected = (stable(read_jsonl(r / "metrics.jsonl")) for r in (run, uninterrupted))
    assert [r["step"] for r in records] == list(range(STEPS + 1))
    assert records == expected
    assert read_jsonl(run / "samples.jsonl") == read_jsonl(uninterrupted / "samples.jsonl")
    assert _same_weights(run, uninterrupted)
