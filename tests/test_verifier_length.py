"""Every verifier grades a 200 kB completion in under a second, wherever the answer sits.

Issue 23: the math verifier rescanned the completion once per answer candidate, so a right
``\\boxed{}`` answer followed by 200 kB of filler took more than two minutes. These tests hold
each in-process verifier (and the code verifier's extraction, the part that reads the
completion) under 1 s at 200 kB with the answer first, last and absent, in plain prose and in
filler full of what the extractors look for (numbers, ``$...$``, answer phrases, markers,
tags). The bound is loose (these take 1-350 ms here, `benchmarks/bench_verifiers.py
--lengths` has the sweep); it fails only on work that grows faster than the text. Verdicts
are asserted too, so a verifier that gave up early would fail rather than pass fast.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from rlvr.verifiers import code, exact, tool, weak
from rlvr.verifiers import format as format_verifier
from rlvr.verifiers import math as math_verifier

SIZE = 200_000
BOUND_S = 1.0

FILLERS = {
    "prose": "Let me think about this step by step, carefully checking each part. ",
    "hostile": "Check: 12 + 30 = 42, and $x^2 = 4$ gives x = 2. Wait, maybe the answer is 7? ",
    "tags": '<tool_call> {"name": ``` <think> \\boxed{ $ #### the answer is ',
}

# name -> (grade(completion) -> verdict, the answer as written, the verdicts in prose with the
# answer first, last and absent)
VERIFIERS: dict[str, tuple[Callable[[str], Any], str, tuple[Any, Any, Any]]] = {
    "math": (
        lambda c: math_verifier.score(c, "\\frac{1}{2}"),
        "So the answer is \\boxed{\\frac{1}{2}}.",
        (1.0, 1.0, 0.0),
    ),
    "exact": (lambda c: exact.score(c, "42"), "#### 42", (1.0, 1.0, 0.0)),
    "weak": (lambda c: weak.score(c, "42"), "\\boxed{42}", (1.0, 1.0, 0.0)),
    "format": (
        lambda c: format_verifier.score(c),
        "<think>adding the two</think> 42",
        (1.0, 0.0, 0.0),  # last: text before <think> breaks the format
    ),
    "tool": (
        lambda c: tool.verify(c, 3)[1]["reason"],
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
        ("unknown_tool", "unknown_tool", "no_call"),  # parsed; no tool named add exists
    ),
    "code": (
        lambda c: code.extract_code(c) == "def f():\n    return 1\n",
        "```python\ndef f():\n    return 1\n```",
        (True, True, False),
    ),
}


def completion(answer: str, where: str, filler: str) -> str:
    body = (filler * (SIZE // len(filler) + 1))[:SIZE]
    return {"first": f"{answer}\n{body}", "last": f"{body}\n{answer}", "absent": body}[where]


@pytest.mark.parametrize("filler", sorted(FILLERS))
@pytest.mark.parametrize("where", ["first", "last", "absent"])
@pytest.mark.parametrize("name", sorted(VERIFIERS))
def test_200_kB_graded_under_a_second(name: str, where: str, filler: str) -> None:
    grade, answer, verdicts = VERIFIERS[name]
    text = completion(answer, where, FILLERS[filler])
    grade(text[:2_000])  # warm imports and caches on another text
    start = time.perf_counter()
    verdict = grade(text)
    elapsed = time.perf_counter() - start
    assert elapsed < BOUND_S, f"{name}, answer {where}, {filler} filler: {elapsed:.2f} s"
    if filler == "prose":
        assert verdict == verdicts[["first", "last", "absent"].index(where)]
