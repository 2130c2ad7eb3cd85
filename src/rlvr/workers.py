"""Independent torch work side by side on a CPU's cores: one Python thread per core.

torch releases the GIL inside its operators, so W Python threads, each running its own
forward passes on one intra-op thread, keep W cores busy. For a model this small that beats
splitting every operator across the cores (torch's intra-op threads): its matrices are too
small for a split to pay off, and a worker's activations stay in its core's cache.
`python benchmarks/bench_workers.py` compares them side by side (its latest numbers are in the
README). The price is memory: two micro-batches' activations and two copies of the gradients at
once (`benchmarks/memory.py`). On a GPU there is one worker: the device is already parallel.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import torch


class WorkerError(RuntimeError):
    """A worker in another process (a rollout actor, a torch.distributed rank) died or stopped
    answering within its timeout. `worker` names it; the training loop adds the last checkpoint
    and the `--resume` command to the message, so a lost worker never hangs a run silently."""

    def __init__(self, worker: str, problem: str) -> None:
        super().__init__(f"{worker}: {problem}")
        self.worker, self.problem = worker, problem


Item = TypeVar("Item")
Result = TypeVar("Result")


def default_workers(model: torch.nn.Module, requested: int = 0, threads: int = 0) -> int:
    """`requested` if > 0; else one worker per torch thread (`threads`, default torch's
    current count) on a CPU, one on an accelerator."""
    if requested > 0:
        return requested
    if next(model.parameters()).device.type != "cpu":
        return 1
    return threads if threads > 0 else torch.get_num_threads()


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op thread count set to `threads` inside the block (it is process-wide),
    restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def map_in_threads(
    fn: Callable[[Item], Result], items: Sequence[Item], workers: int
) -> list[Result]:
    """`[fn(x) for x in items]`, run by `workers` Python threads with one torch thread each
    (in order, in this thread, when there is one worker or one item)."""
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with torch_threads(1), ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(fn, items))


def balanced_shards(costs: Sequence[float], workers: int) -> list[list[int]]:
    """Indices of `costs` split into `workers` lists of near-equal total cost: each item, in
    decreasing cost, goes to the least loaded list (ties to the lower index); lists keep the
    items in their original order. Empty lists are dropped."""
    loads, shards = [0.0] * workers, [[] for _ in range(workers)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        w = loads.index(min(loads))
        shards[w].append(i)
        loads[w] += costs[i]
    return [sorted(s) for s in shards if s]


def wait_for(
    future: Future[Result], worker: str, timeout_s: float, heartbeat_s: float = 60.0
) -> Result:
    """`future.result()`, waiting at most `timeout_s` seconds: a `[rlvr] waiting for ...` line
    on stderr every `heartbeat_s` seconds of waiting, and a `WorkerError` naming `worker` at the
    timeout. An exception raised by the work is raised here."""
    start = time.perf_counter()
    while True:
        waited = time.perf_counter() - start
        try:
            return future.result(timeout=max(0.0, min(heartbeat_s, timeout_s - waited)))
        except FutureTimeout:
            waited = time.perf_counter() - start
            if waited >= timeout_s:
                raise WorkerError(worker, f"did not answer within {timeout_s:.0f} s") from None
            print(f"[rlvr] waiting for {worker} ({waited:.0f} s)", file=sys.stderr, flush=True)


def wait_settled(future: Future, worker: str, timeout_s: float, heartbeat_s: float = 60.0) -> bool:
    """`wait_for`, but the work's own outcome is not raised: True once the future is done
    (a result or an error of its own), False when `timeout_s` passed with it still running."""
    try:
        wait_for(future, worker, timeout_s, heartbeat_s)
    except Exception:
        return future.done()
    return True


def call_with_timeout(fn: Callable[[], Any], timeout_s: float) -> tuple[str, Any]:
    """("ok", result), ("error", exception) or ("timeout", None): `fn()` in a daemon thread,
    waited for at most `timeout_s` (a thread that does not answer is left behind)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["ok"] = fn()
        except BaseException as exc:  # the caller's, returned as ("error", exc)
            box["error"] = exc

    thread = threading.Thread(target=run, name="rlvr-call", daemon=True)
    thread.start()
    thread.join(max(timeout_s, 0.0))
    if thread.is_alive():
        return "timeout", None
    return ("ok", box["ok"]) if "ok" in box else ("error", box["error"])


def calls_in_parallel(
    calls: list[Callable[[], Any]], timeouts: list[float]
) -> list[tuple[str, Any, float]]:
    """Each call in its own daemon thread, all started at once, call i waited for at most
    `timeouts[i]` seconds from the start; per call (status, result, seconds) as
    `call_with_timeout` says, seconds being the call's own (its timeout for one that did not
    answer)."""
    boxes: list[dict[str, Any]] = [{} for _ in calls]
    threads = []
    for call, box in zip(calls, boxes):

        def run(call=call, box=box) -> None:
            start = time.monotonic()
            try:
                box["ok"] = call()
            except BaseException as exc:  # the caller's, returned
                box["error"] = exc
            box["seconds"] = time.monotonic() - start

        thread = threading.Thread(target=run, name="rlvr-call", daemon=True)
        thread.start()
        threads.append(thread)
    started = time.monotonic()
    out = []
    for thread, box, timeout in zip(threads, boxes, timeouts):
        thread.join(max(0.0, timeout - (time.monotonic() - started)))
        if thread.is_alive():
            out.append(("timeout", None, timeout))
        elif "ok" in box:
            out.append(("ok", box["ok"], box["seconds"]))
        else:
            out.append(("error", box["error"], box["seconds"]))
    return out
