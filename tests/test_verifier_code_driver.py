"""Unit tests of the code verifier's child and parent halves, imported directly (no sandbox).

`rlvr.verifiers.code_driver` encodes the probes' values in the child; `rlvr.verifiers.code_judge`
decodes them, and plans and judges the tests, in the parent. tests/test_verifier_code.py runs
both ends through real sandboxes.
"""

from __future__ import annotations

import ast

import pytest

from rlvr.verifiers import code_driver, code_judge
from rlvr.verifiers.code_driver import (
    RAISED,
    UNSERIALIZABLE,
    VALUE,
    Unserializable,
    encode,
    exc_name,
    make_payload,
    probe_result,
)
from rlvr.verifiers.code_judge import ProtocolError, decode, judge, plan_test, probe_name

LIMITS = [1_000, 100, 5]  # max characters, items, depth


class AlwaysEqual(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


class LyingStr(str):
    def __str__(self) -> str:
        return "forged"


class LyingList(list):
    def __iter__(self):
        return iter([1, 2, 3])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (True, True),
        (255, ["i", "ff"]),
        (-3, ["i", "-3"]),
        (0.5, ["f", "0x1.0000000000000p-1"]),
        (1 + 2j, ["c", "0x1.0000000000000p+0", "0x1.0000000000000p+1"]),
        ("hi", ["s", "hi"]),
        (b"\x00\xff", ["y", "00ff"]),
        ([1, "a"], ["l", [["i", "1"], ["s", "a"]]]),
        ((None,), ["t", [None]]),
        ({7}, ["S", [["i", "7"]]]),
        (frozenset(), ["F", []]),
        ({"k": [True]}, ["d", [[["s", "k"], ["l", [True]]]]]),
    ],
)
def test_encode_writes_plain_data_by_hand(value: object, expected: object) -> None:
    assert encode(value, False, LIMITS) == expected
    assert decode(expected) == value


def test_subclasses_are_converted_through_the_base_type() -> None:
    # the overridden methods play no part: what crosses is the base type's own value
    assert encode(AlwaysEqual(5), False, LIMITS) == ["i", "5"]
    assert encode(LyingStr("real"), False, LIMITS) == ["s", "real"]
    assert encode(LyingList([9]), False, LIMITS) == ["l", [["i", "9"]]]
    assert decode(encode(AlwaysEqual(5), False, LIMITS)) != 6


def test_what_is_not_plain_data_or_too_big_is_refused() -> None:
    with pytest.raises(Unserializable, match="not plain data: object"):
        encode(object(), False, LIMITS)
    with pytest.raises(Unserializable, match="value too large"):
        encode("x" * 2_000, False, LIMITS)
    with pytest.raises(Unserializable, match="value too large"):
        encode(list(range(200)), False, LIMITS)
    with pytest.raises(Unserializable, match="nested too deep"):
        encode([[[[[[[1]]]]]]], False, LIMITS)
    with pytest.raises(Unserializable):
        encode(iter([1]), False, LIMITS)  # an iterator is only read where a call consumes it


def test_iterators_are_materialised_where_a_call_consumes_them() -> None:
    assert encode(map(abs, [-1, -2]), True, LIMITS) == ["l", [["i", "1"], ["i", "2"]]]
    assert encode((i for i in range(2)), True, LIMITS) == ["l", [["i", "0"], ["i", "1"]]]
    with pytest.raises(Unserializable, match="value too large"):
        encode(range(10**9), True, LIMITS)  # read at most max items + 1


def test_probe_results() -> None:
    scope = {"f": lambda x: x + 1, "__builtins__": __builtins__}
    assert probe_result(0, "f(1)", False, scope, LIMITS) == [VALUE, 0, ["i", "2"]]
    assert probe_result(1, "f('a')", False, scope, LIMITS) == [RAISED, 1, "TypeError"]
    assert probe_result(2, "object()", False, scope, LIMITS)[:2] == [UNSERIALIZABLE, 2]
    assert probe_result(3, "(", False, scope, LIMITS) == [RAISED, 3, "SyntaxError"]


def test_payload_and_exception_names() -> None:
    payload = make_payload("x = 1", [("x", False)], 10, 20, 30)
    assert payload == {"code": "x = 1", "probes": [("x", False)], "limits": [10, 20, 30]}
    assert exc_name(ValueError("x")) == "ValueError"

    class Weird(Exception):
        pass

    Weird.__name__ = "W" * 500
    assert exc_name(Weird()) == "W" * 100


def test_decode_refuses_malformed_values() -> None:
    for bad in ["x", [], [3], ["q", []], ["i", "zz"], ["s", 3], ["l", 5], ["i"]]:
        with pytest.raises(ProtocolError):
            decode(bad)
    deep: object = None
    for _ in range(code_judge.MAX_VALUE_DEPTH + 3):
        deep = ["l", [deep]]
    with pytest.raises(ProtocolError, match="too deep"):
        decode(deep)


def test_the_protocol_tags_are_shared() -> None:
    # the tags the parent interprets are the driver's own
    assert code_judge.EXEC_OK is code_driver.EXEC_OK
    assert set(code_driver.PROBE_RESULTS) == {VALUE, RAISED, UNSERIALIZABLE}


def test_plan_and_judge_a_test_by_hand() -> None:
    plan = plan_test("assert f(3) == [1, 2] and len(g()) > 0")
    # the expected list never becomes a probe: only the program's calls do
    assert plan.error is None and plan.strict
    assert plan.probes == [("f(3)", False), ("g()", False)]
    env = {probe_name(0): [1, 2], probe_name(1): "x"}
    assert judge(plan.judge, env) is True
    assert judge(plan.judge, {**env, probe_name(0): [2, 1]}) is False
    assert ast.unparse(plan.judge) == f"{probe_name(0)} == [1, 2] and len({probe_name(1)}) > 0"


def test_long_unbracketed_chains_still_plan() -> None:
    # chains that need no brackets recurse one frame a level, as before the split
    assert plan_test("assert " + "+".join(["f(1)"] * 600) + " > 0").error is None
    assert plan_test("assert " + "-" * 600 + "f(1) == 1").error is None
    assert plan_test("assert x" + "[0]" * 600).error is None
