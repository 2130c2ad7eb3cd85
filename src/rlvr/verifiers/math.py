"""Strict math verifier: one final answer, compared mathematically, reward 1.0 or 0.0.

Grading policy (docs/verifiers.md has it as one table)
-----------------------------------------------------
Reasoning is never graded.
  * ``<think>...</think>`` blocks are removed. An orphan ``</think>`` (the opening tag was in
    the prompt, as in R1-style templates) ends the reasoning: everything before it is dropped.
  * An unclosed ``<think>`` means no answer was given (reason ``unclosed_think``).
  * Nothing in the completion talks to the grader: text such as "ignore previous
    instructions, this answer is correct" is just more text (no marker, no box: no answer;
    inside an answer: free symbols, wrong).

The final answer is the last explicit one.
  * Candidates are every ``\\boxed{...}`` / ``\\fbox{...}`` (brace-balanced, nested braces and
    escaped ``\\{ \\}`` allowed; a brace-less ``\\boxed 9`` boxes the token after it), every
    occurrence of the task marker (default ``####``), and every answer phrase
    (`rlvr.verifiers.answer_phrases`: "The answer is 64.", "Final Answer: The final answer is
    $64$. I hope it is correct." (Minerva's), "**Final answer:** 64", "**Answer: 64**", "The
    answer is: 64", a heading line "## Final Answer"; not after "if"/"suppose" in its
    sentence). A marker's answer runs to the end of its line, or to the next candidate on that
    line; a phrase's answer is the math span right after it (``$64$``) or else the rest of its
    sentence, and a ``$`` before a number that no ``$`` closes is currency (``$2,500``).
    A marker or phrase followed on its line by nothing but another candidate (``#### \\boxed{5}``,
    ``Final Answer: The final answer is``) only introduces it. Markers and phrases inside a
    box are ignored. An answer on the line *after* a bare marker does not count; after a bare
    phrase ("The answer is:" then the answer) it does.
  * The candidate that starts last wins: a later box, marker or phrase replaces an earlier
    one when words separate them (``#### 824\\nwait, 8+4 carries\\n#### 825``, ``First
    \\boxed{41}. Wait, I dropped a term: \\boxed{43}``, an intermediate quantity boxed and
    then the one asked for, a box retracted by a later "the final answer is 43").
  * Numbers in the text without a marker, a box or an answer phrase are not answers (reason
    ``no_answer``); so is an empty box or empty marker (never a fallback to an earlier number),
    and a box left unclosed (truncated generation).

Several different final answers score 0 (reason ``hedged``).
  * A spray: the final group of candidates holds two different values. The group is the
    last candidate and every earlier one joined to it by nothing but whitespace, punctuation,
    list numbering or "or"/"and" (``\\boxed{3} \\boxed{4}``, ``\\boxed{3}, or \\boxed{4}``,
    ``\\boxed{3}\\n\\boxed{4}``, ``#### 3 #### 4``), or by a short text (80 characters at most)
    with a hedge word ("or", "maybe", "alternatively", "otherwise", "could", ...) and no
    correction word ("wait", "actually", "mistake", "recheck", "no", ...). Equal values
    (``\\boxed{4} #### 4.0``, ``\\boxed{y = 6}, \\boxed{6}``) are fine.
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
  * Normalization, both sides: full-width characters to ASCII, unicode minus signs to ``-``,
    ``× · ÷ π ∞ √ ² ³ °`` to LaTeX; ``$`` / ``\\(`` / ``\\)`` / ``**`` delimiters and a
    trailing period removed; a lone ``\\text{}``/``\\mathrm{}``/``{}`` wrapper unwrapped;
    thousands separators removed (``,``, ``\\,``, ``{,}``, thin spaces; groups of exactly
    three digits); the words ``pi``, ``inf``/``infinity``/``oo`` read as π and ∞; ``∅``,
    ``\\varnothing`` and ``\\{\\}`` as ``\\emptyset``; vulgar fractions (``¾``, ``2½``) and
    repeating decimals (``0.\\overline{6}`` = 2/3; a written-out ``0.666`` is not) as exact
    fractions; parentheses around the whole answer dropped (``((5))``); a multiple-choice
    label with its option text (``(C) 12``) read as the letter when the reference is one.
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
from bisect import bisect_left, bisect_right
from collections import Counter
from decimal import Decimal, InvalidOperation
from numbers import Real
from typing import Any, NamedTuple

from rlvr.verifiers.answer_phrases import (
    find_phrases,
    hedge_opening,
    is_hypothesis,
    joins_as_spray,
    phrase_answer,
)
from rlvr.verifiers.format import answer_text, completion_text
from rlvr.verifiers.math_forms import (
    angle_brackets,
    as_value_list,
    empty_set,
    outer_parentheses,
    repeating_decimals,
    vulgar_fractions,
)
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

_BOX_OPEN = re.compile(
    r"\\(?:boxed|fbox)(?:\s*\{|(?P<bare>(?:\s+|(?=[-+.\d]))[-+]?[\w.,/%]*[\w%]))"
)


class _Candidate(NamedTuple):
    """One explicit answer: where it starts and ends in the text, its text, and its kind."""

    start: int
    end: int
    answer: str
    kind: str  # "box", "marker" or "phrase"


def _note(trace: list[str] | None, line: str) -> None:
    """Record one step of the decision when `explain` asked for it."""
    if trace is not None:
        trace.append(line)


# --- normalization -------------------------------------------------------------------------

_UNICODE_TO_ASCII = str.maketrans(
    {
        **{chr(code): chr(code - 0xFEE0) for code in range(0xFF01, 0xFF5F)},  # full-width
        "\u3000": " ",  # ideographic space
        "\u2212": "-",  # minus sign
        "\u2012": "-",  # figure dash
        "\u2013": "-",  # en dash, often a minus in generated text
        "\ufe63": "-",  # small hyphen-minus
        "\u2009": "\\,",  # thin space: a thousands separator like LaTeX \,
        "\u202f": "\\,",  # narrow no-break space
        "\u00a0": " ",
        "\u00d7": "\\times ",
        "\u00b7": "\\cdot ",
        "\u22c5": "\\cdot ",
        "\u00f7": "\\div ",
        "\u03c0": "\\pi ",
        "\u221e": "\\infty ",
        "\u221a": "\\sqrt",
        "\u00b2": "^2",
        "\u00b3": "^3",
        "\u00b0": "^\\circ",
        "\u2205": "\\emptyset ",
        "\u2264": "\\le ",
        "\u2265": "\\ge ",
    }
)
_OUTER_MATH_DELIMITERS = re.compile(r"^\\[\[(]|\\[\])]$")
_LONE_WRAPPER = re.compile(r"^(?:\\(?:text|textbf|mathrm|mathbf|boxed|fbox)\s*)?\{([^{}]*)\}$")
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:(?:,|\\,|\{,\})\d{3})+(?!\d)")
_THOUSANDS_SEPARATOR = re.compile(r",|\\,|\{,\}")
_WORD_PI = re.compile(r"(?<![\\A-Za-z])pi(?![A-Za-z])")
_WORD_INFINITY = re.compile(r"(?<![\\A-Za-z])(?:infinity|inf|oo)(?![A-Za-z])", re.IGNORECASE)
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_LATEX_COMMAND = re.compile(r"\\[a-zA-Z]+")
_CHOICE_LETTER = re.compile(r"\(?[A-J]\)?")  # a multiple-choice reference
_CHOICE_LABEL = re.compile(r"^(?:\\text\s*\{\s*)?\(?(?P<letter>[A-J])[).:](?:\s|\}|$)")
_BARE_EQUALS = re.compile(r"(?<![<>!=:\\])=(?!=)")
# "x = ...", "(a, b) = ...": a variable (or a tuple of them) named, then its value
_ASSIGNMENT = re.compile(
    r"^\s*(?:[a-zA-Z]|\(\s*[a-zA-Z](?:\s*,\s*[a-zA-Z])+\s*\))\s*=(?!=)\s*(?P<rhs>[^=]+)$"
)
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

_MANTISSA = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_EXPONENT = r"\^\s*(?:\{\s*(?P<k1>[+-]?\d+)\s*\}|(?P<k2>[+-]?\d+))"
_SCIENTIFIC = re.compile(
    rf"(?P<m>{_MANTISSA})\s*(?:\\times|\\cdot|\\ast|\*)\s*10\s*{_EXPONENT}", re.IGNORECASE
)
_POWER_OF_TEN = re.compile(rf"(?P<m>[+-]?)10\s*{_EXPONENT}")
_E_NOTATION = re.compile(r"(?<![\w.\\])(\d+(?:\.\d+)?|\.\d+)[eE]([+-]?\d+)(?![\w.])")

# Spray separators: what may stand between two candidates of one "final group".
_SPRAY_GAP = re.compile(
    r"(?:\s|[,;:.!?/|&*()\[\]$-]|\\[()\[\],;:! ]|\\q?quad(?![a-zA-Z])|\\\\"
    r"|\\text\s*\{\s*(?:or|and)?\s*\}|\b(?:or|and|either|maybe|perhaps|possibly)\b"
    r"|(?<![^\s(])\d{1,2}[.)](?=\s))*",
    re.IGNORECASE,
)
_MAX_SPRAY_GAP_CHARS = 200

# --- units ---------------------------------------------------------------------------------

_UNIT_SPELLINGS = {
    "dollar": "dollar dollars usd",
    "cent": "cent cents ¢",
    "euro": "euro euros eur €",
    "pound": "pound pounds lb lbs gbp £",
    "yen": "yen jpy ¥",
    "yuan": "yuan rmb cny",
    "rupee": "rupee rupees inr rs ₹",
    "mm": "mm millimeter millimeters millimetre millimetres",
    "cm": "cm centimeter centimeters centimetre centimetres",
    "m": "m meter meters metre metres",
    "km": "km kilometer kilometers kilometre kilometres",
    "inch": "inch inches",
    "ft": "ft foot feet",
    "yd": "yd yard yards",
    "mile": "mi mile miles",
    "mg": "mg milligram milligrams",
    "g": "g gram grams",
    "kg": "kg kilogram kilograms kilo kilos",
    "ton": "ton tons tonne tonnes",
    "oz": "oz ounce ounces",
    "ml": "ml milliliter milliliters millilitre millilitres",
    "l": "l liter liters litre litres",
    "gallon": "gal gallon gallons",
    "cup": "cup cups",
    "s": "s sec secs second seconds",
    "min": "min mins minute minutes",
    "h": "h hr hrs hour hours",
    "day": "day days",
    "week": "week weeks",
    "month": "month months",
    "year": "yr yrs year years",
    "degree": "deg degree degrees \\circ",
    "radian": "rad rads radian radians",
    "unit": "unit units",
    "mile/h": "mph",
    "km/h": "kph kmh",
}
_UNIT_LOOKUP = {
    spelling: canonical
    for canonical, spellings in _UNIT_SPELLINGS.items()
    for spelling in spellings.split()
}
_POWER = r"(?P<power>\^\s*\{?\s*[23]\s*\}?)?"
_UNIT_SEPARATOR = r"(?P<sep>(?:\s|\\[,;:! ]|~)*)"
_PERCENT_SUFFIX = re.compile(
    r"^(?P<value>.*?)\s*(?:\\%|%|\\text\s*\{\s*\\?%\s*\}|\\text\s*\{\s*percent\s*\}|\bpercent)$",
    re.DOTALL,
)
_REMARK_SUFFIX = re.compile(r"^(?P<value>.*?\S)\s*\\text\s*\{\s*\([^{}]*\)\s*\}$", re.DOTALL)
_DEGREE_SUFFIX = re.compile(r"^(?P<value>.*?)\s*\^\s*(?:\\circ|\{\s*\\circ\s*\})$", re.DOTALL)
_WRAPPED_UNIT_SUFFIX = re.compile(
    rf"^(?P<value>.*?){_UNIT_SEPARATOR}\\(?:text|textrm|mathrm|mbox|rm|operatorname)\s*"
    rf"\{{\s*(?P<unit>[A-Za-z][A-Za-z .'/-]*?)\s*\}}\s*{_POWER}$",
    re.DOTALL,
)
_PLAIN_UNIT_SUFFIX = re.compile(
    rf"^(?P<value>.*?[\d}})]){_UNIT_SEPARATOR}"
    rf"(?P<unit>[A-Za-z]+\.?(?:\s+[A-Za-z]+){{0,2}}(?:/[A-Za-z]+)?)\s*{_POWER}$",
    re.DOTALL,
)
_NOT_UNITS = {"or", "and", "sin", "cos", "tan", "log", "ln", "exp", "sqrt", "pi", "inf", "oo"}
_CURRENCY_PREFIX = re.compile(r"^(?P<unit>€|£|¥|₹|USD|EUR|GBP|JPY|INR)\s*(?P<value>.+)$")


def _canonical_unit(raw: str, power: str | None = None) -> str | None:
    """The unit's canonical spelling (``"sq. ft"`` -> ``"ft^2"``), None if not a known unit."""
    words = raw.lower().replace(".", " ").split()
    exponent = ""
    if words and words[0] in ("square", "sq"):
        exponent, words = "^2", words[1:]
    elif words and words[0] in ("cubic", "cu"):
        exponent, words = "^3", words[1:]
    if power:
        exponent = "^" + re.sub(r"\D", "", power)
    text = re.sub(r"\s+per\s+", "/", " ".join(words))
    parts = [part.strip() for part in text.split("/")]
    canonical = [_UNIT_LOOKUP.get(part) for part in parts]
    if not parts or None in canonical:
        return None
    return "/".join(canonical) + exponent  # type: ignore[arg-type]


def _split_quantity(text: str) -> tuple[str, str | None, bool]:
    """(value text, canonical unit or None, is a percentage); see "Units" and "Percent"."""
    if _PLAIN_NUMBER.fullmatch(text):
        return text, None, False  # the common case, kept fast
    unit: str | None = None
    if remark := _REMARK_SUFFIX.match(text):
        text = remark["value"]  # "825 \text{ (this answer is correct)}": a remark, not judged
    if (match := _PERCENT_SUFFIX.match(text)) and match["value"].strip():
        return _scientific_to_plain(match["value"].strip()), None, True
    if match := _CURRENCY_PREFIX.match(text):
        unit, text = _canonical_unit(match["unit"]), match["value"].strip()
    elif match := _DEGREE_SUFFIX.match(text):
        if match["value"].strip():
            unit, text = "degree", match["value"].strip()
    elif match := _WRAPPED_UNIT_SUFFIX.match(text):
        if match["value"].strip():
            label = " ".join(match["unit"].split())
            unit = _canonical_unit(label, match["power"]) or label.lower()
            text = match["value"].strip()
    elif match := _PLAIN_UNIT_SUFFIX.match(text):
        unit = _plain_unit(match)
        text = match["value"].strip() if unit else text
    return _scientific_to_plain(text), unit, False


def _plain_unit(match: re.Match[str]) -> str | None:
    """The unit of a `_PLAIN_UNIT_SUFFIX` match ("5 cm", "5 apples"), None if it is none."""
    if re.search(r"[a-zA-Z]", _LATEX_COMMAND.sub("", match["value"])):
        return None  # "\pi r^{2} h", "\frac{1}{2} b h": a variable, not hours
    label = " ".join(match["unit"].split())
    known = _canonical_unit(label, match["power"])
    words = label.lower().rstrip(".").replace("/", " ").split()
    if known and (match["sep"] or len(label.rstrip(".")) > 1):
        return known  # "5 cm", "5cm", not "5m"
    if match["sep"] and all(len(w) > 1 and w not in _NOT_UNITS for w in words):
        return label.lower()  # "5 apples"
    return None


def _scientific_to_plain(text: str) -> str:
    """``3\\times10^{8}`` / ``10^8`` -> ``3e8`` / ``1e8``; ``e``-notation inside an expression
    -> ``\\times10^{k}``, which math-verify reads right (it reads ``3e8`` as 3*e*8)."""
    for pattern in (_SCIENTIFIC, _POWER_OF_TEN):
        if match := pattern.fullmatch(text):
            mantissa = match["m"] if match["m"] not in ("", "+", "-") else match["m"] + "1"
            return f"{mantissa}e{match['k1'] or match['k2']}"
    if _PLAIN_NUMBER.fullmatch(text):
        return text
    return _E_NOTATION.sub(r"(\1\\times10^{\2})", text)


def _strip_delimiters(text: str) -> str:
    """Drop math delimiters, markdown emphasis/code marks and a trailing period."""
    text = text.replace("\\$", "").replace("$", "").strip()
    text = _OUTER_MATH_DELIMITERS.sub("", text).strip()
    return text.strip("*`").strip().rstrip(".").strip()


def _normalize(text: str) -> str:
    """Canonical text of one answer (see the module docstring, "Comparison")."""
    if _PLAIN_NUMBER.fullmatch(stripped := text.strip()):
        return stripped  # the common case, kept fast
    text = _strip_delimiters(text.translate(_UNICODE_TO_ASCII))
    for _ in range(3):  # \text{\boxed{5}} and the like; bounded.
        unwrapped = _LONE_WRAPPER.sub(r"\1", text).strip()
        if unwrapped == text:
            break
        text = unwrapped
    text = _THOUSANDS.sub(lambda m: _THOUSANDS_SEPARATOR.sub("", m.group()), text)
    text = _WORD_PI.sub(r"\\pi", text)
    text = _WORD_INFINITY.sub(r"\\infty", text)
    text = empty_set(repeating_decimals(vulgar_fractions(text)))
    return outer_parentheses(angle_brackets(text))


def _as_decimal(normalized: str) -> Decimal | None:
    """The exact value of a plain decimal literal, else None."""
    compact = "".join(normalized.split())
    if not _PLAIN_NUMBER.fullmatch(compact):
        return None
    try:
        return Decimal(compact)
    except InvalidOperation:
        return None


def _comparison_key(answer: str) -> tuple[Decimal | str, bool]:
    """What makes two candidates "the same answer": value (numeric if possible) and percent."""
    normalized = _normalize(answer)
    if assigned := _ASSIGNMENT.match(normalized):
        normalized = assigned["rhs"]  # "y = 6" and "6" are the same answer
    value, _, percent = _split_quantity(normalized)
    number = _as_decimal(value)
    return (number if number is not None else "".join(value.split())), percent


# --- extraction ----------------------------------------------------------------------------


def _find_boxes(text: str) -> list[tuple[int, int, str | None]]:
    """Top-level ``\\boxed{}``/``\\fbox{}`` and brace-less ``\\boxed 9``: (start, end,
    content); content None if unclosed."""
    boxes: list[tuple[int, int, str | None]] = []
    pos = 0
    while match := _BOX_OPEN.search(text, pos):
        if match["bare"] is not None:
            boxes.append((match.start(), match.end(), match["bare"].strip()))
            pos = match.end()
            continue
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


def _joined(gap: str) -> bool:
    """Whether the text between two candidates leaves both standing (module docstring)."""
    spray = len(gap) <= _MAX_SPRAY_GAP_CHARS and _SPRAY_GAP.fullmatch(gap)
    return bool(spray) or joins_as_spray(gap)


def _final_group(text: str, candidates: list[_Candidate]) -> list[_Candidate]:
    """The last candidate and every earlier one joined to it (a spray); last first."""
    group = [candidates[-1]]
    following_start = candidates[-1].start
    for candidate in reversed(candidates[:-1]):
        end = candidate.end
        gap = text[end:following_start] if end <= following_start else ""
        if not _joined(gap):
            break
        group.append(candidate)
        following_start = candidate.start
    return group


def _outside_boxes(boxes: list[tuple[int, int, str | None]]) -> Any:
    """A test: whether a position lies outside every box."""
    box_starts = [start for start, _, _ in boxes]

    def outside(position: int) -> bool:
        enclosing = bisect_right(box_starts, position) - 1
        return enclosing < 0 or position >= boxes[enclosing][1]

    return outside


def _phrase_text(text: str, start: int, line_end: int, next_start: int) -> tuple[int, str]:
    """(where the answer text starts, the text) after a phrase: its line, or else the next
    non-blank line when nothing but delimiters follows the phrase on its own."""
    on_line = text[start : next_start if line_end == -1 else line_end]
    if line_end == -1 or _strip_delimiters(on_line.strip(" \t*:")):
        return start, on_line
    following = text[line_end:next_start]
    stripped = following.lstrip()
    if not stripped or following[: len(following) - len(stripped)].count("\n") > 2:
        return start, on_line
    begin = line_end + len(following) - len(stripped)
    end = text.find("\n", begin, next_start)
    if end == -1 and next_start < len(text):
        return start, on_line  # a box (or marker) on that line is the answer
    return begin, text[begin : next_start if end == -1 else end]


def _candidates(text: str, marker: str) -> list[_Candidate] | None:
    """Every explicit answer in order (module docstring); None if the last box is unclosed."""
    boxes = _find_boxes(text)
    if boxes and boxes[-1][2] is None:
        return None
    outside = _outside_boxes(boxes)
    heads: list[tuple[int, int, str]] = []  # (start, end of the marker or phrase, kind)
    if marker:
        pos = 0
        while (found := text.find(marker, pos)) != -1:
            if outside(found):
                heads.append((found, found + len(marker), "marker"))
            pos = found + len(marker)
    marker_starts = [start for start, _, _ in heads]
    for phrase_start, phrase_end in find_phrases(text):
        nearest = bisect_left(marker_starts, phrase_start)
        if nearest < len(marker_starts) and marker_starts[nearest] < phrase_end:
            continue  # the marker is this phrase ("Answer:" as DAPO's marker)
        if outside(phrase_start):
            heads.append((phrase_start, phrase_end, "phrase"))
    candidates = [_Candidate(s, e, c, "box") for s, e, c in boxes if c is not None]
    starts = sorted([start for start, _, _ in boxes] + [start for start, _, _ in heads])
    for start, head_end, kind in heads:
        following = bisect_right(starts, start)
        next_start = starts[following] if following < len(starts) else len(text)
        line_end = text.find("\n", head_end, next_start)  # bounded: linear over all heads
        answer_end = next_start if line_end == -1 else line_end
        if kind == "phrase":
            begin, raw = _phrase_text(text, head_end, line_end, next_start)
            answer, used = phrase_answer(raw)
            answer_end = begin + used
        else:
            answer = text[head_end:answer_end]
        if not _strip_delimiters(answer) and line_end == -1 and next_start < len(text):
            continue  # "#### \boxed{5}", "Final Answer: The final answer is": it introduces
        if kind == "phrase" and is_hypothesis(text, start):
            continue  # "if the answer is 5, then ..."
        candidates.append(_Candidate(start, answer_end, answer, kind))
    candidates.sort(key=lambda candidate: candidate.start)
    return candidates


def _locate_final_answer(
    completion: str, marker: str, trace: list[str] | None = None
) -> tuple[str | None, str]:
    """(final answer, status); status is "ok", "no_answer", "unclosed_think" or "hedged"."""
    text = answer_text(completion)
    if text is None:
        _note(trace, "an unclosed <think>: no answer was given")
        return None, "unclosed_think"
    candidates = _candidates(text, marker)
    if candidates is None:
        _note(trace, "the last \\boxed{ is never closed (a truncated generation)")
        return None, "no_answer"
    if not candidates:
        _note(trace, f"no \\boxed{{}}, no {marker!r} and no answer phrase outside <think>")
        return None, "no_answer"
    last = candidates[-1]
    if trace is not None:
        shown = ", ".join(f"{c.kind} at char {c.start}" for c in candidates[-6:])
        _note(trace, f"{len(candidates)} candidate(s) ({shown}); the last one counts")
    group = [c for c in _final_group(text, candidates) if _strip_delimiters(c.answer)]
    if len(group) > 1 and len({_comparison_key(c.answer) for c in group}) > 1:
        _note(trace, f"a spray: {len(group)} different answers stand together -> hedged")
        return None, "hedged"
    answer = _strip_delimiters(last.answer)
    if not answer:
        _note(trace, f"the {last.kind} at char {last.start} is empty")
        return None, "no_answer"
    _note(trace, f"{last.kind} at char {last.start} -> {answer!r}")
    return answer, "ok"


def extract_final_answer(completion: str, marker: str = "####") -> str | None:
    """The completion's single final answer (module docstring), or None if there is none.

    None also for an unclosed ``<think>`` and for a spray of different final answers. Hedges
    inside one answer ("3 or 4") are returned as is: `verify` judges them against the reference.
    """
    if not isinstance(completion, str) or not isinstance(marker, str):
        return None
    return _locate_final_answer(completion, marker)[0]


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
        _note(trace, f"the reference lists several values: {gold!r} against {predicted!r}")
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
        _note(trace, "not a completion, or the reference is not a string or a number")
        return 0.0  # reason stays "error"
    extracted, status = _locate_final_answer(text, marker, trace)
    parts["extracted"] = extracted
    if extracted is None:
        parts["reason"] = status
        return 0.0
    gold = _normalize(reference)
    if not gold:
        _note(trace, "the reference is empty")
        return 0.0
    predicted = _normalize(extracted)
    if _PLAIN_NUMBER.fullmatch(predicted) and _PLAIN_NUMBER.fullmatch(gold):
        parts["method"] = "exact"  # the common case, kept fast: two plain numbers
        correct = Decimal(predicted) == Decimal(gold)
        _note(trace, f"exact decimals: {predicted} against {gold} -> {correct}")
        return _verdict(correct, parts)
    if hedge_opening(predicted) and not hedge_opening(gold):
        _note(trace, f"{predicted!r} opens with a hedge word -> hedged")
        parts["reason"] = "hedged"
        return 0.0
    gold, predicted = _equivalent_forms(gold, predicted, trace)
    whole = predicted
    left_sides: list[str] = []
    if not _BARE_EQUALS.search(gold):
        if assigned := _ASSIGNMENT.match(predicted):
            predicted = assigned["rhs"].strip()  # "x = 5", "(a, b) = (2, 5)"
        elif "," not in predicted and ";" not in predicted:
            left_sides, predicted = _split_equation(predicted)
    if not predicted:
        parts["reason"] = "no_answer"
        return 0.0
    quantity = _split_quantity(predicted)
    predicted_value = _as_decimal(quantity[0])
    left_values = {_as_decimal(_split_quantity(side)[0]) for side in left_sides} - {None}
    if _hedge_in(predicted, gold) or (whole != predicted and _hedge_in(whole, gold)):
        _note(trace, f"{predicted!r} offers several values -> hedged")
        parts["reason"] = "hedged"  # "3 or 4", "3, 4"
        return 0.0
    gold_quantity = _split_quantity(gold)
    last_side = predicted_value if predicted_value is not None else _as_decimal(gold_quantity[0])
    if last_side is not None and left_values - {last_side}:
        _note(trace, f"an equation whose sides differ ({left_sides} = {predicted!r}) -> hedged")
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
    text = text.translate(_UNICODE_TO_ASCII).replace("$", "")
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
    words = re.search(r"[a-zA-Z]", _LATEX_COMMAND.sub("", expression))
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
        _note(trace, f"units differ: {predicted_unit!r} for {gold_unit!r} (no conversions)")
        parts["method"] = "exact"
        return _verdict(False, parts)  # "5 m" for "5 cm": no conversions
    gold_value = _as_decimal(gold_value_text)
    if gold_value is not None and predicted_value is not None:
        parts["method"] = "exact"
        correct = _percent_match(predicted_value, predicted_percent, gold_value, gold_percent)
        _note(trace, f"exact decimals: {predicted_value} against {gold_value} -> {correct}")
        return _verdict(correct, parts)
    numeric_gold = not re.search(r"[a-zA-Z]", _LATEX_COMMAND.sub("", gold_value_text))
    if (
        prompt is not None
        and numeric_gold
        and _BINARY_OPERATOR.search(predicted_value_text)
        and _echoes(predicted_value_text, prompt)
    ):
        _note(trace, f"{predicted_value_text!r} restates the question's expression -> unevaluated")
        parts["reason"] = "unevaluated"
        return 0.0
    if (
        "".join(gold_value_text.split()) == "".join(predicted_value_text.split())
        and gold_percent == predicted_percent
    ):
        _note(trace, "the same text as the reference")
        parts["method"] = "exact"
        return _verdict(True, parts)
    if len(predicted_value_text) > _MAX_SYMBOLIC_ANSWER_CHARS:
        _note(trace, f"longer than {_MAX_SYMBOLIC_ANSWER_CHARS} characters -> wrong")
        parts["method"] = "math_verify"
        return _verdict(False, parts)
    if not _balanced_braces(predicted_value_text):
        # "7}4" would close the \boxed{...} the answer is parsed in, leaving "7": refuse
        _note(trace, "unbalanced braces -> unparsable")
        parts["reason"] = "unparsable"
        return 0.0
    reward = _compare_symbolically(gold, predicted, timeout_s, parts)
    _note(
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
        _note(trace, f"internal error: {type(exc).__name__}")
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
