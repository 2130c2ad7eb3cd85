"""Strict math verifier: one final answer, compared exactly, reward 1.0 or 0.0.

Grading policy
--------------
Reasoning is never graded.
  * ``<think>...</think>`` blocks are removed. An orphan ``</think>`` (the opening tag was in
    the prompt, as in R1-style templates) ends the reasoning: everything before it is dropped.
  * An unclosed ``<think>`` means no answer was given (reason ``unclosed_think``).

The final answer is the last explicit one.
  * Candidates are every ``\\boxed{...}`` / ``\\fbox{...}`` (brace-balanced, nested braces and
    escaped ``\\{ \\}`` allowed) and every occurrence of the task marker (default ``####``).
    A marker's answer runs to the end of its line, or to the next candidate on that line.
    A marker followed on its line by nothing but a box (``#### \\boxed{5}``) only introduces
    that box. Markers inside a box are ignored. An answer on the line *after* a bare marker
    does not count.
  * The candidate that starts last wins, so a self-correction on a later line counts.
  * Numbers in the text without a marker or a box are not answers (reason ``no_answer``); so is
    an empty box or empty marker, and a box left unclosed (truncated generation).

Several different final answers score 0 (reason ``hedged``).
  * Conflict: the line holding the winning candidate holds another non-empty candidate with a
    different value (``\\boxed{3} \\boxed{4}``, ``\\boxed{3} #### 4``, ``#### 3 #### 4``).
    Equal values (``\\boxed{4} #### 4.0``) are fine.
  * Hedge words in the answer: `` or ``, ``±``, ``∓``, ``\\pm``, ``\\mp``, unless the reference
    itself contains them.
  * When the reference is a single value (no ``,`` or ``;``): two numbers separated only by
    ``,``, ``;``, whitespace or `` and `` (``3, 4``, ``3;4``, ``825 826``). Plain spaces are
    not thousands separators.

Comparison.
  * Normalization, applied to both sides: full-width digits/signs to ASCII, unicode minus to
    ``-``, ``$`` / ``\\(`` / ``\\)`` / ``**`` delimiters and a trailing period removed, a lone
    ``\\text{}``/``\\mathrm{}``/``{}`` wrapper unwrapped, thousands separators removed
    (``,``, ``\\,``, ``{,}``, thin spaces; groups of exactly three digits).
  * Unless the reference is itself an equation, an answer ``lhs = rhs`` is graded on the text
    after its last bare ``=`` (``x = 5``, ``357+468=825``); a plain number on an earlier side
    that differs from a plain-number last side is a hedge (``824 = 825``).
  * Fast path: both sides plain decimal literals (optional sign, point, exponent) are compared
    exactly as ``Decimal`` values, without sympy.
  * Otherwise, if the reference is a plain number, an answer with a binary arithmetic operator
    (``+ - * ^ × · ÷ \\times \\cdot \\div``) is not an evaluated answer (reason ``unevaluated``);
    this stops echoing the question (``#### 357+468``) from earning reward.
  * Otherwise ``math_verify.parse`` + ``math_verify.verify`` decide, with the answer text alone
    wrapped in ``\\boxed{}`` (never a search through the completion). An answer with free
    symbols never matches a reference without them. Answers longer than 1000 characters are
    wrong. math-verify gets 3 s signal.alarm timeouts on the main thread and none elsewhere
    (signals only work there).
"""

from __future__ import annotations

import re
import threading
from bisect import bisect_right
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

__all__ = ["extract_final_answer", "math_reward", "score", "verify"]

Completion = str | list[dict[str, Any]]

_MATH_VERIFY_TIMEOUT_S = 3
_MAX_SYMBOLIC_ANSWER_CHARS = 1000

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")

_UNICODE_TO_ASCII = str.maketrans(
    {
        **{chr(0xFF10 + d): str(d) for d in range(10)},
        "\uff0b": "+",  # full-width plus
        "\uff0d": "-",  # full-width hyphen-minus
        "\u2212": "-",  # minus sign
        "\uff0e": ".",
        "\uff0c": ",",
        "\uff1b": ";",
        "\u2009": "\\,",  # thin space: a thousands separator like LaTeX \,
        "\u202f": "\\,",  # narrow no-break space
        "\u00a0": " ",
    }
)
_OUTER_MATH_DELIMITERS = re.compile(r"^\\[\[(]|\\[\])]$")
_LONE_WRAPPER = re.compile(r"^(?:\\(?:text|textbf|mathrm|mathbf|boxed|fbox)\s*)?\{([^{}]*)\}$")
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:(?:,|\\,|\{,\})\d{3})+(?!\d)")
_THOUSANDS_SEPARATOR = re.compile(r",|\\,|\{,\}")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_BARE_EQUALS = re.compile(r"(?<![<>!=:\\])=(?!=)")
_HEDGE_WORDS = re.compile(r"\bor\b|±|∓|\\pm(?![a-zA-Z])|\\mp(?![a-zA-Z])", re.IGNORECASE)
_NUMBER_LIST = re.compile(r"\d(?:\s*[,;]\s*|\s+and\s+|\s+)[-+]?\.?\d", re.IGNORECASE)
_BINARY_OPERATOR = re.compile(r"[\w.})\]]\s*(?:[-+*^×·÷]|\\times|\\cdot|\\div|\\ast)")
_UNESCAPED_PERCENT = re.compile(r"(?<!\\)%")


def _strip_delimiters(text: str) -> str:
    """Drop math delimiters, markdown emphasis/code marks and a trailing period."""
    text = text.replace("\\$", "").replace("$", "").strip()
    text = _OUTER_MATH_DELIMITERS.sub("", text).strip()
    return text.strip("*`").strip().rstrip(".").strip()


def _normalize(text: str) -> str:
    """Canonical text of one answer (see the module docstring, "Comparison")."""
    text = _strip_delimiters(text.translate(_UNICODE_TO_ASCII))
    for _ in range(3):  # \text{\boxed{5}} and the like; bounded.
        unwrapped = _LONE_WRAPPER.sub(r"\1", text).strip()
        if unwrapped == text:
            break
        text = unwrapped
    return _THOUSANDS.sub(lambda m: _THOUSANDS_SEPARATOR.sub("", m.group()), text)


def _as_decimal(normalized: str) -> Decimal | None:
    """The exact value of a plain decimal literal, else None."""
    compact = "".join(normalized.split())
    if not _PLAIN_NUMBER.fullmatch(compact):
        return None
    try:
        return Decimal(compact)
    except InvalidOperation:
        return None


def _comparison_key(answer: str) -> Decimal | str:
    """What makes two candidates "the same answer": value if numeric, else spaceless text."""
    normalized = _normalize(answer)
    value = _as_decimal(normalized)
    return value if value is not None else "".join(normalized.split())


def _find_boxes(text: str) -> list[tuple[int, int, str | None]]:
    """Top-level ``\\boxed{}``/``\\fbox{}``: (start, end, content); content None if unclosed."""
    boxes: list[tuple[int, int, str | None]] = []
    pos = 0
    while match := _BOX_OPEN.search(text, pos):
        depth, i = 1, match.end()
        while i < len(text) and depth:
            char = text[i]
            if char == "\\":
                i += 1  # skip the escaped character (\{ and \} are not grouping braces)
            elif char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
            i += 1
        if depth:
            boxes.append((match.start(), len(text), None))
            break
        boxes.append((match.start(), i, text[match.end() : i - 1]))
        pos = i
    return boxes


def _graded_text(completion: str) -> str | None:
    """The completion without its reasoning, or None for an unclosed ``<think>``."""
    if _THINK_OPEN not in completion and _THINK_CLOSE not in completion:
        return completion
    kept: list[str] = []
    pos = 0
    while (opened := completion.find(_THINK_OPEN, pos)) != -1:
        closed = completion.find(_THINK_CLOSE, opened + len(_THINK_OPEN))
        if closed == -1:
            break  # unclosed: keep the rest, "<think>" included
        kept.append(completion[pos:opened])
        pos = closed + len(_THINK_CLOSE)
    kept.append(completion[pos:])
    text = "".join(kept)
    orphan_close = text.rfind(_THINK_CLOSE)
    if orphan_close != -1:
        text = text[orphan_close + len(_THINK_CLOSE) :]
    return None if _THINK_OPEN in text else text


def _locate_final_answer(completion: str, marker: str) -> tuple[str | None, str]:
    """(final answer, status); status is "ok", "no_answer", "unclosed_think" or "hedged"."""
    text = _graded_text(completion)
    if text is None:
        return None, "unclosed_think"
    boxes = _find_boxes(text)
    if boxes and boxes[-1][2] is None:
        return None, "no_answer"
    box_starts = [start for start, _, _ in boxes]
    markers: list[int] = []
    if marker:
        pos = 0
        while (found := text.find(marker, pos)) != -1:
            enclosing = bisect_right(box_starts, found) - 1
            if enclosing < 0 or found >= boxes[enclosing][1]:  # not inside a box
                markers.append(found)
            pos = found + len(marker)
    starts = sorted(box_starts + markers)
    box_start_set = set(box_starts)

    candidates = [(start, content) for start, _, content in boxes if content is not None]
    for found in markers:
        following = bisect_right(starts, found)
        next_start = starts[following] if following < len(starts) else len(text)
        line_end = text.find("\n", found, next_start)  # bounded: linear over all markers
        answer_end = next_start if line_end == -1 else line_end
        answer = text[found + len(marker) : answer_end]
        introduces_box = line_end == -1 and next_start in box_start_set
        if not _strip_delimiters(answer) and introduces_box:
            continue  # "#### \boxed{5}": the marker only introduces the box
        candidates.append((found, answer))
    if not candidates:
        return None, "no_answer"
    candidates.sort()

    last_start, last_answer = candidates[-1]
    final_line_start = text.rfind("\n", 0, last_start) + 1
    final_line = [a for s, a in candidates if s >= final_line_start and _strip_delimiters(a)]
    if len({_comparison_key(a) for a in final_line}) > 1:
        return None, "hedged"
    answer = _strip_delimiters(last_answer)
    return (answer, "ok") if answer else (None, "no_answer")


def extract_final_answer(completion: str, marker: str = "####") -> str | None:
    """The completion's single final answer (module docstring), or None if there is none.

    None also for an unclosed ``<think>`` and for conflicting answers on the final line. Hedges
    inside one answer ("3 or 4") are returned as is: `verify` judges them against the reference.
    """
    if not isinstance(completion, str) or not isinstance(marker, str):
        return None
    return _locate_final_answer(completion, marker)[0]


def _completion_text(completion: Any) -> str | None:
    """A plain string, or the last message's content of a TRL conversational completion."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content")
        if isinstance(content, list):  # multimodal content parts
            content = "".join(
                part.get("text", "")
                for part in content
                if isinstance(part, dict) and isinstance(part.get("text", ""), str)
            )
        return content if isinstance(content, str) else None
    return None


def _reference_text(answer: Any) -> str | None:
    if isinstance(answer, str):
        return answer
    if isinstance(answer, (int, float, Decimal)) and not isinstance(answer, bool):
        return str(answer)
    return None


def _split_equation(text: str) -> tuple[list[str], str]:
    """(sides before the last bare ``=``, text after it); ([], text) without ``=``."""
    parts = _BARE_EQUALS.split(text)
    return [p.strip() for p in parts[:-1]], parts[-1].strip()


def _hedge_in(answer: str, reference: str) -> bool:
    """Whether one answer text offers several values (module docstring, "hedged")."""
    hedge = _HEDGE_WORDS.search(answer)
    if hedge and not _HEDGE_WORDS.search(reference):
        return True
    single_value_reference = "," not in reference and ";" not in reference
    return single_value_reference and bool(_NUMBER_LIST.search(answer))


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@lru_cache(maxsize=4096)
def _parse_boxed(expression: str, timeout_s: int | None) -> tuple[Any, ...]:
    from math_verify import parse

    latex = "\\boxed{" + _UNESCAPED_PERCENT.sub(r"\\%", expression) + "}"
    return tuple(parse(latex, parsing_timeout=timeout_s))


def _first_sympy(parsed: tuple[Any, ...]) -> Any:
    return next((p for p in parsed if hasattr(p, "free_symbols")), None)


def _symbolic_match(answer: str, reference: str) -> bool | None:
    """math-verify equality; None when the reference does not parse to a sympy object."""
    from math_verify import verify as math_verify_equal

    timeout_s = _MATH_VERIFY_TIMEOUT_S if _on_main_thread() else None
    gold = _parse_boxed(reference, timeout_s)
    gold_expr = _first_sympy(gold)
    if gold_expr is None:
        return None
    if len(answer) > _MAX_SYMBOLIC_ANSWER_CHARS:
        return False
    predicted = _parse_boxed(answer, timeout_s)
    predicted_expr = _first_sympy(predicted)
    if not gold_expr.free_symbols and (predicted_expr is None or predicted_expr.free_symbols):
        return False  # a free symbol (or unparsable text) never equals a number
    return bool(math_verify_equal(list(gold), list(predicted), timeout_seconds=timeout_s))


def _grade(completion: Any, answer: Any, marker: str, parts: dict[str, Any]) -> float:
    text, reference = _completion_text(completion), _reference_text(answer)
    if text is None or reference is None or not isinstance(marker, str):
        return 0.0  # reason stays "error"
    extracted, status = _locate_final_answer(text, marker)
    parts["extracted"] = extracted
    if extracted is None:
        parts["reason"] = status
        return 0.0
    gold = _normalize(reference)
    if not gold:
        return 0.0
    predicted = _normalize(extracted)
    left_sides: list[str] = []
    if not _BARE_EQUALS.search(gold):
        left_sides, predicted = _split_equation(predicted)
    if not predicted:
        parts["reason"] = "no_answer"
        return 0.0
    predicted_value = _as_decimal(predicted)
    left_values = {_as_decimal(side) for side in left_sides} - {None}
    if _hedge_in(predicted, gold) or (
        predicted_value is not None and left_values - {predicted_value}
    ):
        parts["reason"] = "hedged"  # "3 or 4", "3, 4", or "824 = 825"
        return 0.0

    gold_value = _as_decimal(gold)
    if gold_value is not None and predicted_value is not None:
        parts["method"] = "exact"
        correct = gold_value == predicted_value
    elif gold_value is not None and _BINARY_OPERATOR.search(predicted):
        parts["reason"] = "unevaluated"
        return 0.0
    else:
        parts["method"] = "math_verify"
        match = _symbolic_match(predicted, gold)
        if match is None:
            return 0.0  # unparsable reference: "error"
        correct = match
    parts["reason"] = "correct" if correct else "wrong"
    return 1.0 if correct else 0.0


def verify(completion: Completion, answer: str, marker: str = "####") -> tuple[float, dict]:
    """Reward and its breakdown: ``{"extracted", "reason", "method"}``; never raises.

    ``reason`` is one of "correct", "wrong", "no_answer", "hedged", "unclosed_think",
    "unevaluated" or "error" (bad input, unparsable reference, internal failure); ``method``
    is "exact", "math_verify" or None when no comparison ran.
    """
    parts: dict[str, Any] = {"extracted": None, "reason": "error", "method": None}
    try:
        reward = _grade(completion, answer, marker, parts)
    except Exception:
        reward = 0.0
        parts["reason"] = "error"
    except BaseException as exc:  # math-verify's TimeoutException derives from BaseException
        if not type(exc).__module__.startswith("math_verify"):
            raise
        reward = 0.0
        parts["reason"] = "error"
    return reward, parts


def score(completion: Completion, answer: str, marker: str = "####") -> float:
    """1.0 if the completion's single final answer equals ``answer``, else 0.0; never raises."""
    return verify(completion, answer, marker)[0]


def math_reward(
    prompts: list[str] | list[list[dict[str, Any]]],
    completions: list[str] | list[list[dict[str, Any]]],
    answer: list[str],
    **kwargs: Any,
) -> list[float]:
    """TRL reward function (``fn(prompts, completions, **columns)``, column ``answer``).

    Completions may be strings or conversational message lists (the last message is graded).
    """
    if len(completions) != len(answer):
        raise ValueError(f"{len(completions)} completions but {len(answer)} answers")
    pairs = zip(completions, answer, strict=True)
    return [score(completion, reference) for completion, reference in pairs]
