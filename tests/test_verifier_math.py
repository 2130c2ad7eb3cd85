"""Tests for the strict math verifier (rlvr.verifiers.math)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from rlvr.verifiers import math as math_verifier
from rlvr.verifiers.math import extract_final_answer, math_reward, score, verify

LAB = "7+8=15 5+6+1=12 3+4+1=8"  # the lab task's reasoning for the prompt "357+468="


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (f"{LAB} #### 825", "825"),
        ("#### 825\nThanks for reading.", "825"),  # the marker's answer stops at the line end
        (f"{LAB} so the answer is 825", None),  # a number in the reasoning is not an answer
        ("<think>#### 825</think>", None),  # reasoning is never graded
        ("<think>#### 824</think> #### 825", "825"),
        ("<think>scratch #### 825", None),  # unclosed think: no answer was given
        ("sum is 825</think> #### 825", "825"),  # orphan </think>: <think> was in the prompt
        ("#### 825 </think> done", None),  # ...and everything before it is reasoning
        ("The answer is \\boxed{825}.", "825"),
        ("\\fbox{825}", "825"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces stay inside the box
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces are not grouping braces
        ("#### \\boxed{825}", "825"),  # the marker only introduces the box
        ("#### $825$.", "825"),  # math delimiters and a trailing period are dropped
        ("#### **825**", "825"),  # markdown bold
        ("#### 824\nwait, 8+4 carries\n#### 825", "825"),  # self-correction: the last counts
        ("\\boxed{824}\nno:\n#### 825", "825"),  # box then marker: whichever comes last
        ("#### 824\nactually \\boxed{825}", "825"),
        ("\\boxed{825} \\boxed{825}", "825"),  # repeating the same answer is not a hedge
        ("\\boxed{825} #### 825.0", "825.0"),  # same value, different spelling
        ("\\boxed{825}\\boxed{826}", None),  # two different final answers on the final line
        ("\\boxed{825} #### 826", None),
        ("#### 825 #### 826", None),  # self-correction must go on a new line
        ("\\boxed{}", None),  # empty box
        ("#### ", None),  # empty marker
        ("#### 825\n####", None),  # the last answer is empty: nothing to grade
        ("####\n825", None),  # the answer must be on the marker's line
        ("#### 825 then \\boxed{82", None),  # truncated box: the final answer is broken
        ("#### 825 or 826", "825 or 826"),  # hedges inside one answer are judged by verify()
        ("", None),
    ],
)
def test_extract_final_answer(completion: str, expected: str | None) -> None:
    assert extract_final_answer(completion) == expected


def test_extract_final_answer_custom_marker() -> None:
    assert extract_final_answer("Answer: 825", marker="Answer:") == "825"
    assert extract_final_answer("#### 825", marker="Answer:") is None


@pytest.mark.parametrize(
    ("completion", "answer", "reward", "reason"),
    [
        (f"{LAB} #### 825", "825", 1.0, "correct"),
        (f"{LAB} #### 826", "825", 0.0, "wrong"),
        (f"{LAB} 825", "825", 0.0, "no_answer"),  # right number, no marker
        ("<think>#### 825</think> I am not sure.", "825", 0.0, "no_answer"),
        ("<think>#### 825", "825", 0.0, "unclosed_think"),
        ("#### 825 or 826", "825", 0.0, "hedged"),
        ("#### 825 OR 826", "825", 0.0, "hedged"),
        ("\\boxed{825}\\boxed{826}", "825", 0.0, "hedged"),
        ("#### 825 \\pm 1", "825", 0.0, "hedged"),
        ("#### 825 ± 1", "825", 0.0, "hedged"),
        ("#### 825, 826", "825", 0.0, "hedged"),  # a list when one value is asked for
        ("#### 825;826", "825", 0.0, "hedged"),
        ("#### 825 826", "825", 0.0, "hedged"),  # math-verify would read 825826
        ("#### 825 and 826", "825", 0.0, "hedged"),
        ("#### 824 = 825", "825", 0.0, "hedged"),  # a false equation offers two values
        ("#### 1 000", "1000", 0.0, "hedged"),  # a plain space is not a thousands separator
        ("#### 3,4", "3.4", 0.0, "hedged"),  # no decimal comma (math-verify reads 3.4)
        ("#### 824\nwait\n#### 825", "825", 1.0, "correct"),
        ("#### 825\nwait\n#### 824", "825", 0.0, "wrong"),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0, "correct"),
        ("\\boxed{\\frac{1}{3}}", "0.5", 0.0, "wrong"),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0, "correct"),
        ("#### 1,000", "1000", 1.0, "correct"),
        ("#### 1\\,000", "1000", 1.0, "correct"),  # math-verify alone reads 1
        ("#### 1{,}000", "1,000", 1.0, "correct"),
        ("#### 1,000,000", "1000000", 1.0, "correct"),
        ("#### 1,0000", "10000", 0.0, "hedged"),  # not a valid thousands grouping
        ("#### −5", "-5", 1.0, "correct"),  # U+2212 minus; math-verify alone finds nothing
        ("#### −5", "5", 0.0, "wrong"),
        ("#### ８２５", "825", 1.0, "correct"),  # full-width digits
        ("#### +825", "825", 1.0, "correct"),
        ("#### 825.0", "825", 1.0, "correct"),
        ("#### 825.0000001", "825", 0.0, "wrong"),  # exact: no float rounding on plain numbers
        ("#### 1e3", "1000", 1.0, "correct"),
        ("#### 1e3", "1", 0.0, "wrong"),  # math-verify alone reads 1e3 as 1
        ("#### $825$", "825", 1.0, "correct"),
        ("#### \\$825", "825", 1.0, "correct"),  # currency dollar
        ("#### \\text{825}", "825", 1.0, "correct"),
        ("#### x = 825", "825", 1.0, "correct"),  # graded on the last side of the equation
        ("#### 357+468=825", "825", 1.0, "correct"),
        ("#### 357+468", "825", 0.0, "unevaluated"),  # echoing the prompt earns nothing
        ("#### 825 = 357+468", "825", 0.0, "unevaluated"),
        ("#### 2^{10}", "1024", 0.0, "unevaluated"),
        ("#### 825 dollars", "825", 0.0, "wrong"),  # free symbols never equal a number
        ("#### x", "825", 0.0, "wrong"),
        ("#### 825!", "825", 0.0, "wrong"),  # a factorial, not an exclamation
        ("\\boxed{}", "825", 0.0, "no_answer"),
        ("#### $$", "825", 0.0, "no_answer"),
        ("#### x =", "825", 0.0, "no_answer"),
        ("\\boxed{x^2+1}", "1+x^2", 1.0, "correct"),  # symbolic reference: math-verify decides
        ("\\boxed{x^2+2}", "1+x^2", 0.0, "wrong"),
        ("\\boxed{1, 2}", "1,2", 1.0, "correct"),  # a list is fine when the reference is one
        ("\\boxed{1 \\pm \\sqrt{2}}", "1 \\pm \\sqrt{2}", 1.0, "correct"),  # reference hedges too
        ("#### 825", "", 0.0, "error"),  # empty reference
        ("#### 825", "\\frac{", 0.0, "error"),  # unparsable reference
    ],
)
def test_verify(completion: str, answer: str, reward: float, reason: str) -> None:
    got_reward, parts = verify(completion, answer)
    assert (got_reward, parts["reason"]) == (reward, reason)
    assert score(completion, answer) == reward


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        (None, "825"),
        (825, "825"),
        (b"#### 825", "825"),
        ("#### 825", None),
        ("#### 825", ["825"]),
        ([], "825"),
        ([{"role": "assistant"}], "825"),  # message without content
        ([{"role": "assistant", "content": None}], "825"),
    ],
)
def test_bad_input_scores_zero_without_raising(completion: Any, answer: Any) -> None:
    assert verify(completion, answer) == (
        0.0,
        {"extracted": None, "reason": "error", "method": None},
    )


def test_numeric_reference_types_are_accepted() -> None:
    assert score("#### 825", 825) == 1.0  # type: ignore[arg-type]
    assert score("#### 0.5", 0.5) == 1.0  # type: ignore[arg-type]
    assert score("#### 1", True) == 0.0  # type: ignore[arg-type]  # a bool is not a number


def test_verify_reports_extracted_answer_and_method() -> None:
    assert verify(f"{LAB} #### 825", "825") == (
        1.0,
        {"extracted": "825", "reason": "correct", "method": "exact"},
    )
    assert verify("\\boxed{\\frac{1}{2}}", "0.5")[1]["method"] == "math_verify"


def test_integer_answers_never_reach_math_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object) -> bool:
        raise AssertionError("the fast path must not call math-verify")

    monkeypatch.setattr(math_verifier, "_symbolic_match", fail)
    assert score(f"{LAB} #### 825", "825") == 1.0
    assert score("#### 1,000", "1000") == 1.0
    assert score("#### 826", "825") == 0.0
    # ...while anything else does: the failure inside is caught and scored as an error.
    assert verify("\\boxed{\\frac{1}{2}}", "0.5") == (
        0.0,
        {"extracted": "\\frac{1}{2}", "reason": "error", "method": "math_verify"},
    )


def test_internal_errors_score_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object) -> None:
        raise RecursionError("sympy blew up")

    monkeypatch.setattr(math_verifier, "_locate_final_answer", boom)
    assert verify("#### 825", "825") == (
        0.0,
        {"extracted": None, "reason": "error", "method": None},
    )


def test_math_reward_trl_batch() -> None:
    completions = [f"{LAB} #### 825", f"{LAB} #### 826", "825", None]
    answers = ["825"] * 4
    prompts = ["357+468="] * 4
    assert math_reward(prompts, completions, answer=answers, trainer_state=None) == [
        1.0,
        0.0,
        0.0,
        0.0,
    ]


def test_math_reward_conversational_completions() -> None:
    prompts = [[{"role": "user", "content": "357+468="}]] * 3
    completions = [
        [{"role": "assistant", "content": f"{LAB} #### 825"}],
        [{"role": "assistant", "content": "#### 824"}],
        [{"role": "assistant", "content": [{"type": "text", "text": "#### 825"}]}],
    ]
    assert math_reward(prompts, completions, answer=["825"] * 3) == [1.0, 0.0, 1.0]


def test_math_reward_rejects_misaligned_columns() -> None:
    with pytest.raises(ValueError):
        math_reward(["p"], ["#### 825", "#### 825"], answer=["825"])


@pytest.mark.parametrize(
    ("completion", "answer", "reward"),
    [
        ("#### 825", "825", 1.0),  # fast path
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),  # math-verify path: no signal.alarm off-main
        ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
    ],
)
def test_score_from_worker_thread(completion: str, answer: str, reward: float) -> None:
    math_verifier._parse_boxed.cache_clear()  # make the worker really parse
    results: list[tuple[float, dict]] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.append(verify(completion, answer))
        except BaseException as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join(timeout=30)
    assert not errors
    assert results[0][0] == reward
    assert results[0][1]["reason"] in {"correct", "wrong"}  # not "error": math-verify ran
