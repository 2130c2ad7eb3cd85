"""Answer phrases ("The final answer is 64.") and the words that tell a correction from a hedge.

The strict math verifier (`rlvr.verifiers.math`) takes the last explicit answer of a completion.
Besides ``\\boxed{}`` and the task's marker, an explicit answer is one of these phrases,
case-insensitive, followed by the answer on the same line (or, when nothing follows the phrase
on its line, on the next non-blank line):

  * ``the answer is``, ``the final answer is``, ``the correct answer is``, ``my answer is``,
    ``the answer would be``, ``answers are`` (with or without a colon after them);
  * ``final answer:``, ``answer:`` (also as ``**Answer:**``, ``**Final answer:** 64`` and
    ``**Answer: 64**``; markdown emphasis is removed), and a line that is only a heading
    ``Final Answer`` (``## Final Answer``, ``**Final Answer**``);
  * Minerva's ``Final Answer: The final answer is $64$. I hope it is correct.`` is the phrase
    ``Final Answer:`` introducing the phrase ``The final answer is``: the second one counts.

A phrase after "if", "suppose", "assume", "whether" or "check" earlier in its sentence is a
hypothesis, not an answer (``if the answer is 5, then ...``), and is not a candidate.

What the phrase's answer is (`phrase_answer`): a math span that opens right after the phrase
(``$64$``, ``\\(64\\)``, ``\\[64\\]``, ``$$64$$``) is the answer; otherwise the text up to the
end of the sentence (``.``, ``!`` or ``?`` before a space, or a clause such as ``, which``,
``because``, ``since``, ``so``, ``, not``, or a parenthesized remark ``(I checked it)``). A
``$`` before a number that no ``$`` closes is a currency sign (``The answer is $2,500.``), and so
is a ``$`` whose closing ``$`` comes right before a number (``$5 and $6``).

`hedge_opening` finds an answer that opens with a hedge ("probably 5", "about 5", "between 4 and
6", "not 4"); `joins_as_spray` decides whether the text between two candidates leaves them both
standing (a spray: "\\boxed{3} or maybe \\boxed{4}") or makes the later replace the earlier (a
correction: "\\boxed{41}. Wait, I dropped a term: \\boxed{43}").
"""

from __future__ import annotations

import re

__all__ = [
    "correction_in",
    "find_phrases",
    "hedge_opening",
    "is_hypothesis",
    "joins_as_spray",
    "phrase_answer",
]

# Around each "answer" (found with str.find: one regex over the whole text costs ~0.5 ms a
# page): what may stand before it, and what must follow it.
# the words before "answer", read backwards from it (an anchored match is fast): "the final ",
# "my ", "final "
_BEFORE_REVERSED = re.compile(
    r"\s+(?:(?:lanif|tcerroc|tcaxe)\s+)?(?P<det>eht|ym|ruo)(?![a-z])|\s+lanif(?![a-z])"
)
_VERB = re.compile(r"s?\s+(?:is|are|would\s+be|should\s+be|will\s+be)(?![a-z])\s*:?")
_COLON = re.compile(r"s?\s*\**\s*:")
_HEADING = re.compile(r"[ \t]*(?:#{1,6}[ \t]*)?\**[ \t]*final\s+answers?[ \t]*\**[ \t]*:?\**[ \t]*")
_LOOKBEHIND_CHARS = 24
_HYPOTHESIS = re.compile(r"\b(?:if|suppose|assume|assuming|whether|check|verify)\b", re.IGNORECASE)
_SENTENCE_START = re.compile(r"[.!?](?:\s|$)|\n")

_MATH_SPANS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))
# (?<!\s): a clause's whitespace is tried from where its run starts only (the leftmost match
# is the same); tried from every space of a long run, each try rescanned the rest of the run
_SENTENCE_END = re.compile(
    r"[.!?](?=\s|$)"
    r"|,?(?<!\s)\s+(?:which|because|since|as|so|hence|thus|therefore|where|given|meaning|"
    r"i\.e\.|e\.g\.|I\s+hope)\b"
    r"|,\s*(?:and\s+)?not\b"  # "825, not 824"
    r"|(?<!\s)\s+\((?=[A-Za-z][A-Za-z' ]{2,})",  # "825 (I checked it twice)": a remark
    re.IGNORECASE,
)
_HEDGE_OPENING = re.compile(
    r"^(?:\*|\s)*(?:probably|maybe|perhaps|possibly|likely|approximately|approx\.?|about|"
    r"around|roughly|nearly|almost|at\s+least|at\s+most|between|either|not|"
    r"less\s+than|more\s+than|greater\s+than|over|under)\b",
    re.IGNORECASE,
)

# Between two candidates: a hedge word keeps both standing (a spray), a correction word
# makes the later one replace the earlier.
_HEDGE_CUE = re.compile(
    r"\b(?:or|either|maybe|perhaps|possibly|alternatively|otherwise|might|could)\b", re.IGNORECASE
)
_CORRECTION_CUE = re.compile(
    r"\b(?:wait|actually|correct(?:ion|ing|ed)?|mistake|wrong|error|re-?do(?:ing)?|"
    r"re-?comput\w*|re-?check\w*|re-?calculat\w*|reconsider\w*|instead|oops|sorry|no|"
    r"fix\w*|reflection|dropped|forgot|missed|hmm|let\s+me)\b",
    re.IGNORECASE,
)
_MAX_HEDGED_GAP_CHARS = 80


def find_phrases(text: str) -> list[tuple[int, int]]:
    """(start, end) of every answer phrase in ``text`` (module docstring), in order."""
    lower = text.lower()
    phrases: list[tuple[int, int]] = []
    pos = 0
    line_start, line_end, heading = 0, -1, False  # the line of the last heading check
    while (found := lower.find("answer", pos)) != -1:
        pos = found + 6
        if found and lower[found - 1].isalnum():
            continue  # "reanswer"
        window = lower[max(0, found - _LOOKBEHIND_CHARS) : found][::-1]
        before = _BEFORE_REVERSED.match(window)
        start = found - before.end() if before else found
        if (colon := _COLON.match(lower, pos)) and not (before and before["det"]):
            phrases.append((start, colon.end()))  # "Answer:", "Final answer:", "**Answer:**"
        elif before and (verb := _VERB.match(lower, pos)):
            phrases.append((start, verb.end()))  # "the answer is", "final answer is"
        elif before and not before["det"]:
            if found >= line_end:  # a new line: its bounds and heading test, once per line
                line_start = lower.rfind("\n", 0, found) + 1
                line_end = lower.find("\n", found)
                line_end = len(lower) if line_end == -1 else line_end
                heading = bool(_HEADING.fullmatch(lower, line_start, line_end))
            if heading:
                phrases.append((start, line_end))  # "## Final Answer" on a line of its own
    return phrases


def is_hypothesis(text: str, start: int) -> bool:
    """Whether the phrase at ``start`` follows "if"/"suppose"/... earlier in its sentence."""
    sentence_start = 0
    for found in _SENTENCE_START.finditer(text, max(0, start - 200), start):
        sentence_start = found.end()
    return bool(_HYPOTHESIS.search(text, max(sentence_start, start - 200), start))


def _math_span(text: str) -> tuple[str, int] | None:
    """(inside, length) of a math span opening ``text``; None if none opens it or it is
    currency."""
    for opening, closing in _MATH_SPANS:
        if not text.startswith(opening):
            continue
        end = text.find(closing, len(opening))
        if end == -1:
            return None
        after = text[end + len(closing) :]
        if opening == "$" and re.match(r"\s*\d", after) and re.match(r"\s*\d", text[1:]):
            return None  # "$5 and $6": two amounts of money, not a math span
        return text[len(opening) : end], end + len(closing)
    return None


def phrase_answer(text: str) -> tuple[str, int]:
    """(the answer a phrase introduces, how many characters of ``text`` it used), from the
    text after the phrase (module docstring)."""
    stripped = text.lstrip(" \t*:")
    offset = len(text) - len(stripped)
    if span := _math_span(stripped):
        return span[0], offset + span[1]
    if end := _SENTENCE_END.search(stripped):
        return stripped[: end.start()].strip(), offset + end.start()
    return stripped.strip(), len(text)


def hedge_opening(answer: str) -> bool:
    """Whether an answer opens with a hedge ("probably 5", "between 4 and 6", "not 4")."""
    return bool(_HEDGE_OPENING.match(answer))


def correction_in(gap: str) -> bool:
    """Whether the text between two candidates retracts the earlier one ("Wait, ...")."""
    return bool(_CORRECTION_CUE.search(gap))


def joins_as_spray(gap: str) -> bool:
    """Whether words between two candidates keep both standing: a short gap with a hedge word
    ("or", "maybe", "alternatively", ...) and no correction word."""
    return (
        len(gap) <= _MAX_HEDGED_GAP_CHARS
        and bool(_HEDGE_CUE.search(gap))
        and not correction_in(gap)
    )
