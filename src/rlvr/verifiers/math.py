"""Strict math verifier: one final answer, compared mathematically, reward 1.0 or 0.0.

Grading policy (docs/verifiers.md has it as one table)
-----------------------------------------------------
Finding the answer is `rlvr.verifiers.math_extract` (math-verify's ``parse``; this module is
its ``verify``), whose docstring has those rules: reasoning is never graded (an unclosed
``<think>`` is reason ``unclosed_think``), the final answer is the last explicit one (a box,
the task marker or an answer phrase; none is ``no_answer``), and a spray of different final
answers is ``hedged``. This module grades the answer it finds.

Several different final answers score 0 (reason ``hedged``).
  * A spray: the final group of candidates holds two different values
    (`rlvr.verifiers.math_extract`).
  * Hedge words in the answer: `` or ``, ``±``, ``∓``, ``\\pm``, ``\\mp`` (``72 \\pm 1``),
    unless the reference itself lists several values; an answer that opens with "probably",
    "about", "approximately", "between", "not", "at least", ... .
  * When the reference is a single value (no ``,``, ``;``, inequality, set, interval or
    matrix): two numbers separated only by ``,``, ``;``, whitespace or `` and `` (``3, 4``,
    ``825 826``; plain spaces are not thousands separators; ``\\log_3 27`` is one value), and
    any answer that is a collection of values: a set, tuple or interval with more than one
    element, an inequality, ``x \\in [2, 4]``. A set or interval that merely contains the
    answer is not the answer. A one-element set ``\\{5\\}`` is 5.
  * When the reference lists several values (``3, -3``, ``\\pm 3``), the answer's ``\\pm`` and
    its "or"/"and" are read as a list of the same values (`rlvr.verifiers.math_forms`):
    ``x = \\pm 3`` and ``x = 3 or x = -3`` match ``-3, 3``.

Comparison.
  * Normalization, both sides (`math_extract.normalize`): full-width characters to ASCII, unicode
    minus signs to ``-``, ``× · ÷ π ∞ √ ² ³ °`` to LaTeX; ``$`` / ``\\(`` / ``\\)`` / ``**``
    delimiters and a trailing period removed; a lone ``\\text{}``/``\\mathrm{}``/``{}`` wrapper
    unwrapped; thousands separators removed (``,``, ``\\,``, ``{,}``, thin spaces; groups of exactly
    three digits); the words ``pi``, ``inf``/``infinity``/``oo`` read as π and ∞; ``∅``,
    ``\\varnothing`` and ``\\{\\}`` as ``\\emptyset``; vulgar fractions (``¾``, ``2½``) and
    repeating decimals (``0.\\overline{6}`` = 2/3; a written-out ``0.666`` is not) as exact
    fractions; parentheses around the whole answer dropped (``((5))``); a multiple-choice label with
    its option text (``(C) 12``) read as the letter when the reference is one.
  * Equations: unless the reference is itself an equation, an answer ``lhs = rhs`` is graded
    on the text after its last bare ``=`` (``x = 5``, ``357+468=825``, ``(a, b) = (2, 5)``);
    a plain number on an earlier side that differs from the last side (or, when the last side
    is an expression, from the reference) is a hedge (``824 = 825``, ``824 = 357+468``). A
    list of equations (``x=1, x=2``) is graded whole, as the set of its values.
  * Units: a trailing unit (``5 cm``, ``5\\text{ cm}``, ``5 \\text{apples}``, ``90^\\circ``,
    ``€5``, ``5 square feet``) is split from the value. If both sides carry one, they must be
    the same unit (spellings are unified: ``cm`` = ``centimeters``, ``ft^2`` = ``sq ft``);
    ``5 m`` for ``5 cm`` is wrong (no conversions). A bare number matches a reference with a
    unit, and an answer's unit is not judged when the reference has none. ``$`` is a math
    delimiter, so a dollar sign is never a unit. A label of plain words after a space or a
    ``\\text{}`` label counts as a unit too (``5 apples`` vs ``5 oranges`` is wrong); a known
    unit may touch the number (``5cm``) unless it is one letter (``5m`` stays 5·m). A unit
    word after a value with a variable in it is a variable (``\\frac{1}{2} b h``: h is the
    height, not hours; math-verify's own unit stripping is off). A trailing ``\\text{(...)}``
    remark is dropped.
  * Percent: ``p%`` matches a reference ``r`` without ``%`` when ``p = r`` or ``p/100 = r``
    (data sets write "what percent" answers both ways: ``50\\%`` matches 50 and 0.5); two
    percentages compare their numbers. So ``0.5\\%`` also matches 0.5: a documented leniency.
  * Scientific notation: ``3e8``, ``3E+8``, ``3\\times10^8``, ``3 \\cdot 10^{8}``,
    ``10^{8}`` are plain numbers.
  * Fast path: both sides plain decimal literals (optional sign, point, exponent) are compared
    exactly as ``Decimal`` values, without sympy (microseconds; the lab's integer answers).
  * Echoes: when the prompt is known (`math_reward` passes each row's; ``verify(...,
    prompt=...)``), an answer with a binary arithmetic operator (``+ - * ^ × · ÷ \\times
    \\cdot \\div``) for a numeric reference that restates the prompt (its text is in the
    prompt, or it is arithmetic on two or more numbers that all appear there:
    ``#### 468+357`` for "357+468=") scores 0 (reason ``unevaluated``); without the prompt, the
    completion's own questions stand in for it (``357+468=825? #### 357+468``). Any other expression
    is evaluated by the symbolic comparison under its time limit: ``2^{6}`` for 64,
    ``\\log_3 27`` for 3, ``e^{i\\pi}+2`` for 1 (``i`` is the imaginary unit), ``5+6+7`` for 18,
    a definite integral, a closed form for a reference written as a series.
  * Otherwise math-verify decides, on the answer text alone wrapped in ``\\boxed{}`` (never a
    search through the completion), with three corrections: decimals are exact (every float
    becomes the rational it spells, so ``0.333333`` is not 1/3 and ``3.14159`` is not π;
    math-verify rounds to 6 places); an answer with a free symbol never matches a reference
    without one; infinity (or 1/0, NaN) never matches a finite reference. Sets compare
    unordered; tuples, intervals and matrices ordered; ``x > 2`` matches ``(2, \\infty)`` and
    ``2 \\le x \\le 7`` matches ``[2, 7]``; a column or row vector matches the tuple of its
    entries.
    Answers longer than 1000 characters are wrong.
  * Time limit: the symbolic comparison runs in a persistent worker process (pure Python plus
    sympy; a 4 GiB address-space limit), never in the caller, so the limit holds on any
    thread and inside worker processes (math-verify's own ``signal.alarm`` only works on the
    main thread). The worker interrupts itself at 80% of ``timeout_s`` (default 3 s); at the
    full limit the caller kills it and starts a new one on the next call. Either way the
    answer scores 0 with reason ``timeout``.
  * An answer math-verify cannot parse is ``unparsable``; an unparsable or empty reference is
    ``error`` (a data problem, counted apart from the model's mistakes).

Every verdict is counted by reason in `REASON_COUNTS` (per process; see `reason_counts`).
`explain` says which of these rules decided, one step a line (``rlvr verify --explain``).
"""

from __future__ import annotations

import os
import re
import threading
from collections import Counter
from decimal import Decimal
from numbers import Real
from typing import Any

from rlvr.verifiers.answer_phrases import hedge_opening
from rlvr.verifiers.format import completion_text
from rlvr.verifiers.math_extract import (
    ASSIGNMENT,
    LATEX_COMMAND,
    PLAIN_NUMBER,
    UNICODE_TO_ASCII,
    as_decimal,
    extract_final_answer,
    locate_final_answer,
    normalize,
    note,
    split_quantity,
)
from rlvr.verifiers.math_forms import as_value_list
from rlvr.verifiers.math_symbolic import (
    SymbolicTimeout,
    SymbolicUnavailable,
    symbolic_verdict,
    warm_up,
)

__all__ = [
    "REASONS",
    "REASON_COUNTS",
    "TIMEOUT_S",
    "explain",
    "extract_final_answer",
    "math_reward",
    "reason_counts",
    "score",
    "verify",
    "warm_up",
]

Completion = str | list[dict[str, Any]]

REASONS = (
    "correct",
    "wrong",
    "no_answer",
    "hedged",
    "unclosed_think",
    "unevaluated",
    "unparsable",
    "timeout",
    "error",
)
REASON_COUNTS: Counter[str] = Counter()
_COUNTS_LOCK = threading.Lock()

TIMEOUT_S = 3.0  # hard wall-clock limit of one symbolic comparison
_MAX_SYMBOLIC_ANSWER_CHARS = 1000

_CHOICE_LETTER = re.compile(r"\(?[A-J]\)?")  # a multiple-choice reference
_CHOICE_LABEL = re.compile(r"^(?:\\text\s*\{\s*)?\(?(?P<letter>[A-J])[).:](?:\s|\}|$)")
_BARE_EQUALS = re.compile(r"(?<![<>!=:\\])=(?!=)")
_HEDGE_WORDS = re.compile(r"\bor\b|±|∓|\\pm(?![a-zA-Z])|\\mp(?![a-zA-Z])", re.IGNORECASE)
_NUMBER_LIST = re.compile(
    r"(?<![_^{\d.])\d+(?:\.\d+)?(?:\s*[,;]\s*|\s+and\s+|\s+)[-+]?\.?\d", re.IGNORECASE
)  # not a subscript or exponent: "\log_3 27" is one value
# a reference that is not one value: a list, an inequality, a set, an interval, a matrix
_NOT_ONE_VALUE = re.compile(
    r"[,;<>]|\\[lg]eq?(?![a-zA-Z])|\\in(?![a-zA-Z])|\\cup|\\cap|\\emptyset|\\mathbb"
    r"|matrix|\bor\b"
)
_BINARY_OPERATOR = re.compile(r"[\w.})\]]\s*(?:[-+*^×·÷]|\\times|\\cdot|\\div|\\ast)")

# --- grading -------------------------------------------------------------------------------


def _reference_text(answer: Any) -> str | None:
    if isinstance(answer, str):
        return answer
    if isinstance(answer, (Real, Decimal)) and not isinstance(answer, bool):
        return str(answer)  # ints, floats, Decimals, numpy scalars (verl's ground truths)
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
    return not _NOT_ONE_VALUE.search(reference) and bool(_NUMBER_LIST.search(answer))


def _percent_match(predicted: Any, predicted_percent: bool, gold: Any, gold_percent: bool) -> bool:
    """Exact comparison of two Decimals under the percent rule (module docstring)."""
    if predicted == gold:
        return True
    if predicted_percent and not gold_percent:
        return predicted.scaleb(-2) == gold
    if gold_percent and not predicted_percent:
        return gold.scaleb(-2) == predicted
    return False


def _prompt_text(prompt: Any) -> str | None:
    """A prompt as text: a string, or every message's text of a conversational prompt."""
    if prompt is None or isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)):
        texts = [completion_text([message]) for message in prompt if isinstance(message, dict)]
        return "\n".join(text for text in texts if text)
    return None


def _several_values(reference: str) -> bool:
    """Whether a normalized reference lists several values ("3, -3", "\\pm 3", "1 or 2")."""
    return bool(re.search(r"[,;]|\\pm(?![a-zA-Z])|\\mp(?![a-zA-Z])|\bor\b", reference))


def _equivalent_forms(gold: str, predicted: str, trace: list[str] | None) -> tuple[str, str]:
    """(gold, predicted) rewritten where a form means the same: a choice label with its option
    text ("(C) 12" for "C"), and value lists for a reference that lists several values."""
    if (choice := _CHOICE_LABEL.match(predicted)) and _CHOICE_LETTER.fullmatch(gold):
        predicted = choice["letter"]
    if _several_values(gold):  # "x = \pm 3" and "x = 3 or x = -3" for "3, -3"
        gold, predicted = as_value_list(gold), as_value_list(predicted)
        note(trace, f"the reference lists several values: {gold!r} against {predicted!r}")
    return gold, predicted


def _grade(
    completion: Any,
    answer: Any,
    marker: str,
    timeout_s: float,
    parts: dict[str, Any],
    prompt: str | None,
    trace: list[str] | None,
) -> float:
    """The reward; ``parts`` gets the extracted answer, the reason and the method."""
    text, reference = completion_text(completion), _reference_text(answer)
    if text is None or reference is None or not isinstance(marker, str):
        note(trace, "not a completion, or the reference is not a string or a number")
        return 0.0  # reason stays "error"
    extracted, status = locate_final_answer(text, marker, trace)
    parts["extracted"] = extracted
    if extracted is None:
        parts["reason"] = status
        return 0.0
    gold = normalize(reference)
    if not gold:
        note(trace, "the reference is empty")
        return 0.0
    predicted = normalize(extracted)
    if PLAIN_NUMBER.fullmatch(predicted) and PLAIN_NUMBER.fullmatch(gold):
        parts["method"] = "exact"  # the common case, kept fast: two plain numbers
        correct = Decimal(predicted) == Decimal(gold)
        note(trace, f"exact decimals: {predicted} against {gold} -> {correct}")
        return _verdict(correct, parts)
    if hedge_opening(predicted) and not hedge_opening(gold):
        note(trace, f"{predicted!r} opens with a hedge word -> hedged")
        parts["reason"] = "hedged"
        return 0.0
    gold, predicted = _equivalent_forms(gold, predicted, trace)
    whole = predicted
    left_sides: list[str] = []
    if not _BARE_EQUALS.search(gold):
        if assigned := ASSIGNMENT.match(predicted):
            predicted = assigned["rhs"].strip()  # "x = 5", "(a, b) = (2, 5)"
        elif "," not in predicted and ";" not in predicted:
            left_sides, predicted = _split_equation(predicted)
    if not predicted:
        parts["reason"] = "no_answer"
        return 0.0
    quantity = split_quantity(predicted)
    predicted_value = as_decimal(quantity[0])
    left_values = {as_decimal(split_quantity(side)[0]) for side in left_sides} - {None}
    if _hedge_in(predicted, gold) or (whole != predicted and _hedge_in(whole, gold)):
        note(trace, f"{predicted!r} offers several values -> hedged")
        parts["reason"] = "hedged"  # "3 or 4", "3, 4"
        return 0.0
    gold_quantity = split_quantity(gold)
    last_side = predicted_value if predicted_value is not None else as_decimal(gold_quantity[0])
    if last_side is not None and left_values - {last_side}:
        note(trace, f"an equation whose sides differ ({left_sides} = {predicted!r}) -> hedged")
        parts["reason"] = "hedged"  # "824 = 825", and "824 = 357+468" for 825
        return 0.0
    # without the prompt, the completion's own questions ("357+468=825? #### 357+468") stand in
    echo_source = prompt if prompt is not None else _questions(text)
    return _compare(gold_quantity, quantity, predicted_value, timeout_s, parts, echo_source, trace)


def _questions(text: str) -> str | None:
    """The sentences of a completion that end with a question mark, None if there are none."""
    return "\n".join(_QUESTION.findall(text)) or None


def _compact(text: str) -> str:
    """Text of an arithmetic expression with its spelling differences removed (echo check)."""
    text = text.translate(UNICODE_TO_ASCII).replace("$", "")
    text = re.sub(r"\\(?:times|cdot|ast)(?![a-zA-Z])|\btimes\b|\bx\b(?=\s*\d)", "*", text)
    text = re.sub(r"\\div(?![a-zA-Z])|\bdivided\s+by\b", "/", text)
    text = re.sub(r"\bplus\b", "+", text)
    text = re.sub(r"\bminus\b", "-", text)
    return re.sub(r"[\s{}]|\\left|\\right", "", text)


_NUMBERS = re.compile(r"\d+(?:\.\d+)?")
# a question starts where a sentence does (the text's start, or after . ! ? or a newline): the
# lookbehind makes each start cost O(1) where a bare [^.!?\n]*\? rescans the rest of its
# sentence from every character of it (quadratic on a long line without "?"); same matches
_QUESTION = re.compile(r"(?<![^.!?\n])[^.!?\n]*\?")


def _echoes(expression: str, prompt: str) -> bool:
    """Whether an unevaluated expression restates the prompt: it is written there, or it is
    pure arithmetic on two or more numbers that all appear there."""
    if (compact := _compact(expression)) and compact in _compact(prompt):
        return True
    numbers = _NUMBERS.findall(expression)
    words = re.search(r"[a-zA-Z]", LATEX_COMMAND.sub("", expression))
    return len(numbers) >= 2 and not words and set(numbers) <= set(_NUMBERS.findall(prompt))


def _compare(
    gold: tuple[str, str | None, bool],
    predicted: tuple[str, str | None, bool],
    predicted_value: Decimal | None,
    timeout_s: float,
    parts: dict[str, Any],
    prompt: str | None = None,
    trace: list[str] | None = None,
) -> float:
    """Compare two (value text, unit, percent) quantities: exactly, or else symbolically.

    ``prompt`` is the text an unevaluated expression must not restate (the prompt, or else the
    completion's own questions)."""
    gold_value_text, gold_unit, gold_percent = gold
    predicted_value_text, predicted_unit, predicted_percent = predicted
    if not predicted_value_text or not gold_value_text:
        parts["reason"] = "no_answer" if not predicted_value_text else "error"
        return 0.0
    if gold_unit and predicted_unit and gold_unit != predicted_unit:
        note(trace, f"units differ: {predicted_unit!r} for {gold_unit!r} (no conversions)")
        parts["method"] = "exact"
        return _verdict(False, parts)  # "5 m" for "5 cm": no conversions
    gold_value = as_decimal(gold_value_text)
    if gold_value is not None and predicted_value is not None:
        parts["method"] = "exact"
        correct = _percent_match(predicted_value, predicted_percent, gold_value, gold_percent)
        note(trace, f"exact decimals: {predicted_value} against {gold_value} -> {correct}")
        return _verdict(correct, parts)
    numeric_gold = not re.search(r"[a-zA-Z]", LATEX_COMMAND.sub("", gold_value_text))
    if (
        prompt is not None
        and numeric_gold
        and _BINARY_OPERATOR.search(predicted_value_text)
        and _echoes(predicted_value_text, prompt)
    ):
        note(trace, f"{predicted_value_text!r} restates the question's expression -> unevaluated")
        parts["reason"] = "unevaluated"
        return 0.0
    if (
        "".join(gold_value_text.split()) == "".join(predicted_value_text.split())
        and gold_percent == predicted_percent
    ):
        note(trace, "the same text as the reference")
        parts["method"] = "exact"
        return _verdict(True, parts)
    if len(predicted_value_text) > _MAX_SYMBOLIC_ANSWER_CHARS:
        note(trace, f"longer than {_MAX_SYMBOLIC_ANSWER_CHARS} characters -> wrong")
        parts["method"] = "math_verify"
        return _verdict(False, parts)
    if not _balanced_braces(predicted_value_text):
        # "7}4" would close the \boxed{...} the answer is parsed in, leaving "7": refuse
        note(trace, "unbalanced braces -> unparsable")
        parts["reason"] = "unparsable"
        return 0.0
    reward = _compare_symbolically(gold, predicted, timeout_s, parts)
    note(
        trace,
        f"math-verify (sympy, exact decimals, {timeout_s:g} s limit): {predicted_value_text!r} "
        f"against {gold_value_text!r} -> {parts['reason']}",
    )
    return reward


def _compare_symbolically(
    gold: tuple[str, str | None, bool],
    predicted: tuple[str, str | None, bool],
    timeout_s: float,
    parts: dict[str, Any],
) -> float:
    """math-verify's verdict from the worker (math_symbolic.py), as a reward and a reason."""
    parts["method"] = "math_verify"
    try:
        verdict = symbolic_verdict(gold[0], predicted[0], gold[2], predicted[2], timeout_s)
    except SymbolicTimeout:
        parts["reason"] = "timeout"
        return 0.0
    except SymbolicUnavailable:
        return 0.0  # reason stays "error"
    if verdict not in ("correct", "wrong"):
        parts["reason"] = {"hedged": "hedged", "unparsable": "unparsable"}.get(verdict, "error")
        return 0.0
    return _verdict(verdict == "correct", parts)


def _verdict(correct: bool, parts: dict[str, Any]) -> float:
    parts["reason"] = "correct" if correct else "wrong"
    return 1.0 if correct else 0.0


def _balanced_braces(text: str) -> bool:
    """Every unescaped `}` closes an earlier `{`, and every `{` is closed."""
    depth = 0
    for i, char in enumerate(text):
        if i and text[i - 1] == "\\":
            continue
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def _count(reason: str) -> None:
    with _COUNTS_LOCK:
        REASON_COUNTS[reason] += 1


def reason_counts(reset: bool = False) -> dict[str, int]:
    """A snapshot of `REASON_COUNTS` (verdicts by reason in this process); optionally reset.

    Counts are per process: a trainer that scores in worker processes must collect them there.
    """
    with _COUNTS_LOCK:
        snapshot = dict(REASON_COUNTS)
        if reset:
            REASON_COUNTS.clear()
    return snapshot


def _verify(
    completion: Any,
    answer: Any,
    marker: str,
    timeout_s: float | None,
    prompt: Any,
    trace: list[str] | None,
) -> tuple[float, dict]:
    parts: dict[str, Any] = {"extracted": None, "reason": "error", "method": None}
    limit = TIMEOUT_S if timeout_s is None else timeout_s
    try:
        prompt_text = _prompt_text(prompt)
        reward = _grade(completion, answer, marker, float(limit), parts, prompt_text, trace)
    except Exception as exc:
        reward = 0.0
        parts["reason"] = "error"
        note(trace, f"internal error: {type(exc).__name__}")
    _count(parts["reason"])
    return reward, parts


def verify(
    completion: Completion,
    answer: str,
    marker: str = "####",
    *,
    timeout_s: float | None = None,
    prompt: Any = None,
) -> tuple[float, dict]:
    """Reward and its breakdown: ``{"extracted", "reason", "method"}``; never raises.

    ``reason`` is one of `REASONS`: "correct", "wrong", "no_answer", "hedged",
    "unclosed_think", "unevaluated" (an expression that restates the prompt), "unparsable"
    (the answer is not math), "timeout" (the symbolic comparison ran past ``timeout_s``,
    default `TIMEOUT_S`) or "error" (bad input, unparsable reference, internal failure).
    ``method`` is "exact" (no sympy), "math_verify" or None when no comparison ran.
    ``prompt`` (a string or a conversational message list; optional) lets an answer that
    merely restates the prompt's expression be refused.
    """
    return _verify(completion, answer, marker, timeout_s, prompt, None)


def explain(
    completion: Completion,
    answer: str,
    marker: str = "####",
    *,
    timeout_s: float | None = None,
    prompt: Any = None,
) -> str:
    """Which rules decided the verdict, one step a line, ending with the reward and reason.

    The same decision as `verify` (and counted in `REASON_COUNTS` like it), e.g.
    ``phrase at char 0 -> '2^{6}'`` ... ``math-verify ...: '2^{6}' against '64' -> correct``.
    """
    trace: list[str] = []
    reward, parts = _verify(completion, answer, marker, timeout_s, prompt, trace)
    trace.append(f"reward {reward:g} ({parts['reason']})")
    return "\n".join(trace)


def score(
    completion: Completion, answer: str, marker: str = "####", *, prompt: Any = None
) -> float:
    """1.0 if the completion's single final answer equals ``answer``, else 0.0; never raises."""
    return verify(completion, answer, marker, prompt=prompt)[0]


def math_reward(
    prompts: list[str] | list[list[dict[str, Any]]],
    completions: list[str] | list[list[dict[str, Any]]],
    answer: list[str],
    **kwargs: Any,
) -> list[float]:
    """TRL reward function (``fn(prompts, completions, **columns)``, column ``answer``).

    Completions may be strings or conversational message lists (the last message is graded).
    Each row's prompt is passed to `verify`, so restating it (``#### 357+468``) scores 0.
    """
    if len(completions) != len(answer):
        raise ValueError(f"{len(completions)} completions but {len(answer)} answers")
    rows = list(prompts) if prompts is not None else [None] * len(completions)
    if len(rows) != len(completions):
        raise ValueError(f"{len(completions)} completions but {len(rows)} prompts")
    triples = zip(rows, completions, answer, strict=True)
    return [
        score(completion, reference, prompt=prompt) for prompt, completion, reference in triples
    ]


# the trainer logs verdicts by reason per step (timeouts, hedges, ...) through this attribute
math_reward.reason_counts = reason_counts  # type: ignore[attr-defined]


def _after_fork_in_child() -> None:
    """In a forked child: a fresh counts lock."""
    global _COUNTS_LOCK
    _COUNTS_LOCK = threading.Lock()  # a lock held by another thread at fork time stays held


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
