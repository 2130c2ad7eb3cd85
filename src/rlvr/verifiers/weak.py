"""A DELIBERATELY WEAK math verifier, for demonstrations of reward hacking. Never train on it.

Reward 1.0 when the reference answer's text occurs anywhere in the completion, else 0.0. It
is gameable, and that is its purpose: RL finds every way to collect a reward that the grader
allows, and this grader allows many.

  * It reads the reasoning too: "maybe 824, maybe 825, maybe 826" earns the reward for any of
    them. A policy learns to list candidates instead of committing to one.
  * It matches substrings: "1825" contains "825", "8250" contains "825"; a long enough string
    of digits contains every short answer ("0123456789" covers every one-digit answer).
  * It has no notion of a final answer: a wrong boxed answer next to the right number in the
    text still scores 1.0, and so does copying the prompt when the answer appears in it.
  * It has no notion of value: "1/2" is not found for the reference "0.5".

The strict verifier (`rlvr.verifiers.math`) closes each of these; running the same training
with both shows the difference between a reward that measures and one that is merely met.
"""

from __future__ import annotations

from typing import Any

from rlvr.verifiers.format import completion_text

__all__ = ["score", "verify", "weak_math_reward"]


def verify(completion: Any, answer: Any) -> tuple[float, dict[str, Any]]:
    """(1.0 if ``str(answer)`` occurs in the completion, else 0.0, ``{"reason": ...}``).

    Reasons: "found", "not_found", "error" (not a completion, or an empty reference).
    """
    text = completion_text(completion)
    reference = str(answer).strip() if isinstance(answer, (str, int, float)) else ""
    if text is None or not reference or isinstance(answer, bool):
        return 0.0, {"reason": "error"}
    found = reference in text
    return (1.0 if found else 0.0), {"reason": "found" if found else "not_found"}


def score(completion: Any, answer: Any) -> float:
    """1.0 if the reference's text occurs anywhere in the completion (gameable; see above)."""
    return verify(completion, answer)[0]


def weak_math_reward(
    prompts: list[Any], completions: list[Any], answer: list[Any], **kwargs: Any
) -> list[float]:
    """TRL reward function, column ``answer``: the gameable substring match (module docstring)."""
    if len(completions) != len(answer):
        raise ValueError(f"{len(completions)} completions but {len(answer)} answers")
    return [score(completion, reference) for completion, reference in zip(completions, answer)]
