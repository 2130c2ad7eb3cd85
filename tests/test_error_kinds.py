"""The `error_kinds` stage's arithmetic error classes (`rlvr.pipelines.error_kinds`)."""

from __future__ import annotations

import pytest

from rlvr.pipelines.error_kinds import dropped_carry_answers, error_kind, error_shares


def test_dropped_carry_answers_by_hand():
    # 357+468: carries out of columns 1 (7+8=15) and 2 (5+6+1=12); drop the first: 5+6=11 ->
    # 3+4+1=8: 815; drop the second: 725; both: 715 (all carries dropped)
    assert dropped_carry_answers(357, 468) == {"815", "725", "715"}
    assert dropped_carry_answers(123, 456) == set()  # no carries: no such slip


@pytest.mark.parametrize(
    ("completion", "kind"),
    [
        ("<think>7+8+0=15 5+6+0=11 3+4+1=08</think>815", "dropped_carry"),
        ("<think>7+8+0=15 5+6+1=12 3+4+0=07</think>715", "dropped_carry"),
        ("<think>7+8+0=15 5+6+1=12 3+4+1=08</think>826", "wrong_digit"),
        ("<think>7+8+0=15</think>", "format"),
        ("7+8+0=15 825", "format"),
        ("<think></think>1234", "other"),
        ("7+8+0=15 5+6+0=11 3+4+1=08 #### 815", "dropped_carry"),  # the arithmetic task's form
    ],
)
def test_error_kind_of_wrong_completions(completion, kind):
    assert error_kind(completion, {"prompt": "357+468=", "answer": "825"}) == kind


def test_error_shares_count_only_the_errors():
    rows = [{"prompt": "357+468="}] * 3
    out = error_shares(["<think></think>825", "<think></think>815", "x"], rows, [1.0, 0.0, 0.0])
    assert out["errors"] == 2
    assert out["kinds"] == {"dropped_carry": 0.5, "wrong_digit": 0.0, "format": 0.5, "other": 0.0}
