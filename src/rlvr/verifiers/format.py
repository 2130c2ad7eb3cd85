"""Format reward: ``<think>reasoning</think>`` followed by a final answer; 1.0 or 0.0.

Policy
------
A completion is well formed when, ignoring surrounding whitespace, it is::

    <think> non-empty reasoning </think> non-empty final answer

  * Exactly one ``<think>`` and one ``</think>``. A second block, a nested or a stray tag
    anywhere scores 0 (reason ``extra_tags``): the answer must not be able to hide more
    reasoning, and the grader must not have to guess which block counts.
  * Nothing but whitespace before ``<think>`` (``text_before_think``).
  * An empty or whitespace-only reasoning scores 0 (``empty_reasoning``): this reward exists to
    ask for reasoning. (Qwen3's non-thinking mode emits ``<think>\\n\\n</think>`` and fails.)
  * An empty answer after ``</think>`` scores 0 (``no_answer``). What the answer says is the
    other verifiers' business; the format reward only checks that there is one.
  * No ``<think>`` at all is ``missing_think``; ``<think>`` without ``</think>`` (a truncated
    generation) is ``unclosed_think``.
  * When the prompt already ends with ``<think>`` (R1-style templates open the block for the
    model), the completion starts inside the reasoning: it must then contain no ``<think>``
    and exactly one ``</think>``. `format_reward` detects this from string prompts;
    conversational prompts (where the chat template adds the tag out of sight) need
    ``think_in_prompt=True``.

This module also owns the two helpers every verifier shares: `completion_text` (a TRL
completion, string or message list, as text) and `answer_text` (the completion with its
reasoning removed; what the math and tool verifiers grade).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "answer_text",
    "completion_text",
    "format_reward",
    "prompt_opens_think",
    "score",
    "verify",
]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def completion_text(completion: Any) -> str | None:
    """A plain string, or the last message's text of a TRL conversational completion.

    Multimodal content parts (``[{"type": "text", "text": ...}]``) are joined. None for
    anything else (bad input is graded 0 by the callers, never raised).
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content")
        if isinstance(content, list):
            content = "".join(
                part.get("text", "")
                for part in content
                if isinstance(part, dict) and isinstance(part.get("text", ""), str)
            )
        return content if isinstance(content, str) else None
    return None


def answer_text(completion: str) -> str | None:
    """The completion without its reasoning, or None for an unclosed ``<think>``.

    Every closed ``<think>...</think>`` block is removed. An orphan ``</think>`` (the opening
    tag was in the prompt) ends the reasoning: everything before it is dropped.
    """
    if THINK_OPEN not in completion and THINK_CLOSE not in completion:
        return completion
    kept: list[str] = []
    pos = 0
    while (opened := completion.find(THINK_OPEN, pos)) != -1:
        closed = completion.find(THINK_CLOSE, opened + len(THINK_OPEN))
        if closed == -1:
            break  # unclosed: keep the rest, "<think>" included
        kept.append(completion[pos:opened])
        pos = closed + len(THINK_CLOSE)
    kept.append(completion[pos:])
    text = "".join(kept)
    orphan_close = text.rfind(THINK_CLOSE)
    if orphan_close != -1:
        text = text[orphan_close + len(THINK_CLOSE) :]
    return None if THINK_OPEN in text else text


def _check(text: str, think_in_prompt: bool) -> str:
    opens, closes = text.count(THINK_OPEN), text.count(THINK_CLOSE)
    if think_in_prompt:
        if opens or closes > 1:
            return "extra_tags"
        if not closes:
            return "unclosed_think"
        reasoning, answer = text.split(THINK_CLOSE)
    else:
        if not opens:
            return "missing_think"
        if opens > 1 or closes > 1:
            return "extra_tags"
        if not closes:
            return "unclosed_think"
        if text.index(THINK_CLOSE) < text.index(THINK_OPEN):
            return "extra_tags"  # "</think> ... <think>": the close comes first
        before, rest = text.split(THINK_OPEN)
        if before.strip():
            return "text_before_think"
        reasoning, answer = rest.split(THINK_CLOSE)
    if not reasoning.strip():
        return "empty_reasoning"
    if not answer.strip():
        return "no_answer"
    return "ok"


def verify(completion: Any, answer: Any = None, *, think_in_prompt: bool = False) -> tuple:
    """(1.0 or 0.0, ``{"reason": ...}``); never raises. ``answer`` is accepted and ignored.

    Reasons: "ok", "missing_think", "unclosed_think", "extra_tags", "text_before_think",
    "empty_reasoning", "no_answer", "error" (not a completion).
    """
    text = completion_text(completion)
    if text is None:
        return 0.0, {"reason": "error"}
    reason = _check(text, bool(think_in_prompt))
    return (1.0 if reason == "ok" else 0.0), {"reason": reason}


def score(completion: Any, answer: Any = None, *, think_in_prompt: bool = False) -> float:
    """1.0 for ``<think>reasoning</think> answer`` (module docstring), else 0.0."""
    return verify(completion, answer, think_in_prompt=think_in_prompt)[0]


def prompt_opens_think(prompt: Any) -> bool:
    """Whether a string prompt ends with ``<think>`` (the completion starts inside it)."""
    return isinstance(prompt, str) and prompt.rstrip().endswith(THINK_OPEN)


def format_reward(
    prompts: list[Any],
    completions: list[Any],
    think_in_prompt: bool | None = None,
    **kwargs: Any,
) -> list[float]:
    """TRL reward function: the format score of each completion (no dataset column needed).

    ``think_in_prompt=None`` decides per row from the prompt: a string prompt ending with
    ``<think>`` means the completion starts inside the reasoning.
    """
    if prompts is not None and len(prompts) != len(completions):
        raise ValueError(f"{len(completions)} completions but {len(prompts)} prompts")
    rows = prompts if prompts is not None else [None] * len(completions)
    return [
        score(
            completion,
            think_in_prompt=prompt_opens_think(prompt)
            if think_in_prompt is None
            else think_in_prompt,
        )
        for prompt, completion in zip(rows, completions)
    ]
