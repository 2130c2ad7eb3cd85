"""Tests for issue 16's policy changes of the strict math verifier, one table per category.

Every right answer has its negative twin next to it: the hedge, the echo, the spray, the
number in prose without an answer phrase. Expected values are hand-graded.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rlvr.verifiers.answer_phrases import find_phrases, phrase_answer
from rlvr.verifiers.files import grade_one
from rlvr.verifiers.math import explain, math_reward, verify
from rlvr.verifiers.math_forms import (
    as_value_list,
    empty_set,
    outer_parentheses,
    repeating_decimals,
    vulgar_fractions,
)

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "tests" / "data" / "math_verifier_cases.jsonl"


def check(completion: str, answer: Any, reward: float, reason: str, **kwargs: Any) -> None:
    got_reward, parts = verify(completion, answer, **kwargs)
    assert (got_reward, parts["reason"]) == (reward, reason), parts


# --- 1. answer phrases ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "answer", "reward", "reason"),
    [
        ("Adding the two piles gives the total. The answer is 81.", "81", 1.0, "correct"),
        ("Adding the two piles gives 81 in total.", "81", 0.0, "no_answer"),  # prose: twin
        ("Final Answer: The final answer is $81$. I hope it is correct.", "81", 1.0, "correct"),
        ("Final Answer: The final answer is $18$. I hope it is correct.", "81", 0.0, "wrong"),
        ("**Final answer:** 81", "81", 1.0, "correct"),
        ("**Final answer:** 81 or 82", "81", 0.0, "hedged"),
        ("**Answer: 81**", "81", 1.0, "correct"),
        ("**Answer: 80**", "81", 0.0, "wrong"),
        ("The answer is: 81", "81", 1.0, "correct"),
        ("The answer is: 81, 82", "81", 0.0, "hedged"),
        ("So the final answer is: 81", "81", 1.0, "correct"),
        ("So the final answer is probably 81", "81", 0.0, "hedged"),
        ("The answer is:\n\n81", "81", 1.0, "correct"),  # the answer on the next line
        ("## Final Answer\n81", "81", 1.0, "correct"),  # a heading line
        ("The answer is $\\frac{3}{8}$, which is less than a half.", "0.375", 1.0, "correct"),
        ("The answer is 81, not 80.", "81", 1.0, "correct"),
        ("The answer is 81 (I checked it twice).", "81", 1.0, "correct"),
        ("If the answer is 81, the sum would be odd.", "81", 0.0, "no_answer"),  # hypothesis
        ("<think>The answer is 81.</think>", "81", 0.0, "no_answer"),  # the <think> rule
        ("<think>The answer is 80.</think>The answer is 81.", "81", 1.0, "correct"),
        ("The answer is 80. Hmm, I missed one: the answer is 81.", "81", 1.0, "correct"),
        ("The answer is 80. Hmm, I missed one: the answer is 81.", "80", 0.0, "wrong"),
        ("The answer is 80. The answer is 81.", "81", 0.0, "hedged"),  # two, no correction
        ("The answer is between 80 and 90.", "81", 0.0, "hedged"),
        ("The answer is not 80.", "81", 0.0, "hedged"),
        ("Answer: 81", "81", 1.0, "correct"),  # also the DAPO marker, counted once
    ],
)
def test_answer_phrases(completion: str, answer: str, reward: float, reason: str) -> None:
    check(completion, answer, reward, reason)


def test_dapo_marker_and_answer_phrase_are_one_candidate() -> None:
    assert verify("Answer: 81", "81", "Answer:") == (
        1.0,
        {"extracted": "81", "reason": "correct", "method": "exact"},
    )
    check("Answer: 80\nno wait, recount\nAnswer: 81", "81", 1.0, "correct", marker="Answer:")


@pytest.mark.parametrize(
    ("text", "phrases"),
    [
        ("so the answer is 5", ["the answer is "]),
        ("Final Answer: The final answer is $5$.", ["Final Answer:", "The final answer is "]),
        ("**Final answer:** 5", ["Final answer:"]),
        ("my answer would be 5", ["my answer would be "]),
        ("### Final Answer\n5", ["Final Answer"]),
        ("we answer the question; answers vary", []),  # no phrase
        ("the answer to part (a)", []),
    ],
)
def test_find_phrases(text: str, phrases: list[str]) -> None:
    assert [text[a:b] for a, b in find_phrases(text)] == phrases


@pytest.mark.parametrize(
    ("after", "answer"),
    [
        (" $64$. I hope it is correct.", "64"),
        (" $2,500.", "$2,500"),  # currency: no closing $
        (" $5 and $6 each.", "$5 and $6 each"),  # two amounts of money
        (" 64 because 8 squared is 64.", "64"),
        (": **64**", "64**"),  # the caller strips the emphasis
        (" \\(x^2\\) here", "x^2"),
    ],
)
def test_phrase_answer(after: str, answer: str) -> None:
    assert phrase_answer(after)[0] == answer


# --- 2. equal but unevaluated expressions, and the echo ------------------------------------


@pytest.mark.parametrize(
    ("completion", "answer", "reward", "reason"),
    [
        ("\\boxed{3^{4}}", "81", 1.0, "correct"),
        ("\\boxed{3^{5}}", "81", 0.0, "wrong"),
        ("\\boxed{27^{4/3}}", "81", 1.0, "correct"),
        ("\\boxed{\\log_2 64}", "6", 1.0, "correct"),
        ("\\boxed{\\log_2 32}", "6", 0.0, "wrong"),
        ("\\boxed{\\ln e^{3}}", "3", 1.0, "correct"),
        ("\\boxed{e^{i\\pi}}", "-1", 1.0, "correct"),  # i is the imaginary unit
        ("\\boxed{e^{i\\pi}}", "1", 0.0, "wrong"),
        ("\\boxed{0.1+0.2}", "0.3", 1.0, "correct"),  # exact decimals
        ("\\boxed{0.1+0.2}", "0.30000000000000004", 0.0, "wrong"),
        ("\\boxed{\\int_0^1 2x\\,dx}", "1", 1.0, "correct"),
        ("\\boxed{\\int_0^1 x\\,dx}", "1", 0.0, "wrong"),
        ("#### 4+4+4", "12", 1.0, "correct"),  # no prompt known: evaluated
        ("What is 4+4+4? #### 4+4+4", "12", 0.0, "unevaluated"),  # ...unless it asks it itself
        ("#### 4+4+5", "12", 0.0, "wrong"),
        ("\\boxed{" + "+".join(str(k) for k in range(1, 31)) + "}", "465", 1.0, "correct"),
        ("\\boxed{" + "+".join(str(k) for k in range(1, 30)) + "}", "465", 0.0, "wrong"),
        ("\\boxed{10^{10^{10}}}", "5", 0.0, "timeout"),  # the hard time limit stays
    ],
)
def test_evaluated_expressions(completion: str, answer: str, reward: float, reason: str) -> None:
    check(completion, answer, reward, reason, timeout_s=1.0)


@pytest.mark.parametrize(
    ("completion", "answer", "prompt", "reward", "reason"),
    [
        ("#### 17*23", "391", "Compute 17*23.", 0.0, "unevaluated"),  # the echo
        ("#### 391", "391", "Compute 17*23.", 1.0, "correct"),
        ("\\boxed{23 \\times 17}", "391", "What is $17 \\times 23$?", 0.0, "unevaluated"),
        ("\\boxed{\\frac{1}{2}+\\frac{1}{3}}", "\\frac56", "Add 1/2 and 1/3.", 0.0, "unevaluated"),
        ("\\boxed{\\frac{5}{6}}", "\\frac56", "Add 1/2 and 1/3.", 1.0, "correct"),
        ("\\boxed{2^{8}}", "256", "How many subsets has a set of eight elements?", 1.0, "correct"),
        ("\\boxed{2^{7}}", "256", "How many subsets has a set of eight elements?", 0.0, "wrong"),
        ("#### 12*52", "624", "He writes 12 pages a week. How many a year?", 1.0, "correct"),
    ],
)
def test_echo_of_the_prompt(
    completion: str, answer: str, prompt: str, reward: float, reason: str
) -> None:
    check(completion, answer, reward, reason, prompt=prompt)


def test_math_reward_passes_each_rows_prompt() -> None:
    prompts = ["Compute 17*23.", [{"role": "user", "content": "Compute 17*23."}], "Compute it."]
    completions = ["#### 17*23", [{"role": "assistant", "content": "#### 17*23"}], "#### 17*23"]
    # the third prompt does not hold the expression: evaluated, correct
    assert math_reward(prompts, completions, answer=["391"] * 3) == [0.0, 0.0, 1.0]


# --- 3. self-correction with boxes ---------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "answer", "reward", "reason"),
    [
        (
            "So \\boxed{28}. Wait, I forgot the corner squares; adding them: \\boxed{32}.",
            "32",
            1.0,
            "correct",
        ),  # fmt: skip
        (
            "So \\boxed{28}. Wait, I forgot the corner squares; adding them: \\boxed{32}.",
            "28",
            0.0,
            "wrong",
        ),  # fmt: skip
        ("\\boxed{x = 7}, so \\boxed{7}", "7", 1.0, "correct"),  # consistent boxes
        ("\\boxed{x = 7}, \\boxed{8}", "7", 0.0, "hedged"),  # a spray
        ("The width is \\boxed{4}, so the area is 4 \\cdot 9 = \\boxed{36}.", "36", 1.0, "correct"),
        (
            "\\boxed{28}\n\nOn reflection I double counted; the final answer is 24.",
            "24",
            1.0,
            "correct",
        ),  # fmt: skip
        ("\\boxed{28} or \\boxed{24}", "24", 0.0, "hedged"),
        ("It might be \\boxed{28}, or it could be \\boxed{24}.", "24", 0.0, "hedged"),
        ("\\boxed{28}. Alternatively \\boxed{24}.", "24", 0.0, "hedged"),
        ("\\boxed{22}\n\\boxed{24}\n\\boxed{26}", "24", 0.0, "hedged"),  # a spray of three
        ("\\boxed{24} \\boxed{24.0}", "24", 1.0, "correct"),
    ],
)
def test_self_correction(completion: str, answer: str, reward: float, reason: str) -> None:
    check(completion, answer, reward, reason)


# --- 4. equivalent forms -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "answer", "reward", "reason"),
    [
        ("\\boxed{x = \\pm 5}", "5, -5", 1.0, "correct"),
        ("\\boxed{x = \\pm 5}", "5", 0.0, "hedged"),  # the hedge twin
        ("\\boxed{x = \\pm 5}", "5, -4", 0.0, "wrong"),
        ("\\boxed{x = 5 \\text{ or } x = -5}", "-5, 5", 1.0, "correct"),
        ("\\boxed{x = 5 \\text{ or } x = -5}", "5", 0.0, "hedged"),
        ("The answer is x = 2 or x = 9.", "9, 2", 1.0, "correct"),
        ("\\boxed{2, 9}", "x = 2 \\text{ or } x = 9", 1.0, "correct"),
        ("\\boxed{[-1, 4]}", "-1 \\le x \\le 4", 1.0, "correct"),
        ("\\boxed{(-1, 4]}", "-1 \\le x \\le 4", 0.0, "wrong"),
        ("\\boxed{\\varnothing}", "\\emptyset", 1.0, "correct"),
        ("\\boxed{\\{0\\}}", "\\varnothing", 0.0, "wrong"),
        ("\\boxed{0.\\overline{3}}", "\\frac13", 1.0, "correct"),
        ("\\boxed{0.333}", "\\frac13", 0.0, "wrong"),  # a written-out decimal stays exact
        ("\\boxed{2}", "\\sum_{n=0}^{\\infty} \\left(\\frac{1}{2}\\right)^n", 1.0, "correct"),
        ("\\boxed{\\frac{1}{1-x}}", "\\sum_{n=0}^{\\infty} x^n", 1.0, "correct"),
        ("\\boxed{\\frac{1}{1+x}}", "\\sum_{n=0}^{\\infty} x^n", 0.0, "wrong"),
        ("\\boxed{\\frac{1}{2} b h}", "b h / 2", 1.0, "correct"),  # h is a height, not hours
        ("\\boxed{b h}", "b h / 2", 0.0, "wrong"),
        ("\\boxed{\\pi r^2}", "\\pi r^2 h", 0.0, "wrong"),  # math-verify alone: correct
        ("\\boxed{2 m + 1}", "1 + 2m", 1.0, "correct"),  # m is a variable, not metres
        ("\\boxed{\\begin{pmatrix} 2 \\\\ -1 \\end{pmatrix}}", "(2, -1)", 1.0, "correct"),
        ("\\boxed{\\begin{pmatrix} -1 \\\\ 2 \\end{pmatrix}}", "(2, -1)", 0.0, "wrong"),
        ("\\boxed{(2, -1, 0)}", "\\begin{pmatrix} 2 \\\\ -1 \\\\ 0 \\end{pmatrix}", 1.0, "correct"),
    ],
)
def test_equivalent_forms(completion: str, answer: str, reward: float, reason: str) -> None:
    check(completion, answer, reward, reason)


# --- 5. format -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "answer", "reward", "reason"),
    [
        ("so \\boxed 7.", "7", 1.0, "correct"),  # brace-less \boxed
        ("so \\boxed 6.", "7", 0.0, "wrong"),
        ("\\boxed7", "7", 1.0, "correct"),
        ("The answer is $3,750.", "3750", 1.0, "correct"),  # currency in an answer phrase
        ("The answer is $3,750 or $3,800.", "3750", 0.0, "hedged"),
        ("It costs $3,750.", "3750", 0.0, "no_answer"),  # prose: twin
        ("The answer is 35 percent.", "35", 1.0, "correct"),
        ("The answer is 35 percent.", "0.35", 1.0, "correct"),
        ("The answer is 53 percent.", "35", 0.0, "wrong"),
        ("\\boxed{⅜}", "0.375", 1.0, "correct"),  # vulgar fractions
        ("\\boxed{⅝}", "0.375", 0.0, "wrong"),
        ("#### 3¼", "3.25", 1.0, "correct"),  # a mixed number
        ("\\boxed{(((7)))}", "7", 1.0, "correct"),
        ("\\boxed{(C) 12}", "C", 1.0, "correct"),  # a choice label with its option text
        ("\\boxed{(D) 12}", "C", 0.0, "wrong"),
    ],
)
def test_format(completion: str, answer: str, reward: float, reason: str) -> None:
    check(completion, answer, reward, reason)


@pytest.mark.parametrize(
    ("function", "text", "expected"),
    [
        (vulgar_fractions, "2½", "2\\frac{1}{2}"),
        (repeating_decimals, "0.1\\overline{6}", "\\frac{1}{6}"),
        (repeating_decimals, "1.\\overline{142857}", "\\frac{8}{7}"),
        (repeating_decimals, "0.\\dot{3}", "\\frac{1}{3}"),
        (empty_set, "\\{ \\}", "\\emptyset"),
        (as_value_list, "x = 1 \\pm \\sqrt{2}", "1+\\sqrt{2}, 1-\\sqrt{2}"),
        (as_value_list, "x = 3 \\text{ or } x = -3", "x = 3, x = -3"),
        (as_value_list, "1 \\pm 2 \\pm 3", "1 \\pm 2 \\pm 3"),  # two: left as written
        (outer_parentheses, "((x+1))", "x+1"),
        (outer_parentheses, "(1, 2)", "(1, 2)"),  # a tuple keeps its parentheses
        (outer_parentheses, "(1)(2)", "(1)(2)"),
    ],
)
def test_form_rewrites(function: Any, text: str, expected: str) -> None:
    assert function(text) == expected


# --- explain -------------------------------------------------------------------------------


def test_explain_names_the_deciding_rules() -> None:
    why = explain("Final Answer: The final answer is $2^{6}$. I hope it is correct.", "64")
    lines = why.splitlines()
    # "Final Answer:" only introduces the phrase after it on its line
    assert lines[0] == "1 candidate(s) (phrase at char 14); the last one counts"
    assert lines[1] == "phrase at char 14 -> '2^{6}'"
    assert lines[2].startswith("math-verify") and lines[2].endswith("-> correct")
    assert lines[-1] == "reward 1 (correct)"
    assert explain("#### 357+468", "825", prompt="357+468=").splitlines()[-2:] == [
        "'357+468' restates the question's expression -> unevaluated",
        "reward 0 (unevaluated)",
    ]
    assert "a spray" in explain("\\boxed{3} or \\boxed{4}", "4")
    assert explain("we get 5", "5").splitlines() == [
        "no \\boxed{}, no '####' and no answer phrase outside <think>",
        "reward 0 (no_answer)",
    ]


def test_grade_one_explains_and_passes_the_prompt() -> None:
    reward, parts = grade_one("math", "#### 17*23", "391", prompt="Compute 17*23.", explain=True)
    assert (reward, parts["reason"]) == (0.0, "unevaluated")
    assert parts["explain"].endswith("reward 0 (unevaluated)")
    assert grade_one("math", "#### 17*23", "391")[0] == 1.0  # no prompt: evaluated
    assert "explain" not in grade_one("math", "#### 391", "391")[1]


# --- the held-out-style set ----------------------------------------------------------------


def _cases() -> list[dict[str, Any]]:
    return [json.loads(line) for line in CASES.read_text().splitlines() if line.strip()]


def test_the_case_file_covers_22_categories_with_both_verdicts() -> None:
    cases = _cases()
    assert len(cases) >= 300
    by_category = Counter(case["category"] for case in cases)
    assert len(by_category) == 22 and min(by_category.values()) >= 10
    for category in by_category:
        assert {c["expected"] for c in cases if c["category"] == category} == {0, 1}, category


def test_accuracy_on_the_hand_graded_cases() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from verifier_accuracy import rlvr_decision, tally, totals
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    cases = _cases()
    table, misses = tally(cases, rlvr_decision)
    n, right, false_accepts, _ = totals(table)
    assert right / n >= 0.97, misses
    assert false_accepts <= 1, [case for case, got in misses if got == 1]
    assert table["reward_hack"][2] == 0, misses  # every hack refused
