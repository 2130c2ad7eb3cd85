"""Shutdown waits are bounded and say what they wait for (issue 28): `AsyncRollout.close` and
`RayEngine.close` wait for their running work at most a bound, print a heartbeat meanwhile,
and then warn naming it and go on; a call stuck in an engine never hangs the process's exit."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from rlvr.report.timer import StepTimer
from rlvr.rollout import ray_engine
from rlvr.rollout.engine import HFEngine
from rlvr.rollout.ray_engine import RayEngine
from rlvr.train import rollouts
from rlvr.train.config import GRPOConfig, build_plan
from rlvr.train.rollouts import AsyncRollout, Rollout
from rlvr.verifiers.math import math_reward
from tests.test_async import rows, tiny


class StuckAfterFirst:
    """An engine whose first `generate` samples and whose later ones wait for `release`."""

    def __init__(self, inner: HFEngine) -> None:
        self.inner, self.calls = inner, 0
        self.stuck, self.release = threading.Event(), threading.Event()

    def generate(self, *args, **kwargs):
        self.calls += 1
        if self.calls > 1:
            self.stuck.set()
            self.release.wait(30)
        return self.inner.generate(*args, **kwargs)

    def load_weights(self, state_dict) -> None:
        self.inner.load_weights(state_dict)


class Weights:
    """A learner as `sync` sees it: a state dict."""

    def state_dict(self) -> dict:
        return {}


class SlowLoads:
    """An engine whose weight loads take `seconds` each (forever when None), counted."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds, self.loads = seconds, 0
        self.started, self.release = threading.Event(), threading.Event()

    def load_weights(self, state_dict) -> None:
        self.started.set()
        self.release.wait(self.seconds)
        self.loads += 1


def async_rollout(engine, close_timeout_s: float = 60.0, timeout_s: float = 60.0) -> AsyncRollout:
    plan = build_plan(GRPOConfig(prompts_per_step=2, group_size=2, max_new_tokens=4)).sampling
    rollout = Rollout(engine, rows(), [math_reward], [1.0], plan, pad_id=0)
    return AsyncRollout(rollout, ahead=1, timeout_s=timeout_s, close_timeout_s=close_timeout_s)


def test_a_stuck_collect_does_not_hang_close_it_waits_the_bound_and_warns(monkeypatch, capfd):
    monkeypatch.setattr(rollouts, "CLOSE_HEARTBEAT_S", 0.2)
    model, tokenizer = tiny()
    engine = StuckAfterFirst(HFEngine(model, tokenizer))
    rollout = async_rollout(engine, close_timeout_s=1.0)
    rollout.collect(torch.Generator().manual_seed(0), StepTimer())  # queues the next step,
    assert engine.stuck.wait(10)  # ... whose sampling is now stuck
    start = time.monotonic()
    try:
        rollout.close()
        waited = time.monotonic() - start
    finally:
        engine.release.set()
    assert 1.0 <= waited < 3.0
    err = capfd.readouterr().err
    heartbeat = "[rlvr] waiting for the rollout thread to finish sampling a step's rollouts ("
    assert re.search(re.escape(heartbeat) + r"\d+ s\)", err), err
    warning = [line for line in err.splitlines() if line.startswith("[rlvr] warning:")]
    assert warning == [
        "[rlvr] warning: the rollout thread was still sampling a step's rollouts 1 s after "
        "the run asked it to stop; going on without it"
    ]


def test_close_waits_for_a_call_that_ends_within_the_bound_and_drops_the_queued_ones(capfd):
    engine = SlowLoads(0.3)
    rollout = async_rollout(engine, close_timeout_s=10.0)
    for _ in range(3):
        rollout.sync(Weights())  # the first runs, two wait behind it
    assert engine.started.wait(10)
    start = time.monotonic()
    rollout.close()
    assert time.monotonic() - start < 1.0
    time.sleep(0.5)
    assert engine.loads == 1  # the running load finished; the queued ones were cancelled
    assert "warning" not in capfd.readouterr().err
    with pytest.raises(RuntimeError, match="after shutdown"):
        rollout.sync(Weights())


def test_close_after_an_error_does_not_wait_and_an_error_at_close_is_not_raised(capfd):
    stuck = SlowLoads(None)
    rollout = async_rollout(stuck, close_timeout_s=10.0)
    rollout.sync(Weights())
    assert stuck.started.wait(10)
    start = time.monotonic()
    rollout.close(wait=False)
    assert time.monotonic() - start < 0.5
    stuck.release.set()

    class Fails(SlowLoads):
        def load_weights(self, state_dict) -> None:
            super().load_weights(state_dict)
            raise RuntimeError("the engine broke")

    fails = Fails(0.2)
    rollout = async_rollout(fails, close_timeout_s=10.0)
    rollout.sync(Weights())
    assert fails.started.wait(10)
    rollout.close()  # no step takes that call's result: nothing raised, nothing warned
    assert fails.loads == 1 and "warning" not in capfd.readouterr().err


def test_a_process_whose_rollout_thread_is_stuck_still_exits():
    """The thread is a daemon: with a ThreadPoolExecutor's, Python joins it at exit and the
    process hangs there, silently, after the run's last line."""
    script = textwrap.dedent(
        """
        import threading
        from rlvr.train.rollouts import AsyncRollout, Rollout

        started = threading.Event()

        class Stuck:
            def load_weights(self, state_dict):
                started.set()
                threading.Event().wait()

        class Weights:
            def state_dict(self):
                return {}

        rollout = AsyncRollout(Rollout(Stuck(), iter(()), [], [], None, 0), 1, 60.0, 0.5)
        rollout.sync(Weights())
        assert started.wait(30)
        rollout.close()
        print("closed", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout == "closed\n", done.stderr
    assert "still loading the learner's weights 0.5 s after" in done.stderr


class FakeRay:
    """What `RayEngine.close` calls on Ray, with a shutdown that hangs until released."""

    def __init__(self) -> None:
        self.killed, self.release = [], threading.Event()

    def is_initialized(self) -> bool:
        return True

    def kill(self, actor, no_restart: bool) -> None:
        self.killed.append(actor)

    def shutdown(self) -> None:
        self.release.wait(30)


def fake_engine(ray) -> RayEngine:
    engine = RayEngine.__new__(RayEngine)  # no cluster: only what close() reads
    engine._ray, engine.actors, engine.pids, engine._started_ray = ray, ["a0", "a1"], [11, 12], True
    engine.timeout_s, engine.close_timeout_s = 60.0, 1.0
    return engine


def test_a_hanging_ray_shutdown_does_not_hang_the_engines_close(monkeypatch, capfd):
    monkeypatch.setattr(ray_engine, "CLOSE_HEARTBEAT_S", 0.2)
    unregistered = []
    monkeypatch.setattr(ray_engine.atexit, "unregister", unregistered.append)
    ray = FakeRay()
    engine = fake_engine(ray)
    start = time.monotonic()
    try:
        engine.close()
        waited = time.monotonic() - start
    finally:
        ray.release.set()
    assert 1.0 <= waited < 3.0 and ray.killed == ["a0", "a1"]
    what = (
        "Ray's teardown (killing rollout actor 0 (pid 11), rollout actor 1 (pid 12), "
        "then its shutdown)"
    )
    err = capfd.readouterr().err
    assert re.search(re.escape(f"[rlvr] waiting for {what} (") + r"\d+ s\)", err), err
    assert f"[rlvr] warning: {what} did not end within 1 s; going on without it" in err
    assert unregistered == [ray.shutdown]  # Ray's atexit shutdown would wait again
    engine.close()  # twice: nothing left to do
    assert ray.killed == ["a0", "a1"]


def test_the_engines_close_returns_as_soon_as_ray_is_down(capfd):
    ray = FakeRay()
    ray.release.set()
    engine = fake_engine(ray)
    engine.close_timeout_s = 30.0
    start = time.monotonic()
    engine.close()
    assert time.monotonic() - start < 0.5 and ray.killed == ["a0", "a1"]
    assert "warning" not in capfd.readouterr().err


def test_drain_before_a_checkpoint_times_out_with_the_threads_name(capfd):
    """A checkpoint waits for the queued rollouts (the generator must be at rest); a stuck
    one ends that wait at `timeout_s` with a WorkerError naming the thread, never a
    checkpoint taken while the thread still draws from the generator."""
    from rlvr.workers import WorkerError

    model, tokenizer = tiny()
    engine = StuckAfterFirst(HFEngine(model, tokenizer))
    rollout = async_rollout(engine, timeout_s=1.0)
    rollout.collect(torch.Generator().manual_seed(0), StepTimer())
    assert engine.stuck.wait(10)
    start = time.monotonic()
    try:
        with pytest.raises(WorkerError, match=r"the rollout thread .*did not answer within 1 s"):
            rollout.drain()
        assert time.monotonic() - start < 5
    finally:
        engine.release.set()
        rollout.close(wait=True)
