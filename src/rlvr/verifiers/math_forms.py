"""Rewrites of equivalent answer forms for the strict math verifier (`rlvr.verifiers.math`).

Each function takes one normalized answer text and returns the text math-verify should read:

  * `vulgar_fractions`: ``¾`` -> ``\\frac{3}{4}`` (``2½`` -> ``2\\frac{1}{2}``, a mixed number).
  * `repeating_decimals`: ``0.\\overline{6}``, ``0.1\\overline{6}``, ``0.\\dot{3}`` -> the exact
    fraction (``\\frac{2}{3}``, ``\\frac{1}{6}``, ``\\frac{1}{3}``). A decimal written out
    (``0.666``, ``0.666\\ldots``) stays the number it spells: it is not 2/3.
  * `outer_parentheses`: ``((5))`` -> ``5``: parentheses around the whole answer that hold
    one value (no top-level comma: ``(1, 2)`` is a tuple) are dropped; math-verify's parser
    takes seconds on a few dozen nested ones.
  * `angle_brackets`: ``\\langle 1, 2 \\rangle`` (a vector) -> ``(1, 2)``.
  * `empty_set`: ``\\varnothing``, ``\\{\\}``, ``\\{ \\}`` -> ``\\emptyset``.
  * `as_value_list`: an answer offering several values, for a reference that is itself a list
    of values: ``\\pm`` and ``\\mp`` expand (``x = 1 \\pm \\sqrt{2}`` ->
    ``1+\\sqrt{2}, 1-\\sqrt{2}``) and ``or`` / ``and`` between values become commas
    (``x = 3 or x = -3`` -> ``x = 3, x = -3``).
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = [
    "angle_brackets",
    "as_value_list",
    "empty_set",
    "outer_parentheses",
    "repeating_decimals",
    "vulgar_fractions",
]

_VULGAR = {
    "½": (1, 2), "⅓": (1, 3), "⅔": (2, 3), "¼": (1, 4), "¾": (3, 4), "⅕": (1, 5),
    "⅖": (2, 5), "⅗": (3, 5), "⅘": (4, 5), "⅙": (1, 6), "⅚": (5, 6), "⅐": (1, 7),
    "⅛": (1, 8), "⅜": (3, 8), "⅝": (5, 8), "⅞": (7, 8), "⅑": (1, 9), "⅒": (1, 10),
}  # fmt: skip
_VULGAR_CHARS = re.compile("[" + "".join(_VULGAR) + "]")
_REPEATING = re.compile(
    r"(?<![\d.])(?P<whole>\d*)\.(?P<fixed>\d*)\s*\\(?:overline|dot|bar)\s*"
    r"(?:\{\s*(?P<braced>\d+)\s*\}|(?P<single>\d))"
)
_EMPTY_SET = re.compile(r"\\varnothing(?![a-zA-Z])|\\\{\s*\\\}|∅")
_PLUS_MINUS = re.compile(r"\\pm(?![a-zA-Z])|±|\\mp(?![a-zA-Z])|∓")
_RELATION = re.compile(r"[<>]|\\[lg]eq?(?![a-zA-Z])|\\[ln]eq(?![a-zA-Z])")
_ASSIGNED = re.compile(r"^\s*[a-zA-Z]\s*=\s*(?P<rhs>.+)$", re.DOTALL)
_VALUE_JOINER = re.compile(
    r"\s*(?:\\text\s*\{\s*(?:or|and)\s*\}|\\(?:quad|qquad)?\s*\\?text\s*\{\s*(?:or|and)\s*\}"
    r"|(?<![A-Za-z\\])(?:or|and)(?![A-Za-z]))\s*",
    re.IGNORECASE,
)


def vulgar_fractions(text: str) -> str:
    """``¾`` -> ``\\frac{3}{4}``; a digit before it makes a mixed number (``2\\frac{1}{2}``)."""
    if not _VULGAR_CHARS.search(text):
        return text
    return _VULGAR_CHARS.sub(lambda m: "\\frac{{{}}}{{{}}}".format(*_VULGAR[m.group()]), text)


def _repeating_to_fraction(match: re.Match[str]) -> str:
    whole, fixed = match["whole"] or "0", match["fixed"]
    repeat = match["braced"] or match["single"]
    # whole.fixed(repeat)... = (whole fixed repeat - whole fixed) / ((10^r - 1) * 10^f)
    numerator = int(whole + fixed + repeat) - int(whole + fixed)
    value = Fraction(numerator, (10 ** len(repeat) - 1) * 10 ** len(fixed))
    return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


def repeating_decimals(text: str) -> str:
    """``0.\\overline{6}`` -> ``\\frac{2}{3}`` (module docstring)."""
    if "\\overline" not in text and "\\dot" not in text and "\\bar" not in text:
        return text
    return _REPEATING.sub(_repeating_to_fraction, text)


def angle_brackets(text: str) -> str:
    """``\\langle 1, 2 \\rangle`` -> ``(1, 2)``."""
    if "\\langle" not in text:
        return text
    return re.sub(r"\\rangle(?![a-zA-Z])", ")", re.sub(r"\\langle(?![a-zA-Z])", "(", text))


def empty_set(text: str) -> str:
    """``\\varnothing`` and an empty brace set -> ``\\emptyset``."""
    return _EMPTY_SET.sub(r"\\emptyset ", text).strip() if "\\" in text or "∅" in text else text


def as_value_list(text: str) -> str:
    """The answer as a comma list of its values (module docstring); unchanged if it has none.

    Only one ``\\pm`` is expanded (``a \\pm b`` -> ``a+b, a-b``); an answer with two is left
    as it is, and graded (and refused as a hedge) as written.
    """
    signs = _PLUS_MINUS.findall(text)
    if len(signs) == 1:
        if assigned := _ASSIGNED.match(text):
            text = assigned["rhs"]
        head, tail = _PLUS_MINUS.split(text, maxsplit=1)
        first, second = ("+", "-") if signs[0] in ("\\pm", "±") else ("-", "+")
        head = head.strip()
        return f"{head}{first}{tail.strip()}, {head}{second}{tail.strip()}"
    if not signs and not _RELATION.search(text) and _VALUE_JOINER.search(text):
        return _VALUE_JOINER.sub(", ", text)  # "x < -2 or x > 2" stays a union
    return text


def _closing_parenthesis(text: str) -> int:
    """Where the parenthesis opening ``text`` closes, -1 if never; a comma at its top level
    (a tuple or an interval) counts as never."""
    depth = 0
    for i, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                return i if char == ")" else -1
        elif char == "," and depth == 1:
            return -1
    return -1


def outer_parentheses(text: str) -> str:
    """``((5))`` -> ``5`` (module docstring)."""
    while text.startswith("(") and _closing_parenthesis(text) == len(text) - 1:
        text = text[1:-1].strip()
    return text
