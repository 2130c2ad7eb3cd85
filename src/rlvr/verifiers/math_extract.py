"""Answer extraction for the strict math verifier: the completion's one final answer, or why none.

This is math-verify's ``parse`` half; `rlvr.verifiers.math` is its ``verify`` half (grading,
the public API and the reason counters), and it imports this module, never the other way.
`locate_final_answer` returns (answer, status), status "ok", "no_answer", "unclosed_think" or
"hedged"; `extract_final_answer` returns the answer alone. In this order it:

1. drops the reasoning (`rlvr.verifiers.format.answer_text`);
2. finds the boxes, then the task marker and the answer phrases outside them;
3. reads each marker's and phrase's answer text, skipping introductions and hypotheses;
4. takes the candidate that starts last, refusing a spray of different values in the final
   group (compared by `normalize`d value, unit-free, percent apart) and an empty answer.

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

A spray scores 0 (reason ``hedged``): the final group of candidates holds two different
values. The group is the last candidate and every earlier one joined to it by nothing but
whitespace, punctuation, list numbering or "or"/"and" (``\\boxed{3} \\boxed{4}``, ``\\boxed{3},
or \\boxed{4}``, ``\\boxed{3}\\n\\boxed{4}``, ``#### 3 #### 4``), or by a short text (80
characters at most) with a hedge word ("or", "maybe", "alternatively", "otherwise", "could",
...) and no correction word ("wait", "actually", "mistake", "recheck", "no", ...). Equal values
(``\\boxed{4} #### 4.0``, ``\\boxed{y = 6}, \\boxed{6}``) are fine.

The normalization of one answer text (`normalize`, `split_quantity`, `as_decimal`: unicode,
delimiters, thousands separators, units, percent, scientific notation) lives here because
both halves use it: extraction to tell whether two candidates of a spray are the same value,
grading to compare the answer with the reference. Its rules are `rlvr.verifiers.math`'s
"Comparison".
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple

from rlvr.verifiers.answer_phrases import (
    find_phrases,
    is_hypothesis,
    joins_as_spray,
    phrase_answer,
)
from rlvr.verifiers.format import answer_text
from rlvr.verifiers.math_forms import (
    angle_brackets,
    empty_set,
    outer_parentheses,
    repeating_decimals,
    vulgar_fractions,
)

__all__ = [
    "ASSIGNMENT",
    "LATEX_COMMAND",
    "PLAIN_NUMBER",
    "UNICODE_TO_ASCII",
    "as_decimal",
    "extract_final_answer",
    "locate_final_answer",
    "normalize",
    "note",
    "split_quantity",
]

_BOX_OPEN = re.compile(
    r"\\(?:boxed|fbox)(?:\s*\{|(?P<bare>(?:\s+|(?=[-+.\d]))[-+]?[\w.,/%]*[\w%]))"
)


class _Candidate(NamedTuple):
    """One explicit answer: where it starts and ends in the text, its text, and its kind."""

    start: int
    end: int
    answer: str
    kind: str  # "box", "marker" or "phrase"


def note(trace: list[str] | None, line: str) -> None:
    """Record one step of the decision when `rlvr.verifiers.math.explain` asked for it."""
    if trace is not None:
        trace.append(line)


# --- normalization -------------------------------------------------------------------------

UNICODE_TO_ASCII = str.maketrans(
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
PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
LATEX_COMMAND = re.compile(r"\\[a-zA-Z]+")
# "x = ...", "(a, b) = ...": a variable (or a tuple of them) named, then its value
ASSIGNMENT = re.compile(
    r"^\s*(?:[a-zA-Z]|\(\s*[a-zA-Z](?:\s*,\s*[a-zA-Z])+\s*\))\s*=(?!=)\s*(?P<rhs>[^=]+)$"
)

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


def split_quantity(text: str) -> tuple[str, str | None, bool]:
    """(value text, canonical unit or None, is a percentage); see "Units" and "Percent" in
    `rlvr.verifiers.math`."""
    if PLAIN_NUMBER.fullmatch(text):
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
    if re.search(r"[a-zA-Z]", LATEX_COMMAND.sub("", match["value"])):
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
    if PLAIN_NUMBER.fullmatch(text):
        return text
    return _E_NOTATION.sub(r"(\1\\times10^{\2})", text)


def _strip_delimiters(text: str) -> str:
    """Drop math delimiters, markdown emphasis/code marks and a trailing period."""
    text = text.replace("\\$", "").replace("$", "").strip()
    text = _OUTER_MATH_DELIMITERS.sub("", text).strip()
    return text.strip("*`").strip().rstrip(".").strip()


def normalize(text: str) -> str:
    """Canonical text of one answer (`rlvr.verifiers.math`'s docstring, "Comparison")."""
    if PLAIN_NUMBER.fullmatch(stripped := text.strip()):
        return stripped  # the common case, kept fast
    text = _strip_delimiters(text.translate(UNICODE_TO_ASCII))
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


def as_decimal(normalized: str) -> Decimal | None:
    """The exact value of a plain decimal literal, else None."""
    compact = "".join(normalized.split())
    if not PLAIN_NUMBER.fullmatch(compact):
        return None
    try:
        return Decimal(compact)
    except InvalidOperation:
        return None


def _comparison_key(answer: str) -> tuple[Decimal | str, bool]:
    """What makes two candidates "the same answer": value (numeric if possible) and percent."""
    normalized = normalize(answer)
    if assigned := ASSIGNMENT.match(normalized):
        normalized = assigned["rhs"]  # "y = 6" and "6" are the same answer
    value, _, percent = split_quantity(normalized)
    number = as_decimal(value)
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


def locate_final_answer(
    completion: str, marker: str, trace: list[str] | None = None
) -> tuple[str | None, str]:
    """(final answer, status); status is "ok", "no_answer", "unclosed_think" or "hedged"."""
    text = answer_text(completion)
    if text is None:
        note(trace, "an unclosed <think>: no answer was given")
        return None, "unclosed_think"
    candidates = _candidates(text, marker)
    if candidates is None:
        note(trace, "the last \\boxed{ is never closed (a truncated generation)")
        return None, "no_answer"
    if not candidates:
        note(trace, f"no \\boxed{{}}, no {marker!r} and no answer phrase outside <think>")
        return None, "no_answer"
    last = candidates[-1]
    if trace is not None:
        shown = ", ".join(f"{c.kind} at char {c.start}" for c in candidates[-6:])
        note(trace, f"{len(candidates)} candidate(s) ({shown}); the last one counts")
    group = [c for c in _final_group(text, candidates) if _strip_delimiters(c.answer)]
    if len(group) > 1 and len({_comparison_key(c.answer) for c in group}) > 1:
        note(trace, f"a spray: {len(group)} different answers stand together -> hedged")
        return None, "hedged"
    answer = _strip_delimiters(last.answer)
    if not answer:
        note(trace, f"the {last.kind} at char {last.start} is empty")
        return None, "no_answer"
    note(trace, f"{last.kind} at char {last.start} -> {answer!r}")
    return answer, "ok"


def extract_final_answer(completion: str, marker: str = "####") -> str | None:
    """The completion's single final answer (module docstring), or None if there is none.

    None also for an unclosed ``<think>`` and for a spray of different final answers. Hedges
    inside one answer ("3 or 4") are returned as is: `rlvr.verifiers.math.verify` judges them
    against the reference.
    """
    if not isinstance(completion, str) or not isinstance(marker, str):
        return None
    return locate_final_answer(completion, marker)[0]
