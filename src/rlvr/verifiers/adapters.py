"""Every rlvr verifier as a TRL reward function and as a verl ``compute_score``.

The verifiers (`VERIFIERS`): ``"math"`` (strict, `rlvr.verifiers.math`), ``"tool"``
(`rlvr.verifiers.tool`), ``"format"`` (`rlvr.verifiers.format`) and ``"weak_math"`` (the
deliberately gameable `rlvr.verifiers.weak`).

TRL. ``GRPOTrainer`` calls each reward function as ``fn(prompts=..., completions=...,
completion_ids=..., **dataset_columns, trainer_state=...)`` and names it by ``fn.__name__``.
`TRLReward` (or `trl_reward`) is such a callable: it grades each completion against its row's
reference column (``answer`` unless told otherwise; ``format`` needs none) and returns floats,
or None (TRL's "not applicable") for a row whose reference is None.

verl. The reward managers call ``compute_score(data_source=..., solution_str=...,
ground_truth=..., extra_info=...)`` (naive) or positionally, in a process pool (prime). A dict
result gives the reward as ``score`` and logs every other key per sample, so the dict always has
the same keys and no None: ``{"score": float, "reason": str, "pred": str}`` (``pred`` is the
graded answer or called tool, "" when none; verl's validation uses it for majority votes).
`compute_score` picks the verifier per row: ``extra_info["verifier"]`` if given, else the
``data_source`` when it names a verifier, else math. `VerlScore` fixes one verifier and its
options; ``math_compute_score`` and friends are ready-made instances.

Pickling: `TRLReward` and `VerlScore` hold only a verifier name and plain options, so they
pickle by value and work in worker processes; the module-level functions pickle by reference.
A verifier that needs per-process state (tools for ``"tool"``) must have it registered in the
worker too, or be given it as an option (``TRLReward("tool", tools=[...])``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlvr.verifiers import format as format_verifier
from rlvr.verifiers import math as math_verifier
from rlvr.verifiers import tool as tool_verifier
from rlvr.verifiers import weak as weak_verifier

__all__ = [
    "VERIFIERS",
    "TRLReward",
    "VerlScore",
    "compute_score",
    "format_compute_score",
    "math_compute_score",
    "tool_compute_score",
    "trl_reward",
    "weak_math_compute_score",
]

# name -> the single-item verifier: (completion, reference, **options) -> (reward, parts)
VERIFIERS: dict[str, Callable[..., tuple[float, dict[str, Any]]]] = {
    "math": math_verifier.verify,
    "tool": tool_verifier.verify,
    "format": format_verifier.verify,
    "weak_math": weak_verifier.verify,
}
_NEEDS_NO_REFERENCE = {"format"}
_ACCEPTS_REFERENCE_LISTS = {"math", "weak_math"}  # any of several acceptable answers


def _check_name(verifier: str) -> str:
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r}; choose one of {sorted(VERIFIERS)}")
    return verifier


def _grade(
    verifier: str, completion: Any, reference: Any, prompt: Any, options: dict[str, Any]
) -> tuple[float, dict[str, Any]]:
    """One verdict; a list of references (math, weak_math) means any of them."""
    verify = VERIFIERS[verifier]
    if verifier == "format" and "think_in_prompt" not in options:
        options = {**options, "think_in_prompt": format_verifier.prompt_opens_think(prompt)}
    if verifier == "math" and "prompt" not in options:  # an echo of the prompt scores 0
        options = {**options, "prompt": prompt}
    if verifier in _ACCEPTS_REFERENCE_LISTS and isinstance(reference, (list, tuple)):
        verdicts = [verify(completion, item, **options) for item in reference]
        if not verdicts:
            return 0.0, {"reason": "error"}
        return max(verdicts, key=lambda verdict: verdict[0])
    return verify(completion, reference, **options)


class TRLReward:
    """A TRL reward function for one verifier: ``fn(prompts, completions, **columns)``.

    ``column`` names the dataset column holding each row's reference (None for ``format``);
    ``options`` go to the verifier (``marker=``, ``timeout_s=`` for math, ``tools=`` for tool,
    ``think_in_prompt=`` for format). ``name`` is what TRL logs (default ``<verifier>_reward``).
    """

    def __init__(
        self,
        verifier: str = "math",
        column: str | None = "answer",
        name: str | None = None,
        **options: Any,
    ) -> None:
        self.verifier = _check_name(verifier)
        self.column = None if verifier in _NEEDS_NO_REFERENCE else column
        self.options = options
        self.__name__ = name or f"{verifier}_reward"

    def __repr__(self) -> str:
        return f"TRLReward({self.verifier!r}, column={self.column!r}, name={self.__name__!r})"

    def __call__(
        self, prompts: list[Any] | None = None, completions: list[Any] | None = None, **kwargs: Any
    ) -> list[float | None]:
        completions = list(completions or [])
        if self.column is None:
            references: list[Any] = [None] * len(completions)
        elif self.column not in kwargs:
            raise KeyError(f"{self.__name__} needs the dataset column {self.column!r}")
        else:
            references = list(kwargs[self.column])
        rows = list(prompts) if prompts is not None else [None] * len(completions)
        if not len(completions) == len(references) == len(rows):
            raise ValueError(
                f"{self.__name__}: {len(completions)} completions, {len(references)} "
                f"references, {len(rows)} prompts"
            )
        rewards: list[float | None] = []
        for prompt, completion, reference in zip(rows, completions, references):
            if reference is None and self.column is not None:
                rewards.append(None)  # TRL: not applicable to this row
            else:
                reward, _ = _grade(self.verifier, completion, reference, prompt, self.options)
                rewards.append(float(reward))
        return rewards


def trl_reward(verifier: str = "math", **kwargs: Any) -> TRLReward:
    """`TRLReward` for ``verifier`` (see its arguments)."""
    return TRLReward(verifier, **kwargs)


def _verl_result(reward: float, parts: dict[str, Any]) -> dict[str, Any]:
    pred = parts.get("extracted") or parts.get("tool") or ""
    return {"score": float(reward), "reason": str(parts.get("reason", "error")), "pred": str(pred)}


class VerlScore:
    """A verl ``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` for one
    verifier (None: choose per row, as `compute_score` does) with fixed options."""

    def __init__(self, verifier: str | None = "math", **options: Any) -> None:
        self.verifier = verifier if verifier is None else _check_name(verifier)
        self.options = options

    def __repr__(self) -> str:
        return f"VerlScore({self.verifier!r})"

    def __call__(
        self,
        data_source: Any = None,
        solution_str: Any = None,
        ground_truth: Any = None,
        extra_info: Any = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        verifier = self.verifier or _verifier_for(data_source, extra_info)
        try:
            reward, parts = _grade(verifier, solution_str, ground_truth, None, self.options)
        except Exception:  # the verifiers never raise; this guards bad options
            reward, parts = 0.0, {"reason": "error"}
        return _verl_result(reward, parts)


def _verifier_for(data_source: Any, extra_info: Any) -> str:
    if isinstance(extra_info, dict) and extra_info.get("verifier") in VERIFIERS:
        return str(extra_info["verifier"])
    if isinstance(data_source, str) and data_source in VERIFIERS:
        return data_source
    return "math"


def compute_score(
    data_source: Any = None,
    solution_str: Any = None,
    ground_truth: Any = None,
    extra_info: Any = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """verl's custom reward function: ``{"score", "reason", "pred"}`` (module docstring).

    Point verl at it with ``custom_reward_function.path=<this file>`` and
    ``custom_reward_function.name=compute_score``.
    """
    return VerlScore(None)(data_source, solution_str, ground_truth, extra_info)


math_compute_score = VerlScore("math")
tool_compute_score = VerlScore("tool")
format_compute_score = VerlScore("format")
weak_math_compute_score = VerlScore("weak_math")
