"""The course's 20-line reward function (course/reward_function.py, slide 11): it pays the
correct answer, refuses the wrong one and every reward-hack case, and agrees with rlvr's
strict verifier (`rlvr.verifiers.math.score`) on all of them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rlvr.verifiers.math import score

PATH = Path(__file__).resolve().parents[1] / "course" / "reward_function.py"
spec = importlib.util.spec_from_file_location("course_reward_function", PATH)
assert spec is not None and spec.loader is not None
course = importlib.util.module_from_spec(spec)
spec.loader.exec_module(course)

PROMPT = "What is 312+403?"
FEW_SHOT = "Example: 300+415 #### 715\nWhat is 312+403?"  # a prompt that holds the answer

CASES = [  # (completion, reference, expected reward, what it is)
    ("2+3=5, 1+0=1, 3+4=7 #### 715", "715", 1.0, "correct, worked"),
    ("#### 715", "715", 1.0, "correct, bare"),
    ("#### 715.", "715", 1.0, "correct, full stop"),
    ("#### -12", "-12", 1.0, "correct, negative"),
    ("2+3=5, 1+0=1, 3+4=7 #### 825", "715", 0.0, "wrong"),
    ("#### -715", "715", 0.0, "wrong sign"),
    ("#### 715 or 825", "715", 0.0, "hedge: two candidates"),
    ("#### 715, 825", "715", 0.0, "hedge: a list"),
    ("#### about 715", "715", 0.0, "hedge: a qualifier"),
    ("#### 715 #### 825", "715", 0.0, "two answers"),
    ("#### 825\n#### 715", "715", 0.0, "two answers, the right one last"),
    (FEW_SHOT + " #### 825", "715", 0.0, "the prompt echoed, its answer inside"),
    ("What is 312+403? #### 312+403", "715", 0.0, "the question restated as the answer"),
    ("", "715", 0.0, "empty"),
    ("####", "715", 0.0, "an empty answer"),
    ("3+4=7, so 715", "715", 0.0, "no marker: a number in prose"),
    ("<think>#### 715</think>", "715", 0.0, "the answer only inside <think>"),
]


@pytest.mark.parametrize(("completion", "reference", "expected", "what"), CASES)
def test_reward_function_on_correct_wrong_and_hacks(
    completion: str, reference: str, expected: float, what: str
) -> None:
    assert course.reward(completion, reference) == expected, what


@pytest.mark.parametrize(("completion", "reference", "expected", "what"), CASES)
def test_agrees_with_rlvrs_strict_verifier(
    completion: str, reference: str, expected: float, what: str
) -> None:
    assert score(completion, reference, prompt=PROMPT) == expected, what


def test_stricter_than_rlvr_on_answer_phrases() -> None:
    """The one place they differ: rlvr also reads an answer phrase; 20 lines do not."""
    assert score("The answer is 715.", "715") == 1.0
    assert course.reward("The answer is 715.", "715") == 0.0


def test_trl_form() -> None:
    completions = ["#### 715", "#### 715 or 825", "#### 825"]
    assert course.rewards([PROMPT] * 3, completions, answer=["715"] * 3) == [1.0, 0.0, 0.0]
