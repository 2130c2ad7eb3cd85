"""Exact-match verifier for word answers: one final answer, normalised, equal to the reference.

For answers that are not numbers (``True``, ``son``, ``noremopyh``, ``1 0 1\\n0 1 0``), where
the math verifier's numeric comparison does not apply and a substring match would be
gameable. Reward 1.0 or 0.0.

Policy
------
  * The final answer is located exactly as the strict math verifier locates it
    (`rlvr.verifiers.math.extract_final_answer`): the last ``#### ...`` (to the end of its
    line) or ``\\boxed{...}``; ``<think>`` blocks are removed and never graded. A completion
    with no such answer scores 0 (reason ``no_answer``), and so does a spray of different
    final answers (``#### cat #### dog``): there is no single final answer. An unclosed
    ``<think>`` is ``unclosed_think``.
  * Both sides are normalised (`normalize`): case folded; surrounding whitespace, a trailing
    period and surrounding quotes (``" ' ` “” ‘’``) or ``$`` removed (repeatedly, so
    ``"Yes."`` and ``$x$.`` unwrap); every inner run of whitespace, newlines included, becomes
    one space (so a multi-line grid reference matches the same cells written on one line).
  * Then they must be equal. Nothing else is forgiven: ``cat or dog``, ``cats`` and
    ``the answer is cat`` are wrong for ``cat``.

Every verdict is counted by reason (`reason_counts`), as the math verifier counts its own.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from typing import Any

from rlvr.verifiers.format import answer_text, completion_text
from rlvr.verifiers.math import extract_final_answer

__all__ = ["REASONS", "exact_reward", "normalize", "reason_counts", "score", "verify"]

REASONS = ("correct", "wrong", "no_answer", "unclosed_think", "error")
REASON_COUNTS: Counter[str] = Counter()
_COUNTS_LOCK = threading.Lock()

_WRAPPERS = {'"': '"', "'": "'", "`": "`", "\u201c": "\u201d", "\u2018": "\u2019", "$": "$"}
_MAX_UNWRAP_ROUNDS = 4  # '"Yes."' needs two; bounded so a pathological string stays cheap


def normalize(text: str) -> str:
    """The comparison form of one answer (module docstring): unwrapped, one-spaced, casefolded."""
    for _ in range(_MAX_UNWRAP_ROUNDS):
        before = text
        text = text.strip()
        if text.endswith("."):
            text = text[:-1].rstrip()
        if len(text) >= 2 and _WRAPPERS.get(text[0]) == text[-1]:
            text = text[1:-1]
        if text == before:
            break
    return " ".join(text.split()).casefold()


def verify(completion: Any, answer: Any, marker: str = "####") -> tuple[float, dict[str, Any]]:
    """(1.0 if the completion's single final answer equals ``answer`` after `normalize`, else
    0.0, ``{"extracted", "reason"}``); never raises. ``reason`` is one of `REASONS`; "error"
    is bad input (not a completion, a reference that is not a non-empty string)."""
    parts: dict[str, Any] = {"extracted": None, "reason": "error"}
    reward = 0.0
    text = completion_text(completion)
    if text is not None and isinstance(answer, str) and normalize(answer):
        if answer_text(text) is None:
            parts["reason"] = "unclosed_think"
        elif (extracted := extract_final_answer(text, marker)) is None:
            parts["reason"] = "no_answer"
        else:
            parts["extracted"] = extracted
            correct = normalize(extracted) == normalize(answer)
            parts["reason"] = "correct" if correct else "wrong"
            reward = 1.0 if correct else 0.0
    with _COUNTS_LOCK:
        REASON_COUNTS[parts["reason"]] += 1
    return reward, parts


def score(completion: Any, answer: Any, marker: str = "####") -> float:
    """1.0 if the completion's single final answer equals ``answer`` (normalised), else 0.0."""
    return verify(completion, answer, marker)[0]


def reason_counts(reset: bool = False) -> dict[str, int]:
    """A snapshot of this process's verdicts by reason since the last reset; optionally reset."""
    with _COUNTS_LOCK:
        snapshot = dict(REASON_COUNTS)
        if reset:
            REASON_COUNTS.clear()
    return snapshot


def exact_reward(
    prompts: list[Any], completions: list[Any], answer: list[Any], **kwargs: Any
) -> list[float]:
    """TRL reward function (``fn(prompts, completions, **columns)``, column ``answer``)."""
    if len(completions) != len(answer):
        raise ValueError(f"{len(completions)} completions but {len(answer)} answers")
    return [score(c, a) for c, a in zip(completions, answer, strict=True)]


# the trainer logs verdicts by reason per step through this attribute (tasks/rewards.py)
exact_reward.reason_counts = reason_counts  # type: ignore[attr-defined]


def _after_fork_in_child() -> None:
    """In a forked child: a fresh counts lock (one held by another thread at fork stays held)."""
    global _COUNTS_LOCK
    _COUNTS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
