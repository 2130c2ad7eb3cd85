"""Turn reward functions (TRL's signature) into one reward tensor, never raising, never hanging.

The deadline (`total_rewards(..., timeout_s=)`, `--grpo.verify-timeout-s`) bounds each call of
one reward function on one batch of completions, however the function is written: the call runs
in a worker thread, and the caller waits at most ``timeout_s`` for it. Past it, every completion
of that call scores 0 for that function, `verifier/<fn>/timeout` counts them, the run warns once
per function (one line), and the thread is abandoned: Python cannot stop a thread, so it runs on
until the function returns by itself, its result is dropped, and until then it holds its memory
and competes for the CPU (and the GIL) with the run. A function that never returns leaks one
thread per step it is called in; one that counts its verdicts by reason (the math verifier) may
still add some to a later call's `verifier/` metrics while it finishes.

Why per call and not per completion: a reward function is one opaque batched call
(``fn(prompts, completions, **columns)``), which may grade its batch together (the code verifier
runs its sandboxes in parallel); a per-completion deadline would need one call per completion.
How others bound rewards: verl's PRIME reward manager runs each item in a process pool under
``asyncio.wait_for`` (300 s per item) and kills the pool's processes afterwards; verl's naive
manager (``compute_score_timeout``, PR 6673) and a proposed miles ``--rm-timeout`` (PR 3221)
abandon a per-sample call in a thread past its timeout, as here; TRL calls reward functions
inline, unbounded. A process would let a runaway be
killed, but it would need every reward function and its columns to pickle; rlvr's own verifiers
bound their expensive parts in processes already (the math verifier's sympy comparison, the code
verifier's sandbox), so the thread is the last line, for pure-Python work such as parsing, and
for users' functions.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlvr.config import warn

RewardFn = Callable[..., Sequence[float | None]]

_WARNED: set[str] = set()  # reward functions whose deadline has been reported (once each)


class _Timeout(Exception):
    """A reward function's call ran past its deadline (its thread is abandoned)."""


def _call(
    fn: RewardFn,
    name: str,
    timeout_s: float,
    prompts: list[str],
    completions: list[str],
    columns: dict[str, list],
) -> list:
    """``list(fn(prompts, completions, **columns))``, in this thread when ``timeout_s`` is 0,
    else in a daemon thread waited on for at most ``timeout_s`` seconds (raises `_Timeout`;
    the thread runs on, abandoned). What the function raises is raised here."""
    if timeout_s <= 0:
        return list(fn(prompts, completions, **columns))
    outcome: list[tuple[bool, Any]] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, list(fn(prompts, completions, **columns))))
        except BaseException as exc:  # raised again in the caller's thread
            outcome.append((False, exc))
        finally:
            done.set()

    # a daemon thread: an abandoned call must not keep the process alive at exit
    threading.Thread(target=run, name=f"rlvr-reward-{name}", daemon=True).start()
    if not done.wait(timeout_s):
        raise _Timeout
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def _warn_timeout(name: str, n: int, timeout_s: float) -> None:
    """One line, the first time a function's call runs past the deadline."""
    if name in _WARNED:
        return
    _WARNED.add(name)
    warn(
        f"reward function {name} ran past --grpo.verify-timeout-s ({timeout_s:g} s) on {n} "
        f"completions: they score 0 (counted in verifier/{name}/timeout; its thread runs on "
        "unwatched); not reported again"
    )


def total_rewards(
    reward_fns: Sequence[RewardFn],
    weights: Sequence[float],
    prompts: list[str],
    completions: list[str],
    columns: dict[str, list],
    *,
    timeout_s: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted sum of `reward_fns(prompts, completions, **columns)`: [N] float tensor.

    `None` (not applicable) counts as 0. A function that raises, returns the wrong number of
    values or a non-finite value scores 0 for the affected rows and is counted in
    `reward/errors`; the run goes on. Each function's mean over the N completions is reported
    as `reward/<name>`. A function with a `reason_counts(reset=...)` attribute (the math
    verifier) also reports its verdicts of this call by reason as `verifier/<name>/<reason>`
    (its own timeouts among them).

    ``timeout_s`` > 0 bounds each function's call (module docstring): a call still running
    after ``timeout_s`` seconds scores 0 for all N completions, which are added to
    `verifier/<name>/timeout` (reported, 0 or more, for every function while the bound is on)
    and not to `reward/errors`; its reason counts are not reported (the call is unfinished).
    0 calls each function in this thread, unbounded.
    """
    n = len(completions)
    total = torch.zeros(n)
    metrics: dict[str, float] = {}
    errors = 0
    for fn, weight in zip(reward_fns, weights, strict=True):
        name = getattr(fn, "__name__", type(fn).__name__)
        counts = getattr(fn, "reason_counts", None)
        if callable(counts):
            counts(reset=True)  # forget verdicts from outside this call (e.g. evaluation)
        timed_out = False
        try:
            values = _call(fn, name, timeout_s, prompts, completions, columns)
            if len(values) != n:
                raise ValueError(f"{name} returned {len(values)} rewards for {n} completions")
        except _Timeout:
            values, timed_out = [None] * n, True
            _warn_timeout(name, n, timeout_s)
        except Exception:  # a verifier must never kill the run: score 0 and count it
            values, errors = [None] * n, errors + n
        clean = []
        for v in values:
            ok = v is None or (isinstance(v, (int, float)) and math.isfinite(v))
            errors += not ok
            clean.append(float(v) if ok and v is not None else 0.0)
        scores = torch.tensor(clean)
        metrics[f"reward/{name}"] = scores.mean().item()
        if callable(counts) and not timed_out:
            for reason, count in counts(reset=True).items():
                metrics[f"verifier/{name}/{reason}"] = float(count)
        if timeout_s > 0:
            own = metrics.get(f"verifier/{name}/timeout", 0.0)
            metrics[f"verifier/{name}/timeout"] = float(n) if timed_out else own
        total += weight * scores
    metrics["reward/errors"] = float(errors)
    return total, metrics


def reward_columns(rows: list[dict[str, Any]]) -> dict[str, list]:
    """The keyword columns a reward function receives for per-completion `rows`: every field
    but "prompt" that any row has (in first-seen order), None where a row lacks it."""
    names = dict.fromkeys(k for r in rows for k in r if k != "prompt")
    return {k: [r.get(k) for r in rows] for k in names}
