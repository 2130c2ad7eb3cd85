"""Code verifier: model-written Python against `assert` tests, sandboxed; reward = pass fraction.

Grading policy
--------------
What is graded.
  * The program is the last fenced block labelled ``python``/``py``/``python3`` in the
    completion; without one, the last bare ```` ``` ```` block; without any fence, the whole
    completion. Reasoning is never graded: text up to the last ``</think>`` is dropped, and an
    unclosed ``<think>`` means no program (reason ``no_code``).
  * Programs longer than 64k characters score 0 (``too_long``). A program that does not
    compile scores 0 without running (``syntax_error``); it is compiled in the parent only,
    never run there.
  * The program runs with ``__name__ == "__candidate__"``, so an ``if __name__ == "__main__":``
    block does not run. Only the standard library is importable; stdin is empty, stdout is
    discarded.

Tests.
  * Each test is one statement, ``assert EXPR`` (a message after the comma is ignored) or a
    bare ``EXPR``. Each is scored on its own: the reward is passed / total. A test that does
    not parse, or is not a single expression statement, counts as failed (``invalid_test``).
  * One sandbox per program; each test runs in a fresh process of it (forked by the sandbox's
    trusted manager, never reused) that executes the whole program and then that test, with
    its own time, CPU and memory limits. Processes and files a test leaves behind are removed
    before the next test starts.
  * Reasons per test: ``passed``, ``wrong`` (the assertion is false, or evaluating it in the
    parent raised, e.g. comparing ``None < 3``), ``timeout`` (wall clock or CPU limit),
    ``memory`` (``MemoryError``), ``crash`` (an exception, a signal, or an exit before the test
    finished, ``sys.exit`` included), ``syntax_error``, ``invalid_test``, ``error`` (the
    sandbox itself failed). The program's own exceptions name their type in ``detail``.
  * When the program fails before any test could run (an exception, exit or timeout at module
    level), the remaining tests are not run: they get the same reason (detail says so).

How a pass is decided (the program cannot fake one).
  * The test expression is split with ``ast``. The parts the parent can evaluate itself on
    plain data are kept: literals, containers, arithmetic, comparisons, ``and/or/not``,
    conditional expressions, subscripts and slices, calls of a fixed set of pure builtins
    (``abs all any bool chr dict divmod enumerate float frozenset int isinstance len list max
    min ord range repr reversed round set sorted str sum tuple type zip``) and of
    ``math.isclose/isnan/isinf/isfinite/sqrt/floor/ceil/fabs/trunc/gcd/log/log2/log10/exp/
    hypot`` and the constants ``math.pi/e/inf/nan``, with size guards. Every other sub-expression
    (a call of the program's function, ``f(x).strip()``, a comprehension, ...) is a *probe*.
  * The child evaluates only the probes, after the program ran (with the builtins restored to
    their state before the program ran), and sends each probe's **value** back; only plain data
    crosses: ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``list``,
    ``tuple``, ``dict``, ``set``, ``frozenset`` (subclasses are converted to the base type
    through the base type's own methods, so an overridden ``__eq__`` or ``__iter__`` plays no
    part). Any other object fails the test (``wrong``: an object whose ``__eq__`` is always
    true never reaches a comparison). Values are capped (1 M characters, 100 k items, depth 50).
  * The parent rebuilds the values and evaluates the rest of the expression itself, with Python
    semantics (short-circuits included), and the test passes iff the result is truthy. The
    expected side of ``f(x) == 3`` therefore never enters the sandbox: nothing the program
    prints, exits with, patches, or writes to the result pipe can do better than returning the
    right value. Exits before the results (``sys.exit``, ``os._exit``, ``os.kill``), floods and
    malformed or duplicate results count as ``crash``.
  * Weaker guarantee (``check == "child"``, counted in ``parts["child_checked"]``): when a probe
    itself contains a comparison or boolean logic (``all(f(i) == i for i in r)``), or names
    nothing of the program (a part of the test the parent cannot evaluate), that part ran
    inside the sandbox, where the program could have replaced it; such a test's verdict can be
    forged by a program that defeats Python from within (an ``__eq__`` that is always true on
    the elements, introspection of the driver).
  * Builtins are the real ones in the parent: a program that shadows ``sorted`` or ``len`` does
    not change how the test's own calls of them are evaluated.

Sandbox: ``rlvr.verifiers.sandbox`` (process isolation, limits, namespaces, unprivileged user;
``docs/code_verifier.md``). Default limits per test: 3 s wall clock, 3 s CPU, 512 MB address
space, 8 processes.
"""

from __future__ import annotations

import ast
import builtins
import math
import os
import re
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rlvr.verifiers.format import completion_text
from rlvr.verifiers.sandbox import RunResult, SandboxLimits, run_python_many

__all__ = [
    "DEFAULT_LIMITS",
    "code_reward",
    "extract_code",
    "score",
    "verify",
    "verify_batch",
]

Completion = str | list[dict[str, Any]]

DEFAULT_LIMITS = SandboxLimits(wall_s=3.0, cpu_s=3)
MAX_CODE_CHARS = 64_000
MAX_VALUE_CHARS = 1_000_000
MAX_VALUE_ITEMS = 100_000
MAX_VALUE_DEPTH = 50
_MAX_JUDGE_LEN = 1_000_000  # longest sequence the parent builds while judging

# --------------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------------

_PY_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)(?:```|\Z)", re.S | re.I)
_BARE_FENCE = re.compile(r"```[ \t]*\r?\n(.*?)(?:```|\Z)", re.S)


def extract_code(completion: Completion) -> str | None:
    """The program to grade (module docstring, "What is graded"); None if there is none."""
    text = completion_text(completion)
    if text is None:
        return None
    close = text.rfind("</think>")
    if close != -1:
        text = text[close + len("</think>") :]
    if "<think>" in text:
        return None
    for fence in (_PY_FENCE, _BARE_FENCE):
        blocks = fence.findall(text)
        if blocks:
            return blocks[-1]
    return text


# --------------------------------------------------------------------------------------------
# Planning: split a test into what the parent judges and what the child evaluates (probes)
# --------------------------------------------------------------------------------------------

_SAFE_FUNCTIONS: dict[str, Any] = {
    name: getattr(builtins, name)
    for name in (
        "abs all any bool chr dict divmod enumerate float frozenset int isinstance len list max "
        "min ord range repr reversed round set sorted str sum tuple type zip"
    ).split()
}
_SAFE_NAMES: dict[str, Any] = {
    **_SAFE_FUNCTIONS,
    "complex": complex,
    "bytes": bytes,
    "NoneType": type(None),
}
_MATH = {
    name: getattr(math, name)
    for name in (
        "isclose isnan isinf isfinite sqrt floor ceil fabs trunc gcd log log2 log10 exp hypot "
        "pi e inf nan"
    ).split()
}
# Calls whose positional arguments are consumed as iterables: a probe there may be an iterator
# (``list(map(f, xs))``), which the child materialises into a list.
_CONSUMERS = {
    "all",
    "any",
    "dict",
    "enumerate",
    "frozenset",
    "list",
    "max",
    "min",
    "set",
    "sorted",
    "sum",
    "tuple",
    "zip",
}
_SAFE_KEYWORDS = {
    "sorted": {"reverse", "key"},
    "max": {"key", "default"},
    "min": {"key", "default"},
    "sum": {"start"},
    "round": {"ndigits"},
    "isclose": {"rel_tol", "abs_tol"},
    "enumerate": {"start"},
    "int": {"base"},
}
_BINOPS = (
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.FloorDiv,
    ast.Mod,
    ast.Pow,
    ast.BitAnd,
    ast.BitOr,
    ast.BitXor,
    ast.LShift,
    ast.RShift,
)
_NOT_DATA = (
    ast.Lambda,
    ast.GeneratorExp,
    ast.Starred,
    ast.NamedExpr,
    ast.Await,
    ast.Yield,
    ast.YieldFrom,
)
_LOGIC = (ast.Compare, ast.BoolOp, ast.IfExp)
_BUILTIN_NAMES = set(dir(builtins))


class _Plan:
    __slots__ = ("source", "judge", "probes", "strict", "error")

    def __init__(self, source: str) -> None:
        self.source = source
        self.judge: ast.Expression | None = None
        self.probes: list[tuple[str, bool]] = []  # (expression source, materialise iterators)
        self.strict = True
        self.error: str | None = None


def _probe_name(index: int) -> str:
    return f"__probe{index}__"


def _bound_names(node: ast.AST) -> set[str]:
    bound: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            bound.add(sub.id)
        elif isinstance(sub, ast.arg):
            bound.add(sub.arg)
    return bound


def _program_names(node: ast.AST) -> set[str]:
    """Free names of an expression that are not builtins: names the program provides."""
    loaded = {
        s.id for s in ast.walk(node) if isinstance(s, ast.Name) and isinstance(s.ctx, ast.Load)
    }
    return loaded - _bound_names(node) - _BUILTIN_NAMES


class _Planner:
    def __init__(self, plan: _Plan) -> None:
        self.plan = plan

    def probe(self, node: ast.expr, materialize: bool = False) -> ast.expr:
        plan = self.plan
        if any(
            isinstance(s, _LOGIC) or (isinstance(s, ast.UnaryOp) and isinstance(s.op, ast.Not))
            for s in ast.walk(node)
        ) or not _program_names(node):
            plan.strict = False  # test logic or test-only values would be computed in the child
        plan.probes.append((ast.unparse(node), materialize))
        return ast.copy_location(
            ast.Name(id=_probe_name(len(plan.probes) - 1), ctx=ast.Load()), node
        )

    def safe_callee(self, func: ast.expr) -> str | None:
        if isinstance(func, ast.Name) and func.id in _SAFE_FUNCTIONS:
            return func.id
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "math"
            and func.attr in _MATH
            and callable(_MATH[func.attr])
        ):
            return func.attr
        return None

    def visit(self, node: ast.expr, materialize: bool = False) -> ast.expr:
        if isinstance(node, ast.Constant):
            return node
        if isinstance(node, ast.Name):
            return node if node.id in _SAFE_NAMES else self.probe(node, materialize)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "math" and node.attr in _MATH:
                return node
            return self.probe(node, materialize)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            if any(isinstance(e, _NOT_DATA) for e in node.elts):
                return self.probe(node, materialize)
            return type(node)(elts=[self.visit(e) for e in node.elts], ctx=ast.Load())
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys) or any(
                isinstance(v, _NOT_DATA) for v in [*node.keys, *node.values]
            ):
                return self.probe(node, materialize)
            return ast.Dict(
                keys=[self.visit(k) for k in node.keys],  # type: ignore[arg-type]
                values=[self.visit(v) for v in node.values],
            )
        if isinstance(node, ast.UnaryOp):
            return ast.UnaryOp(op=node.op, operand=self.visit(node.operand))
        if isinstance(node, ast.BinOp) and isinstance(node.op, _BINOPS):
            if isinstance(node.left, _NOT_DATA) or isinstance(node.right, _NOT_DATA):
                return self.probe(node, materialize)
            return ast.BinOp(left=self.visit(node.left), op=node.op, right=self.visit(node.right))
        if isinstance(node, ast.BoolOp):
            if any(isinstance(v, _NOT_DATA) for v in node.values):
                return self.probe(node, materialize)
            return ast.BoolOp(op=node.op, values=[self.visit(v) for v in node.values])
        if isinstance(node, ast.Compare):
            if any(isinstance(v, _NOT_DATA) for v in [node.left, *node.comparators]):
                return self.probe(node, materialize)
            return ast.Compare(
                left=self.visit(node.left),
                ops=node.ops,
                comparators=[self.visit(c) for c in node.comparators],
            )
        if isinstance(node, ast.IfExp):
            parts = (node.test, node.body, node.orelse)
            if any(isinstance(p, _NOT_DATA) for p in parts):
                return self.probe(node, materialize)
            return ast.IfExp(*(self.visit(p) for p in parts))
        if isinstance(node, ast.Subscript):
            if isinstance(node.value, _NOT_DATA) or isinstance(node.slice, _NOT_DATA):
                return self.probe(node, materialize)
            return ast.Subscript(
                value=self.visit(node.value), slice=self.visit(node.slice), ctx=ast.Load()
            )
        if isinstance(node, ast.Slice):
            return ast.Slice(
                *(None if p is None else self.visit(p) for p in (node.lower, node.upper, node.step))
            )
        if isinstance(node, ast.Call):
            name = self.safe_callee(node.func)
            allowed = _SAFE_KEYWORDS.get(name or "", set())
            keywords_ok = all(
                k.arg in allowed
                and not isinstance(k.value, _NOT_DATA)
                # a key function must be one of the safe builtins (key=len), never program code
                and (
                    k.arg != "key"
                    or (isinstance(k.value, ast.Name) and k.value.id in _SAFE_FUNCTIONS)
                )
                for k in node.keywords
            )
            args_ok = all(
                not isinstance(a, _NOT_DATA)
                and not (isinstance(a, ast.Name) and a.id not in _SAFE_NAMES)
                for a in node.args
            )
            if name is None or not keywords_ok or not args_ok:
                return self.probe(node, materialize)
            consumer = isinstance(node.func, ast.Name) and node.func.id in _CONSUMERS
            return ast.Call(
                func=node.func,
                args=[self.visit(a, materialize=consumer) for a in node.args],
                keywords=[ast.keyword(arg=k.arg, value=self.visit(k.value)) for k in node.keywords],
            )
        return self.probe(node, materialize)


def _plan_test(test: Any) -> _Plan:
    plan = _Plan(test if isinstance(test, str) else repr(test))
    if not isinstance(test, str) or not test.strip():
        plan.error = "not a test string"
        return plan
    try:
        module = ast.parse(test.strip(), mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        plan.error = f"does not parse: {type(exc).__name__}"
        return plan
    if len(module.body) != 1 or not isinstance(module.body[0], (ast.Assert, ast.Expr)):
        plan.error = "not a single assert or expression statement"
        return plan
    statement = module.body[0]
    expression = statement.test if isinstance(statement, ast.Assert) else statement.value
    try:
        judge = _Planner(plan).visit(expression)
        plan.judge = ast.fix_missing_locations(ast.Expression(body=judge))
    except (RecursionError, ValueError) as exc:
        plan.error = f"cannot plan: {type(exc).__name__}"
    return plan


# --------------------------------------------------------------------------------------------
# The child side (runs inside the sandbox, after the harness dropped privileges)
# --------------------------------------------------------------------------------------------

_DRIVER = r"""
def main(payload, emit):
    import builtins, itertools, os, types
    _type, _len, _isinstance, _id = type, len, isinstance, id
    _int_int, _float_float, _str_str = int.__int__, float.__float__, str.__str__
    _bytes_hex, _list_iter, _tuple_iter = bytes.hex, list.__iter__, tuple.__iter__
    _set_iter, _frozenset_iter = set.__iter__, frozenset.__iter__
    _dict_items, _islice = dict.items, itertools.islice
    saved_builtins = dict(builtins.__dict__)
    max_chars, max_items, max_depth = payload["limits"]
    iterators = (map, filter, zip, enumerate, reversed, range, types.GeneratorType,
                 type({}.keys()), type({}.values()), type({}.items()), type(iter([])),
                 type(iter(())), type(iter(set())), type(iter("")))

    class Unserializable(Exception):
        pass

    def exc_name(exc):
        try:
            return str(_type(exc).__name__)[:100]
        except BaseException:
            return "?"

    def encode(value, materialize):
        budget = [max_items, max_chars]

        def spend(items, chars):
            budget[0] -= items
            budget[1] -= chars
            if budget[0] < 0 or budget[1] < 0:
                raise Unserializable("value too large")

        def enc(v, depth):
            if depth > max_depth:
                raise Unserializable("nested too deep")
            spend(1, 4)
            t = _type(v)
            if v is None:
                return None
            if t is bool:
                return v
            if _isinstance(v, int):
                text = format(_int_int(v), "x")
                spend(0, _len(text))
                return ["i", text]
            if _isinstance(v, float):
                return ["f", _float_float(v).hex()]
            if t is complex:
                return ["c", v.real.hex(), v.imag.hex()]
            if _isinstance(v, str):
                s = _str_str(v)
                spend(0, _len(s))
                return ["s", s]
            if _isinstance(v, bytes):
                spend(0, 2 * _len(v))
                return ["y", _bytes_hex(v)]
            if _isinstance(v, dict):
                return ["d", [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in _dict_items(v)]]
            for base, tag, iterate in ((list, "l", _list_iter), (tuple, "t", _tuple_iter),
                                       (set, "S", _set_iter), (frozenset, "F", _frozenset_iter)):
                if _isinstance(v, base):
                    return [tag, [enc(x, depth + 1) for x in iterate(v)]]
            raise Unserializable("not plain data: " + str(t.__name__)[:100])

        if materialize and _isinstance(value, iterators):
            value = list(_islice(value, max_items + 1))
            if _len(value) > max_items:
                raise Unserializable("value too large")
        return enc(value, 0)

    scope = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        exec(compile(payload["code"], "<candidate>", "exec"), scope)
    except BaseException as exc:
        emit(["exec_error", exc_name(exc)])
        os._exit(0)
    emit(["exec_ok"])
    builtins.__dict__.clear()
    builtins.__dict__.update(saved_builtins)
    for index, (source, materialize) in enumerate(payload["probes"]):
        try:
            value = eval(compile(source, "<test>", "eval"), scope)
        except BaseException as exc:
            emit(["raised", index, exc_name(exc)])
            continue
        try:
            encoded = encode(value, materialize)
        except Unserializable as exc:
            emit(["unserializable", index, str(exc.args[0])])
            continue
        except BaseException as exc:
            emit(["raised", index, exc_name(exc)])
            continue
        emit(["value", index, encoded])
    os._exit(0)
"""


# --------------------------------------------------------------------------------------------
# The parent side: decode values, judge
# --------------------------------------------------------------------------------------------


class _ProtocolError(Exception):
    """A malformed result: forged or corrupted; the test counts as a crash."""


class _ProbeFailed(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


class _JudgeLimit(Exception):
    """The test's own computation would exceed the parent's size guards."""


def _decode(value: Any, depth: int = 0) -> Any:
    if depth > MAX_VALUE_DEPTH + 1:
        raise _ProtocolError("too deep")
    if value is None or isinstance(value, bool):
        return value
    if not isinstance(value, list) or not value or not isinstance(value[0], str):
        raise _ProtocolError("bad value")
    tag, rest = value[0], value[1:]
    try:
        if tag == "i":
            return int(rest[0], 16)
        if tag == "f":
            return float.fromhex(rest[0])
        if tag == "c":
            return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
        if tag == "s" and isinstance(rest[0], str):
            return rest[0]
        if tag == "y":
            return bytes.fromhex(rest[0])
        if tag == "d":
            return {_decode(k, depth + 1): _decode(v, depth + 1) for k, v in rest[0]}
        items = [_decode(x, depth + 1) for x in rest[0]]
        if tag == "l":
            return items
        if tag == "t":
            return tuple(items)
        if tag == "S":
            return set(items)
        if tag == "F":
            return frozenset(items)
    except (TypeError, ValueError, IndexError, OverflowError) as exc:
        raise _ProtocolError(f"bad value: {type(exc).__name__}") from None
    raise _ProtocolError("bad tag")


def _check_size(value: Any) -> Any:
    if isinstance(value, (str, bytes, list, tuple, set, frozenset, dict, range)):
        if len(value) > _MAX_JUDGE_LEN:
            raise _JudgeLimit("value too large")
    return value


def _binop(op: ast.operator, left: Any, right: Any) -> Any:
    if isinstance(op, ast.Pow) and isinstance(left, int) and isinstance(right, int):
        if right > 10_000 and abs(left) > 1 or abs(left).bit_length() * max(right, 0) > 10**7:
            raise _JudgeLimit("power too large")
    if isinstance(op, ast.LShift) and isinstance(right, int) and right > 10**6:
        raise _JudgeLimit("shift too large")
    if isinstance(op, ast.Mult):
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int):
                if len(seq) * n > _MAX_JUDGE_LEN:
                    raise _JudgeLimit("repetition too large")
    operators = {
        ast.Add: lambda a, b: a + b,
        ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b,
        ast.FloorDiv: lambda a, b: a // b,
        ast.Mod: lambda a, b: a % b,
        ast.Pow: lambda a, b: a**b,
        ast.BitAnd: lambda a, b: a & b,
        ast.BitOr: lambda a, b: a | b,
        ast.BitXor: lambda a, b: a ^ b,
        ast.LShift: lambda a, b: a << b,
        ast.RShift: lambda a, b: a >> b,
    }
    return _check_size(operators[type(op)](left, right))


_COMPARE = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.Is: lambda a, b: a is b,
    ast.IsNot: lambda a, b: a is not b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_UNARY = {
    ast.Not: lambda a: not a,
    ast.USub: lambda a: -a,
    ast.UAdd: lambda a: +a,
    ast.Invert: lambda a: ~a,
}


def _safe_call(name: str, func: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    if name == "range":
        r = range(*args)
        if len(r) > _MAX_JUDGE_LEN:
            raise _JudgeLimit("range too large")
        return r
    if (
        name in ("str", "repr")
        and args
        and isinstance(args[0], int)
        and not isinstance(args[0], bool)
    ):
        if abs(args[0]).bit_length() > 13_000:  # int->str is quadratic; 4300 digits is the cap
            raise _JudgeLimit("int too large to print")
    if name == "sum" and args:
        start = args[1] if len(args) > 1 else kwargs.get("start", 0)
        if not isinstance(start, (int, float, complex)) and len(args[0]) > 10_000:
            raise _JudgeLimit("sum of sequences too long")  # sum(lists, []) is quadratic
    if name in ("zip", "enumerate", "reversed", "map"):
        return list(func(*args, **kwargs))  # materialise: values are finite plain data
    return _check_size(func(*args, **kwargs))


def _judge(node: ast.AST, env: dict[str, Any]) -> Any:
    if isinstance(node, ast.Expression):
        return _judge(node.body, env)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            value = env[node.id]
            if isinstance(value, _ProbeFailed):
                raise value
            return value
        return _SAFE_NAMES[node.id]
    if isinstance(node, ast.Attribute):
        return _MATH[node.attr]
    if isinstance(node, ast.Tuple):
        return tuple(_judge(e, env) for e in node.elts)
    if isinstance(node, ast.List):
        return [_judge(e, env) for e in node.elts]
    if isinstance(node, ast.Set):
        return {_judge(e, env) for e in node.elts}
    if isinstance(node, ast.Dict):
        return {_judge(k, env): _judge(v, env) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_judge(node.operand, env))
    if isinstance(node, ast.BinOp):
        return _binop(node.op, _judge(node.left, env), _judge(node.right, env))
    if isinstance(node, ast.BoolOp):
        value = None
        for sub in node.values:
            value = _judge(sub, env)
            if isinstance(node.op, ast.And) and not value:
                return value
            if isinstance(node.op, ast.Or) and value:
                return value
        return value
    if isinstance(node, ast.Compare):
        left = _judge(node.left, env)
        for op, comparator in zip(node.ops, node.comparators):
            right = _judge(comparator, env)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _judge(node.body if _judge(node.test, env) else node.orelse, env)
    if isinstance(node, ast.Subscript):
        return _judge(node.value, env)[_judge(node.slice, env)]
    if isinstance(node, ast.Slice):
        parts = (node.lower, node.upper, node.step)
        return slice(*(None if p is None else _judge(p, env) for p in parts))
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name):
            name, func = node.func.id, _SAFE_FUNCTIONS[node.func.id]
        else:
            name, func = node.func.attr, _MATH[node.func.attr]  # type: ignore[attr-defined]
        args = [_judge(a, env) for a in node.args]
        kwargs = {k.arg: _judge(k.value, env) for k in node.keywords if k.arg is not None}
        return _safe_call(name, func, args, kwargs)
    raise _ProtocolError(f"unsupported node {type(node).__name__}")  # the planner prevents this


# --------------------------------------------------------------------------------------------
# Running one test, one program
# --------------------------------------------------------------------------------------------


def _test_record(plan: _Plan, reason: str, detail: str | None = None, wall_s: float = 0.0) -> dict:
    return {
        "test": plan.source,
        "reason": reason,
        "detail": detail,
        "check": "parent" if plan.strict else "child",
        "wall_s": round(wall_s, 4),
    }


def _failure_reason(exc_name: str) -> str:
    return "memory" if exc_name == "MemoryError" else "crash"


def _interpret(plan: _Plan, run: RunResult) -> tuple[dict, bool]:
    """(test record, whether the program failed before the test could start) for one run."""
    wall = run.wall_s
    exec_ok = False
    exec_error: str | None = None
    outcomes: dict[int, Any] = {}
    try:
        if run.overflow:
            raise _ProtocolError("result flood")
        for message in run.messages:
            if not isinstance(message, list) or not message:
                raise _ProtocolError("bad message")
            kind = message[0]
            if kind == "exec_ok" and not exec_ok and exec_error is None:
                exec_ok = True
            elif kind == "exec_error" and not exec_ok and exec_error is None:
                exec_error = str(message[1])[:100] if len(message) > 1 else "?"
            elif kind in ("value", "raised", "unserializable") and exec_ok and len(message) == 3:
                index = message[1]
                if not isinstance(index, int) or not 0 <= index < len(plan.probes):
                    raise _ProtocolError("bad probe index")
                if index in outcomes:
                    raise _ProtocolError("duplicate result")
                if kind == "value":
                    outcomes[index] = _decode(message[2])
                elif kind == "raised":
                    name = str(message[2])[:100]
                    outcomes[index] = _ProbeFailed(_failure_reason(name), f"raised {name}")
                else:
                    outcomes[index] = _ProbeFailed("wrong", str(message[2])[:200])
            else:
                raise _ProtocolError(f"unexpected message {str(kind)[:30]}")
    except (_ProtocolError, RecursionError) as exc:
        return _test_record(plan, "crash", f"bad result: {exc}", wall), not exec_ok
    if exec_error is not None:
        return _test_record(plan, _failure_reason(exec_error), f"raised {exec_error}", wall), True
    if len(outcomes) < len(plan.probes):
        if run.timed_out or run.cpu_limited:
            limit = "wall clock" if run.timed_out else "cpu"
            return _test_record(plan, "timeout", f"{limit} limit", wall), not exec_ok
        how = (
            f"killed by signal {run.signal}"
            if run.signal is not None
            else f"exited ({run.returncode}) before the test finished"
        )
        return _test_record(plan, "crash", how, wall), not exec_ok
    env = {_probe_name(i): value for i, value in outcomes.items()}
    try:
        assert plan.judge is not None
        passed = bool(_judge(plan.judge, env))
    except _ProbeFailed as exc:
        return _test_record(plan, exc.reason, exc.detail, wall), False
    except _JudgeLimit as exc:
        return _test_record(plan, "wrong", f"test too large to judge: {exc}", wall), False
    except _ProtocolError as exc:
        return _test_record(plan, "crash", f"bad result: {exc}", wall), False
    except Exception as exc:  # the assertion itself raised (TypeError on None < 3, ...)
        return _test_record(plan, "wrong", f"test raised {type(exc).__name__}", wall), False
    return _test_record(plan, "passed" if passed else "wrong", None, wall), False


def _run_tests(code: str, plans: list[_Plan], limits: SandboxLimits) -> list[dict]:
    """One sandbox for the program; each test a fresh process in it (module docstring)."""
    payloads = [
        {
            "code": code,
            "probes": plan.probes,
            "limits": [MAX_VALUE_CHARS, MAX_VALUE_ITEMS, MAX_VALUE_DEPTH],
        }
        for plan in plans
    ]
    res = run_python_many(_DRIVER, payloads, limits, stop_marker=["exec_ok"])
    if res.setup_error or not res.started:
        detail = res.setup_error or ("start-up timed out" if res.timed_out else "did not start")
        return [_test_record(plan, "error", f"sandbox: {detail}") for plan in plans]
    records: list[dict] = []
    module_failure: dict | None = None
    for plan, run in zip(plans, res.runs):
        if module_failure is not None:
            detail = f"{module_failure['detail']} (module level; not rerun)"
            records.append(_test_record(plan, module_failure["reason"], detail))
        elif not run.completed:  # the sandbox itself ran out of time or died
            reason = "timeout" if res.timed_out else "error"
            records.append(_test_record(plan, reason, "sandbox ended before this test"))
        else:
            record, failed_early = _interpret(plan, run)
            records.append(record)
            if failed_early:
                module_failure = record
    return records


def _normalize_tests(tests: Any) -> list[Any] | None:
    if isinstance(tests, str):
        return [line for line in tests.splitlines() if line.strip()]
    if isinstance(tests, (list, tuple)):
        return list(tests)
    if hasattr(tests, "__iter__") and not isinstance(tests, (bytes, dict)):
        try:
            return list(tests)  # a numpy array or another sequence from a dataset column
        except Exception:
            return None
    return None


def _overall_reason(records: list[dict]) -> str:
    reasons = [r["reason"] for r in records]
    passed = reasons.count("passed")
    if passed == len(reasons):
        return "passed"
    if passed:
        return "partial"
    return Counter(reasons).most_common(1)[0][0]


def _grade(code: Any, tests: Any, limits: SandboxLimits, parts: dict[str, Any]) -> float:
    test_list = _normalize_tests(tests)
    if test_list is None:
        return 0.0  # reason stays "error"
    if not test_list:
        parts["reason"] = "no_tests"
        return 0.0
    plans = [_plan_test(t) for t in test_list]
    parts["total"] = len(plans)
    parts["child_checked"] = sum(1 for p in plans if p.error is None and not p.strict)
    records: list[dict] = []
    if not isinstance(code, str) or not code.strip():
        parts["reason"] = "no_code"
        return 0.0
    if len(code) > MAX_CODE_CHARS:
        parts["reason"] = "too_long"
        return 0.0
    try:
        compile(code, "<candidate>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as exc:
        parts["reason"] = "syntax_error"
        parts["tests"] = [_test_record(p, "syntax_error", type(exc).__name__) for p in plans]
        return 0.0
    runnable = [plan for plan in plans if plan.error is None]
    results = iter(_run_tests(code, runnable, limits) if runnable else [])
    for plan in plans:
        if plan.error is not None:
            records.append(_test_record(plan, "invalid_test", plan.error))
        else:
            records.append(next(results))
    parts["tests"] = records
    passed = sum(1 for r in records if r["reason"] == "passed")
    parts["passed"] = passed
    parts["reason"] = _overall_reason(records)
    return passed / len(records)


def verify(code: str, tests: list[str], limits: SandboxLimits | None = None) -> tuple[float, dict]:
    """Pass fraction and its breakdown; never raises.

    ``parts``: ``reason`` ("passed", "partial", a test reason shared by most failed tests,
    "syntax_error", "no_code", "too_long", "no_tests" or "error"), ``passed``, ``total``,
    ``child_checked`` (tests whose verdict was computed inside the sandbox, see the module
    docstring) and ``tests``: one record per test with ``test``, ``reason``, ``detail``,
    ``check`` ("parent"/"child") and ``wall_s``.
    """
    parts: dict[str, Any] = {
        "reason": "error",
        "passed": 0,
        "total": 0,
        "child_checked": 0,
        "tests": [],
    }
    try:
        reward = _grade(code, tests, limits or DEFAULT_LIMITS, parts)
    except Exception as exc:
        reward = 0.0
        parts["reason"] = "error"
        parts["detail"] = f"internal: {type(exc).__name__}"
    return reward, parts


def score(code: str, tests: list[str], limits: SandboxLimits | None = None) -> float:
    """Fraction of ``tests`` the program passes; never raises."""
    return verify(code, tests, limits)[0]


_pool_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}


def _pool(workers: int) -> ThreadPoolExecutor:
    with _pool_lock:
        pool = _pools.get(workers)
        if pool is None:
            pool = _pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix="rlvr-code")
        return pool


def verify_batch(
    codes: list[str | None],
    tests: list[Any],
    *,
    workers: int | None = None,
    limits: SandboxLimits | None = None,
) -> list[tuple[float, dict]]:
    """`verify` for many programs at once, ``workers`` sandboxes in parallel (default: CPUs).

    A ``None`` program scores 0 with reason "no_code". Never raises for bad items; the lists
    must have the same length.
    """
    if len(codes) != len(tests):
        raise ValueError(f"{len(codes)} programs but {len(tests)} test lists")
    workers = max(1, workers or os.cpu_count() or 1)

    def one(item: tuple[str | None, Any]) -> tuple[float, dict]:
        code, test_list = item
        if code is None:
            return 0.0, {
                "reason": "no_code",
                "passed": 0,
                "total": 0,
                "child_checked": 0,
                "tests": [],
            }
        return verify(code, test_list, limits)

    items = list(zip(codes, tests))
    if workers == 1 or len(items) <= 1:
        return [one(item) for item in items]
    return list(_pool(workers).map(one, items))


def code_reward(
    prompts: list[str] | list[list[dict[str, Any]]],
    completions: list[str] | list[list[dict[str, Any]]],
    tests: list[list[str]],
    **kwargs: Any,
) -> list[float]:
    """TRL reward function (``fn(prompts, completions, **columns)``, column ``tests``).

    Each completion's program (`extract_code`) is run against its row's tests; the reward is
    the pass fraction. Completions may be strings or conversational message lists.
    """
    if len(completions) != len(tests):
        raise ValueError(f"{len(completions)} completions but {len(tests)} test lists")
    codes = []
    for completion in completions:
        try:
            codes.append(extract_code(completion))
        except Exception:
            codes.append(None)
    return [reward for reward, _ in verify_batch(codes, list(tests))]
