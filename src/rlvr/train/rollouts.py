"""The rollout role: an engine, the task's reward functions, and DAPO's dynamic sampling.

`collect` turns the next prompts of the row stream into a `RolloutBatch` (task rows attached,
`row_index` joining each completion to its row) and one reward per completion; `sync` makes the
engine sample from the learner's current weights. In one process the engine samples with the
policy module itself; past one process the same two calls go to rollout workers, and only
plain CPU tensors and lists cross the boundary.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

import torch

from rlvr import algo
from rlvr.config import warn
from rlvr.report.timer import StepTimer
from rlvr.rollout.engine import RolloutEngine
from rlvr.rollout.episodes import (
    EpisodeSpec,
    episode_batch,
    episode_metrics,
    run_episodes,
    to_device,
)
from rlvr.rollout.sampler import RolloutBatch, concat_batches, select_rows
from rlvr.tasks.rewards import RewardFn, reward_columns, total_rewards
from rlvr.train.config import SamplingPlan
from rlvr.train.distributed import DistContext, broadcast_object
from rlvr.workers import WorkerError, torch_threads, wait_for, wait_settled


class HasWeights(Protocol):
    def state_dict(self) -> dict[str, torch.Tensor]: ...


class Rollout:
    """Samples `group_size` completions for `prompts_per_step` rows of `rows` and scores them
    with `reward_fns` (weighted sum, crashes scored 0 and counted: `total_rewards`)."""

    def __init__(
        self,
        engine: RolloutEngine,
        rows: Iterator[dict[str, Any]],
        reward_fns: Sequence[RewardFn],
        reward_weights: Sequence[float],
        plan: SamplingPlan,
        pad_id: int,
    ) -> None:
        self.engine, self.rows, self.plan, self.pad_id = engine, rows, plan, pad_id
        self.reward_fns, self.reward_weights = list(reward_fns), list(reward_weights)
        self.consumed = 0  # training rows taken from the stream: a checkpoint's data position

    def skip(self, n: int) -> None:
        """Take `n` rows off the stream unseen (a resumed run restarts where it stopped)."""
        for _ in range(n):
            next(self.rows)
        self.consumed += n

    def collect(
        self, generator: torch.Generator, timer: StepTimer
    ) -> tuple[RolloutBatch, torch.Tensor, dict[str, float]]:
        """(batch [N], rewards [N], metrics) of one step. With dynamic sampling only groups
        whose rewards differ are kept, and more prompts are drawn until `prompts_per_step`
        groups are (at most `max_rounds` rounds; then the step trains on what was kept)."""
        plan = self.plan
        batches, rewards_per_round, metrics, kept, rounds = [], [], {}, 0, 0
        with torch_threads(plan.threads):
            while rounds < plan.max_rounds:
                rounds += 1
                batch, rewards, metrics = self._round(generator, timer)
                if plan.dynamic_sampling:
                    keep = algo.dynamic_sampling_keep(rewards, batch.group_ids)
                    rows = keep.nonzero().squeeze(1)
                    batch, rewards = select_rows(batch, rows), rewards[rows]
                batches.append(batch)
                rewards_per_round.append(rewards)
                kept += len(batch.group_ids.unique())
                if kept >= plan.prompts_per_step:
                    break
        # one sampling round (always, without dynamic sampling) needs no re-padding copy
        batch = batches[0] if len(batches) == 1 else concat_batches(batches, self.pad_id)
        rewards = torch.cat(rewards_per_round)
        if plan.dynamic_sampling:
            batch, rewards = _first_groups(batch, rewards, plan.prompts_per_step)
            metrics["sampling/tries"], metrics["sampling/kept_groups"] = float(rounds), float(kept)
        return batch, rewards, metrics

    def _round(
        self, generator: torch.Generator, timer: StepTimer
    ) -> tuple[RolloutBatch, torch.Tensor, dict[str, float]]:
        """One sampling call and its rewards, the rows attached to the batch."""
        plan = self.plan
        rows = self._next_rows()
        prompts = [r["prompt"] for r in rows]
        with timer("generate"):
            batch = self.engine.generate(
                prompts, plan.group_size, plan.max_new_tokens, plan.temperature, generator
            )
        batch.rows = rows  # engines number a call's prompts 0..B-1: row_index indexes rows
        with timer("verify"):
            rewards, metrics = self._verify(rows, batch)
        # the step's one host-to-device crossing: rewards join the batch on the model's device
        return batch, rewards.to(batch.completion_ids.device), metrics

    def _next_rows(self) -> list[dict[str, Any]]:
        """The step's `prompts_per_step` rows off the stream (counted as consumed)."""
        rows = [next(self.rows) for _ in range(self.plan.prompts_per_step)]
        self.consumed += len(rows)
        return rows

    def _verify(
        self, rows: list[dict[str, Any]], batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The reward functions on the batch's completions, each against its row."""
        per_completion = [rows[i] for i in batch.row_index.tolist()]
        return total_rewards(
            self.reward_fns,
            self.reward_weights,
            [r["prompt"] for r in per_completion],
            batch.completions,
            reward_columns(per_completion),
            timeout_s=self.plan.verify_timeout_s,
        )

    def sync(self, learner: HasWeights) -> None:
        """Make the next `collect` sample from the learner's current weights, handed over as a
        state dict (the in-process engine sees its own tensors and does nothing)."""
        self.engine.load_weights(learner.state_dict())

    def drain(self) -> None:
        """Nothing runs in the background (`AsyncRollout` waits for its queued work)."""

    def close(self, wait: bool = True) -> None:
        """Nothing to stop (`AsyncRollout` stops its thread)."""


class EpisodeRollout(Rollout):
    """Rollouts over several turns: each row's `group_size` episodes in its environment
    (`rlvr.rollout.episodes.run_episodes`, the group on one seed drawn from the loop's
    generator), as one `RolloutBatch` with an action mask. An episode's reward is its
    environment's return (turn rewards discounted by `limits.turn_discount`), plus the task's
    verifiers on its final reply when `episodes.verify` is on. Dynamic sampling, async
    sampling and the broadcast to ranks wrap it as they wrap `Rollout`. Metrics add `env/*`
    (turns, statuses, tool calls, errors and timeouts, env-token share, seconds)."""

    def __init__(
        self,
        engine: RolloutEngine,
        rows: Iterator[dict[str, Any]],
        reward_fns: Sequence[RewardFn],
        reward_weights: Sequence[float],
        plan: SamplingPlan,
        pad_id: int,
        episodes: EpisodeSpec,
    ) -> None:
        super().__init__(engine, rows, reward_fns, reward_weights, plan, pad_id)
        self.episodes = episodes

    def _round(
        self, generator: torch.Generator, timer: StepTimer
    ) -> tuple[RolloutBatch, torch.Tensor, dict[str, float]]:
        plan, spec = self.plan, self.episodes
        rows = self._next_rows()
        seeds = torch.randint(
            0, 2**31 - 1, (len(rows),), generator=generator, device=generator.device
        )
        tokenizer = spec.renderer.tokenizer
        with timer("generate"):
            episodes = run_episodes(
                self.engine,  # type: ignore[arg-type]  # checked when built: generate_tokens
                spec.renderer,
                spec.factory,
                rows,
                seeds.tolist(),
                plan.group_size,
                spec.limits,
                plan.temperature,
                generator,
                tokenizer.decode,
                tokenizer.eos_token_id,
            )
        batch = episode_batch(episodes, plan.group_size, self.pad_id)
        batch.rows, batch.row_index = rows, batch.group_ids.clone()
        returns = [e.episode_return(spec.limits.turn_discount) for e in episodes]
        rewards = torch.tensor(returns) if spec.env_reward else torch.zeros(len(episodes))
        metrics = episode_metrics(episodes)
        if spec.verify:
            with timer("verify"):
                verified, verify_metrics = self._verify(rows, batch)
            rewards, metrics = rewards + verified, metrics | verify_metrics
        device = self.engine_device()
        return to_device(batch, device), rewards.to(device), metrics

    def engine_device(self) -> torch.device:
        model = getattr(self.engine, "model", None)
        return next(model.parameters()).device if model is not None else torch.device("cpu")


Collected = tuple[RolloutBatch, torch.Tensor, dict[str, float]]

CLOSE_TIMEOUT_S = 60.0
"""The longest `AsyncRollout.close()` waits for the call its thread is running (sampling
rollouts no step will take, or a weight load) before it warns and goes on without it."""
CLOSE_HEARTBEAT_S = 10.0
"""Seconds between the `[rlvr] waiting for the rollout thread to finish ...` lines of a close
that waits."""


class OrderedThread:
    """One daemon thread that runs the calls submitted to it in order, each behind a `Future`:
    a `ThreadPoolExecutor(max_workers=1)` whose thread never holds up the interpreter's exit
    (Python joins an executor's threads at exit, so a call stuck in an engine would hang the
    process there, silently). Started by the first `submit`."""

    def __init__(self, name: str) -> None:
        self.name, self.closed = name, False
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        if self.closed:
            raise RuntimeError(f"{self.name}: submit after shutdown")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        future: Future = Future()
        self._calls.put((future, fn, args))
        return future

    def shutdown(self) -> None:
        """Take no more calls; the thread ends after the queued ones (cancelled ones are
        skipped). Returns at once."""
        self.closed = True
        self._calls.put(None)

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args = call
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while queued
            try:
                result = fn(*args)
            except BaseException as exc:  # the caller's, through the future
                future.set_exception(exc)
            else:
                future.set_result(result)


class AsyncRollout:
    """A `Rollout` run `ahead` steps ahead of the learner, in one background thread: while the
    learner updates on step t's rollouts, the rollouts of steps t+1..t+ahead are sampled and
    verified, each from the newest weights synced when its sampling was queued (at most
    `ahead` updates old). The thread runs queued work in order (sampling rounds and weight
    loads), so an engine is never loaded while it samples; its own weights must not be the
    policy's (an in-process engine samples with a copy of the policy).

    The same two calls as `Rollout`: `collect` returns the oldest queued step's rollouts
    (waiting with a heartbeat and `timeout_s`; a sampling error is raised here) and queues the
    next; `sync` snapshots the learner's weights and queues their load. Metrics add
    `async/staleness` (learner updates since the rollouts' weights) and the background
    thread's own `async/generate_s` / `async/verify_s`; the step's `time/generate_s` is the
    time the learner waited for them."""

    def __init__(
        self,
        rollout: Rollout,
        ahead: int,
        timeout_s: float,
        close_timeout_s: float = CLOSE_TIMEOUT_S,
    ) -> None:
        self.rollout, self.ahead, self.timeout_s = rollout, ahead, timeout_s
        self.close_timeout_s = close_timeout_s
        self.thread = OrderedThread("rlvr-rollout")
        self.queued: deque[tuple[Future[Collected], int]] = deque()
        self.work: deque[tuple[Future, str]] = deque()  # submitted, not seen done; what it does
        self.version = 0  # learner updates synced so far

    @property
    def consumed(self) -> int:
        return self.rollout.consumed

    def skip(self, n: int) -> None:
        self.rollout.skip(n)

    def collect(
        self, generator: torch.Generator, timer: StepTimer
    ) -> tuple[RolloutBatch, torch.Tensor, dict[str, float]]:
        if not self.queued:
            self._queue(generator)
        future, version = self.queued.popleft()
        with timer("generate"):  # the learner's wait; the sampling itself ran beside it
            batch, rewards, metrics = wait_for(future, "the rollout thread", self.timeout_s)
        while len(self.queued) < self.ahead:  # sampled while this step updates
            self._queue(generator)
        return batch, rewards, metrics | {"async/staleness": float(self.version - version)}

    def sync(self, learner: HasWeights) -> None:
        snapshot = {k: v.detach().clone() for k, v in learner.state_dict().items()}
        self._submit("loading the learner's weights", self.rollout.engine.load_weights, snapshot)
        self.version += 1

    def drain(self) -> None:
        """Wait for the queued work (a checkpoint then sees the generator and the row stream
        at rest; the queued rollouts stay queued, and an error among them is raised by the
        `collect` that takes it, after this step's checkpoint). The wait prints a heartbeat
        line and, past `timeout_s` in all, raises `WorkerError` rather than checkpoint a
        generator still in use."""
        deadline = time.monotonic() + self.timeout_s
        worker = "the rollout thread (queued rollouts, before a checkpoint)"
        for future, _ in self.queued:  # an error of the work's own: raised by its collect
            if not wait_settled(future, worker, max(0.0, deadline - time.monotonic())):
                raise WorkerError(worker, f"did not answer within {self.timeout_s:.0f} s")

    def close(self, wait: bool = True) -> None:
        """Cancel the queued work and stop the thread after its running call. With `wait`
        (not after an error), wait for that call at most `close_timeout_s` (or `timeout_s`,
        when shorter), a `[rlvr] waiting for the rollout thread to finish ...` line every
        `CLOSE_HEARTBEAT_S`; past it, one warning line naming the call, and the run goes on
        without it (the thread is a daemon: a call stuck in an engine cannot hang the exit).
        An error of that call is not raised: no step takes its result."""
        for future, _ in self.work:
            future.cancel()  # those still queued; the running one carries on
        self.thread.shutdown()
        running = [(future, what) for future, what in self.work if not future.done()]
        self.work.clear()
        if not wait:
            return
        bound = min(self.close_timeout_s, self.timeout_s)
        deadline = time.monotonic() + bound
        for future, what in running:  # at most one: the thread runs one call at a time
            left = max(0.0, deadline - time.monotonic())
            worker = f"the rollout thread to finish {what}"
            if not wait_settled(future, worker, left, CLOSE_HEARTBEAT_S):
                warn(
                    f"the rollout thread was still {what} {bound:g} s after the run asked "
                    "it to stop; going on without it"
                )
                return

    def _submit(self, what: str, fn: Callable[..., Any], *args: Any) -> Future:
        """`fn(*args)` queued on the thread; `what` names it in `close`'s lines."""
        while self.work and self.work[0][0].done():
            self.work.popleft()
        future = self.thread.submit(fn, *args)
        self.work.append((future, what))
        return future

    def _queue(self, generator: torch.Generator) -> None:
        future = self._submit("sampling a step's rollouts", self._collect, generator)
        self.queued.append((future, self.version))

    def _collect(self, generator: torch.Generator) -> Collected:
        timer = StepTimer()
        batch, rewards, metrics = self.rollout.collect(generator, timer)
        times = timer.metrics()
        return (
            batch,
            rewards,
            metrics
            | {
                f"async/{part}_s": times.get(f"time/{part}_s", 0.0)
                for part in ("generate", "verify")
            },
        )


class BroadcastRollout:
    """The rollout side of several torch.distributed ranks: rank 0 samples and verifies, and
    every rank gets the step's batch, rewards and metrics from it (one pickled broadcast), so
    the ranks train on one global batch whose divisors they all know. `sync` runs on every
    rank (gathering the FSDP2 learner's weights is a collective) and each rank's engine
    loads them."""

    def __init__(self, rollout: Rollout | AsyncRollout, ctx: DistContext) -> None:
        self.rollout, self.ctx = rollout, ctx

    @property
    def consumed(self) -> int:
        return self.rollout.consumed  # rank 0's is the one a checkpoint keeps

    def skip(self, n: int) -> None:
        self.rollout.skip(n)

    def collect(
        self, generator: torch.Generator, timer: StepTimer
    ) -> tuple[RolloutBatch, torch.Tensor, dict[str, float]]:
        if not self.ctx.is_main:
            with timer("generate"):  # the wait for rank 0's rollouts
                return broadcast_object(None, self.ctx)
        collected = self.rollout.collect(generator, timer)
        with timer("broadcast"):
            return broadcast_object(collected, self.ctx)

    def sync(self, learner: HasWeights) -> None:
        self.rollout.sync(learner)

    def drain(self) -> None:
        self.rollout.drain()

    def close(self, wait: bool = True) -> None:
        self.rollout.close(wait)


def _first_groups(
    batch: RolloutBatch, rewards: torch.Tensor, groups: int
) -> tuple[RolloutBatch, torch.Tensor]:
    """The completions of the first `groups` groups, in sampling order (dynamic sampling may
    keep more than a step trains on)."""
    if len(rewards) == 0:
        return batch, rewards
    first = batch.group_ids < batch.group_ids.unique()[:groups].max() + 1
    return select_rows(batch, first.nonzero().squeeze(1)), rewards[first]
