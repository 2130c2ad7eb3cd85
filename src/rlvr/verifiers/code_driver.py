"""The code verifier's driver: runs the program, then the test's probes, in a sandboxed child.

Standard library only, nothing from rlvr: `rlvr.verifiers.code` sends this file's source to the
sandbox (`rlvr.verifiers.sandbox.run_python_many`), whose harness executes it in each fresh
child, after the privileges are dropped, and calls ``main(payload, emit)``. Importing it only
defines names: the parent takes the protocol from here, and tests call `encode` directly.

Protocol. The payload is `make_payload`'s dict. ``main`` emits, in order: ``[EXEC_OK]`` (the
program ran to its end; also the sandbox's stop marker) or ``[EXEC_ERROR, exception type]``
(then it exits); then for each probe one of ``[VALUE, index, encoded]``,
``[RAISED, index, exception type]`` or ``[UNSERIALIZABLE, index, why]``. An encoded value is
None, a bool, or a list ``[tag, ...]``: ``[INT, hex digits]``, ``[FLOAT, float.hex]``,
``[COMPLEX, real.hex, imag.hex]``, ``[STR, text]``, ``[BYTES, hex]``, ``[DICT, [[key, value],
...]]``, and ``[LIST | TUPLE | SET | FROZENSET, [item, ...]]``.

Everything the untrusted program could replace is captured before it runs: the type checks
and conversions below are the base types' own methods, taken at import, and the builtins are
restored to their state before the program ran. What this child says is still the program's
word (it shares the process); the parent compares the values itself.
"""

from __future__ import annotations

import builtins
import itertools
import os
import types

TYPE_CHECKING = False  # typing is not imported: every test's child would pay for it
if TYPE_CHECKING:
    from collections.abc import Callable

# --- protocol (rlvr.verifiers.code and code_judge import these) -------------------------------

EXEC_OK = "exec_ok"
EXEC_ERROR = "exec_error"
VALUE = "value"
RAISED = "raised"
UNSERIALIZABLE = "unserializable"
PROBE_RESULTS = (VALUE, RAISED, UNSERIALIZABLE)
INT, FLOAT, COMPLEX, STR, BYTES, DICT = "i", "f", "c", "s", "y", "d"
LIST, TUPLE, SET, FROZENSET = "l", "t", "S", "F"

# --- the base types' own methods, taken before any program runs ---------------------------------

_type, _len, _isinstance = type, len, isinstance
_int_int, _float_float, _str_str = int.__int__, float.__float__, str.__str__
_bytes_hex, _dict_items, _islice = bytes.hex, dict.items, itertools.islice
_SEQUENCES = (
    (list, LIST, list.__iter__),
    (tuple, TUPLE, tuple.__iter__),
    (set, SET, set.__iter__),
    (frozenset, FROZENSET, frozenset.__iter__),
)
# what a probe in a consuming position may return (``list(map(f, xs))``): materialised first
ITERATORS = (
    map,
    filter,
    zip,
    enumerate,
    reversed,
    range,
    types.GeneratorType,
    type({}.keys()),
    type({}.values()),
    type({}.items()),
    type(iter([])),
    type(iter(())),
    type(iter(set())),
    type(iter("")),
)


class Unserializable(Exception):
    """The value is not plain data, or is over the caps."""


def make_payload(
    code: str, probes: list[tuple[str, bool]], max_chars: int, max_items: int, max_depth: int
) -> dict:
    """The payload of one test: the program, its probes (source, materialise) and the caps."""
    return {"code": code, "probes": probes, "limits": [max_chars, max_items, max_depth]}


def exc_name(exc: BaseException) -> str:
    """The exception's type name (at most 100 characters); "?" if even that fails."""
    try:
        return str(_type(exc).__name__)[:100]
    except BaseException:
        return "?"


class _Encoder:
    """Encodes one value as plain data (module docstring), within the item and character caps."""

    def __init__(self, max_chars: int, max_items: int, max_depth: int) -> None:
        self.items, self.chars, self.max_depth = max_items, max_chars, max_depth

    def spend(self, items: int, chars: int) -> None:
        """Take from the budget; Unserializable once it is overdrawn."""
        self.items -= items
        self.chars -= chars
        if self.items < 0 or self.chars < 0:
            raise Unserializable("value too large")

    def scalar(self, v: object, t: type) -> list | None:
        """The encoding of an int, float, complex, str or bytes; None for anything else."""
        if _isinstance(v, int):
            text = format(_int_int(v), "x")
            self.spend(0, _len(text))
            return [INT, text]
        if _isinstance(v, float):
            return [FLOAT, _float_float(v).hex()]
        if t is complex:
            return [COMPLEX, v.real.hex(), v.imag.hex()]  # type: ignore[attr-defined]
        if _isinstance(v, str):
            s = _str_str(v)
            self.spend(0, _len(s))
            return [STR, s]
        if _isinstance(v, bytes):
            self.spend(0, 2 * _len(v))
            return [BYTES, _bytes_hex(v)]
        return None

    def encode(self, v: object, depth: int) -> object:
        """``v`` as plain data; Unserializable if it is not, or too big or too deep."""
        if depth > self.max_depth:
            raise Unserializable("nested too deep")
        self.spend(1, 4)
        t = _type(v)
        if v is None:
            return None
        if t is bool:
            return v
        encoded = self.scalar(v, t)
        if encoded is not None:
            return encoded
        if _isinstance(v, dict):
            pairs = _dict_items(v)  # type: ignore[arg-type]
            return [
                DICT,
                [[self.encode(k, depth + 1), self.encode(x, depth + 1)] for k, x in pairs],
            ]
        for base, tag, iterate in _SEQUENCES:
            if _isinstance(v, base):
                return [tag, [self.encode(x, depth + 1) for x in iterate(v)]]
        raise Unserializable("not plain data: " + str(t.__name__)[:100])


def encode(value: object, materialize: bool, limits: list[int]) -> object:
    """``value`` as plain data under ``limits`` = [max chars, max items, max depth].

    With ``materialize``, an iterator (`ITERATORS`) is first read into a list.
    """
    max_chars, max_items, max_depth = limits
    if materialize and _isinstance(value, ITERATORS):
        value = list(_islice(value, max_items + 1))
        if _len(value) > max_items:
            raise Unserializable("value too large")
    return _Encoder(max_chars, max_items, max_depth).encode(value, 0)


def probe_result(
    index: int, source: str, materialize: bool, scope: dict, limits: list[int]
) -> list:
    """The message for one probe: its encoded value, or why there is none."""
    try:
        value = eval(compile(source, "<test>", "eval"), scope)
    except BaseException as exc:
        return [RAISED, index, exc_name(exc)]
    try:
        encoded = encode(value, materialize, limits)
    except Unserializable as exc:
        return [UNSERIALIZABLE, index, str(exc.args[0])]
    except BaseException as exc:
        return [RAISED, index, exc_name(exc)]
    return [VALUE, index, encoded]


def main(payload: dict, emit: Callable[[object], None]) -> None:
    """Run the program as ``__candidate__``, restore the builtins, then evaluate each probe."""
    saved_builtins = dict(builtins.__dict__)
    max_chars, max_items, max_depth = payload["limits"]
    limits = [max_chars, max_items, max_depth]  # read before the program can touch the payload
    scope = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        exec(compile(payload["code"], "<candidate>", "exec"), scope)
    except BaseException as exc:
        emit([EXEC_ERROR, exc_name(exc)])
        os._exit(0)
    emit([EXEC_OK])
    builtins.__dict__.clear()
    builtins.__dict__.update(saved_builtins)
    for index, (source, materialize) in enumerate(payload["probes"]):
        emit(probe_result(index, source, materialize, scope, limits))
    os._exit(0)
