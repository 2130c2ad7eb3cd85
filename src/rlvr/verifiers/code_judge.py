"""The code verifier's parent side: plan a test, then judge it on the values the child sent.

A test ``assert EXPR`` is split with `ast` (`plan_test`): what the parent can evaluate itself on
plain data stays in the *judge* expression; every other sub-expression becomes a *probe*, which
the sandboxed child evaluates (`rlvr.verifiers.code_driver`). `interpret` reads one child's
messages, rebuilds the probes' values (`decode`) and evaluates the judge expression with
Python's semantics and size guards (`judge`). What is kept, and why a program cannot fake a
pass, is in `rlvr.verifiers.code`'s module docstring ("How a pass is decided").

Recursion: chains that need no brackets (``a + b + ...``, ``-x``, ``not x``, ``x[0][0]``,
``a if b else c if ...``) recurse inside `Planner.visit` and `judge` themselves, one frame a
level; bracketed nodes (displays, calls, slices, comparisons, boolean operators) go through
helpers, and brackets nest at most 200 deep (the tokenizer's limit).
"""

from __future__ import annotations

import ast
import builtins
import math
from collections.abc import Callable
from typing import Any

from rlvr.verifiers.code_driver import (
    BYTES,
    COMPLEX,
    DICT,
    EXEC_ERROR,
    EXEC_OK,
    FLOAT,
    FROZENSET,
    INT,
    LIST,
    PROBE_RESULTS,
    RAISED,
    SET,
    STR,
    TUPLE,
    VALUE,
)
from rlvr.verifiers.sandbox import RunResult

MAX_VALUE_CHARS = 1_000_000
MAX_VALUE_ITEMS = 100_000
MAX_VALUE_DEPTH = 50
_MAX_JUDGE_LEN = 1_000_000  # longest sequence the parent builds while judging

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
# The parts of a node the parent can judge that must be data (not a lambda, a generator, ...).
_PARTS: dict[type, Callable[[Any], list]] = {
    ast.Tuple: lambda node: node.elts,
    ast.List: lambda node: node.elts,
    ast.Set: lambda node: node.elts,
    ast.Dict: lambda node: [*node.keys, *node.values],  # a None key is ``**mapping``
    ast.UnaryOp: lambda node: [],
    ast.BinOp: lambda node: [node.left, node.right],
    ast.BoolOp: lambda node: node.values,
    ast.Compare: lambda node: [node.left, *node.comparators],
    ast.IfExp: lambda node: [node.test, node.body, node.orelse],
    ast.Subscript: lambda node: [node.value, node.slice],
    ast.Slice: lambda node: [],
}


class Plan:
    """One test, planned: the judge expression, the probes, and whether the parent decides."""

    __slots__ = ("source", "judge", "probes", "strict", "error")

    def __init__(self, source: str) -> None:
        self.source = source
        self.judge: ast.Expression | None = None
        self.probes: list[tuple[str, bool]] = []  # (expression source, materialise iterators)
        self.strict = True
        self.error: str | None = None


def probe_name(index: int) -> str:
    """The name the judge expression uses for probe ``index``'s value."""
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


def _safe_callee(func: ast.expr) -> str | None:
    """The name of a callee the parent may call itself (a safe builtin or ``math.f``)."""
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


def _judged_call(node: ast.Call) -> bool:
    """Whether the parent may make this call: a safe callee, data arguments, safe keywords."""
    name = _safe_callee(node.func)
    allowed = _SAFE_KEYWORDS.get(name or "", set())
    keywords_ok = all(
        k.arg in allowed
        and not isinstance(k.value, _NOT_DATA)
        # a key function must be one of the safe builtins (key=len), never program code
        and (k.arg != "key" or (isinstance(k.value, ast.Name) and k.value.id in _SAFE_FUNCTIONS))
        for k in node.keywords
    )
    args_ok = all(
        not isinstance(a, _NOT_DATA) and not (isinstance(a, ast.Name) and a.id not in _SAFE_NAMES)
        for a in node.args
    )
    return name is not None and keywords_ok and args_ok


def _kept_as_is(node: ast.expr) -> bool:
    """A literal, a safe builtin's name or a ``math`` constant or function."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Name):
        return node.id in _SAFE_NAMES
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "math"
        and node.attr in _MATH
    )


def _must_probe(node: ast.expr) -> bool:
    """Whether the child must evaluate this node (the parent cannot judge it on plain data)."""
    if isinstance(node, ast.Call):
        return not _judged_call(node)
    if isinstance(node, ast.BinOp) and not isinstance(node.op, _BINOPS):
        return True
    parts = _PARTS.get(type(node))
    if parts is None:
        return True  # a name of the program, an attribute, a comprehension, a lambda, ...
    return any(part is None or isinstance(part, _NOT_DATA) for part in parts(node))


class Planner:
    """Builds one plan's judge expression, turning what the parent cannot judge into probes."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def probe(self, node: ast.expr, materialize: bool = False) -> ast.expr:
        """Make ``node`` a probe; the judge expression refers to its value by name."""
        plan = self.plan
        if any(
            isinstance(s, _LOGIC) or (isinstance(s, ast.UnaryOp) and isinstance(s.op, ast.Not))
            for s in ast.walk(node)
        ) or not _program_names(node):
            plan.strict = False  # test logic or test-only values would be computed in the child
        plan.probes.append((ast.unparse(node), materialize))
        return ast.copy_location(
            ast.Name(id=probe_name(len(plan.probes) - 1), ctx=ast.Load()), node
        )

    def visit(self, node: ast.expr, materialize: bool = False) -> ast.expr:
        """``node`` as the parent judges it: kept, rebuilt from its visited parts, or a probe."""
        if _kept_as_is(node):
            return node
        if _must_probe(node):
            return self.probe(node, materialize)
        if isinstance(node, ast.UnaryOp):
            return ast.UnaryOp(op=node.op, operand=self.visit(node.operand))
        if isinstance(node, ast.BinOp):
            return ast.BinOp(left=self.visit(node.left), op=node.op, right=self.visit(node.right))
        if isinstance(node, ast.IfExp):
            return ast.IfExp(*(self.visit(p) for p in (node.test, node.body, node.orelse)))
        if isinstance(node, ast.Subscript):
            return ast.Subscript(
                value=self.visit(node.value), slice=self.visit(node.slice), ctx=ast.Load()
            )
        return self.rebuild(node)

    def rebuild(self, node: ast.expr) -> ast.expr:
        """A display, boolean operator, comparison, slice or call, with its parts visited."""
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return type(node)(elts=[self.visit(e) for e in node.elts], ctx=ast.Load())
        if isinstance(node, ast.Dict):
            return ast.Dict(
                keys=[self.visit(k) for k in node.keys],  # type: ignore[arg-type]
                values=[self.visit(v) for v in node.values],
            )
        if isinstance(node, ast.BoolOp):
            return ast.BoolOp(op=node.op, values=[self.visit(v) for v in node.values])
        if isinstance(node, ast.Compare):
            return ast.Compare(
                left=self.visit(node.left),
                ops=node.ops,
                comparators=[self.visit(c) for c in node.comparators],
            )
        if isinstance(node, ast.Slice):
            return ast.Slice(
                *(None if p is None else self.visit(p) for p in (node.lower, node.upper, node.step))
            )
        assert isinstance(node, ast.Call)  # _must_probe let nothing else through
        consumer = isinstance(node.func, ast.Name) and node.func.id in _CONSUMERS
        return ast.Call(
            func=node.func,
            args=[self.visit(a, materialize=consumer) for a in node.args],
            keywords=[ast.keyword(arg=k.arg, value=self.visit(k.value)) for k in node.keywords],
        )


def plan_test(test: Any) -> Plan:
    """Plan one test string; ``plan.error`` says why a test cannot be run."""
    plan = Plan(test if isinstance(test, str) else repr(test))
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
        judged = Planner(plan).visit(expression)
        plan.judge = ast.fix_missing_locations(ast.Expression(body=judged))
    except (RecursionError, ValueError) as exc:
        plan.error = f"cannot plan: {type(exc).__name__}"
    return plan


# --------------------------------------------------------------------------------------------
# Decoding the child's values
# --------------------------------------------------------------------------------------------


class ProtocolError(Exception):
    """A malformed result: forged or corrupted; the test counts as a crash."""


class ProbeFailed(Exception):
    """A probe raised in the child, or its value was not plain data."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


class JudgeLimit(Exception):
    """The test's own computation would exceed the parent's size guards."""


_SCALARS: dict[str, Callable[[list], Any]] = {
    INT: lambda rest: int(rest[0], 16),
    FLOAT: lambda rest: float.fromhex(rest[0]),
    COMPLEX: lambda rest: complex(float.fromhex(rest[0]), float.fromhex(rest[1])),
    STR: lambda rest: rest[0],
    BYTES: lambda rest: bytes.fromhex(rest[0]),
}
_COLLECTIONS: dict[str, Callable[[list], Any]] = {
    LIST: list,
    TUPLE: tuple,
    SET: set,
    FROZENSET: frozenset,
}


def decode(value: Any, depth: int = 0) -> Any:
    """Rebuild a value encoded by the driver (`code_driver.encode`); ProtocolError if malformed."""
    if depth > MAX_VALUE_DEPTH + 1:
        raise ProtocolError("too deep")
    if value is None or isinstance(value, bool):
        return value
    if not isinstance(value, list) or not value or not isinstance(value[0], str):
        raise ProtocolError("bad value")
    tag, rest = value[0], value[1:]
    try:
        scalar = _SCALARS.get(tag)
        if scalar is not None and (tag != STR or isinstance(rest[0], str)):
            return scalar(rest)
        if tag == DICT:
            return {decode(k, depth + 1): decode(v, depth + 1) for k, v in rest[0]}
        items = [decode(x, depth + 1) for x in rest[0]]
        collection = _COLLECTIONS.get(tag)
        if collection is not None:
            return collection(items)
    except (TypeError, ValueError, IndexError, OverflowError) as exc:
        raise ProtocolError(f"bad value: {type(exc).__name__}") from None
    raise ProtocolError("bad tag")


# --------------------------------------------------------------------------------------------
# Judging: the parent evaluates the judge expression itself
# --------------------------------------------------------------------------------------------


def _check_size(value: Any) -> Any:
    if isinstance(value, (str, bytes, list, tuple, set, frozenset, dict, range)):
        if len(value) > _MAX_JUDGE_LEN:
            raise JudgeLimit("value too large")
    return value


def _binop(op: ast.operator, left: Any, right: Any) -> Any:
    if isinstance(op, ast.Pow) and isinstance(left, int) and isinstance(right, int):
        if right > 10_000 and abs(left) > 1 or abs(left).bit_length() * max(right, 0) > 10**7:
            raise JudgeLimit("power too large")
    if isinstance(op, ast.LShift) and isinstance(right, int) and right > 10**6:
        raise JudgeLimit("shift too large")
    if isinstance(op, ast.Mult):
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int):
                if len(seq) * n > _MAX_JUDGE_LEN:
                    raise JudgeLimit("repetition too large")
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
            raise JudgeLimit("range too large")
        return r
    if (
        name in ("str", "repr")
        and args
        and isinstance(args[0], int)
        and not isinstance(args[0], bool)
    ):
        if abs(args[0]).bit_length() > 13_000:  # int->str is quadratic; 4300 digits is the cap
            raise JudgeLimit("int too large to print")
    if name == "sum" and args:
        start = args[1] if len(args) > 1 else kwargs.get("start", 0)
        if not isinstance(start, (int, float, complex)) and len(args[0]) > 10_000:
            raise JudgeLimit("sum of sequences too long")  # sum(lists, []) is quadratic
    if name in ("zip", "enumerate", "reversed", "map"):
        return list(func(*args, **kwargs))  # materialise: values are finite plain data
    return _check_size(func(*args, **kwargs))


def _judge_name(node: ast.Name, env: dict[str, Any]) -> Any:
    """A probe's value (raising its failure), or a safe builtin."""
    if node.id in env:
        value = env[node.id]
        if isinstance(value, ProbeFailed):
            raise value
        return value
    return _SAFE_NAMES[node.id]


def _judge_display(node: ast.expr, env: dict[str, Any]) -> Any:
    """A tuple, list, set or dict display."""
    if isinstance(node, ast.Tuple):
        return tuple(judge(e, env) for e in node.elts)
    if isinstance(node, ast.List):
        return [judge(e, env) for e in node.elts]
    if isinstance(node, ast.Set):
        return {judge(e, env) for e in node.elts}
    assert isinstance(node, ast.Dict)
    return {judge(k, env): judge(v, env) for k, v in zip(node.keys, node.values)}  # type: ignore[arg-type]


def _judge_boolop(node: ast.BoolOp, env: dict[str, Any]) -> Any:
    """``and`` / ``or`` with Python's short-circuits and operand values."""
    value = None
    for sub in node.values:
        value = judge(sub, env)
        if isinstance(node.op, ast.And) and not value:
            return value
        if isinstance(node.op, ast.Or) and value:
            return value
    return value


def _judge_compare(node: ast.Compare, env: dict[str, Any]) -> bool:
    """A comparison chain, each operand evaluated once and only while the chain holds."""
    left = judge(node.left, env)
    for op, comparator in zip(node.ops, node.comparators):
        right = judge(comparator, env)
        if not _COMPARE[type(op)](left, right):
            return False
        left = right
    return True


def _judge_slice(node: ast.Slice, env: dict[str, Any]) -> slice:
    parts = (node.lower, node.upper, node.step)
    return slice(*(None if p is None else judge(p, env) for p in parts))


def _judge_call(node: ast.Call, env: dict[str, Any]) -> Any:
    """A call of a safe builtin or ``math`` function, with the size guards."""
    if isinstance(node.func, ast.Name):
        name, func = node.func.id, _SAFE_FUNCTIONS[node.func.id]
    else:
        name, func = node.func.attr, _MATH[node.func.attr]  # type: ignore[attr-defined]
    args = [judge(a, env) for a in node.args]
    kwargs = {k.arg: judge(k.value, env) for k in node.keywords if k.arg is not None}
    return _safe_call(name, func, args, kwargs)


_BRACKETED: dict[type, Callable[[Any, dict[str, Any]], Any]] = {
    ast.Tuple: _judge_display,
    ast.List: _judge_display,
    ast.Set: _judge_display,
    ast.Dict: _judge_display,
    ast.BoolOp: _judge_boolop,
    ast.Compare: _judge_compare,
    ast.Slice: _judge_slice,
    ast.Call: _judge_call,
}


def judge(node: ast.AST, env: dict[str, Any]) -> Any:
    """Evaluate a planned expression in the parent; ``env`` maps probe names to their values."""
    if isinstance(node, ast.Expression):
        return judge(node.body, env)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return _judge_name(node, env)
    if isinstance(node, ast.Attribute):
        return _MATH[node.attr]
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](judge(node.operand, env))
    if isinstance(node, ast.BinOp):
        return _binop(node.op, judge(node.left, env), judge(node.right, env))
    if isinstance(node, ast.IfExp):
        return judge(node.body if judge(node.test, env) else node.orelse, env)
    if isinstance(node, ast.Subscript):
        return judge(node.value, env)[judge(node.slice, env)]
    bracketed = _BRACKETED.get(type(node))
    if bracketed is None:  # the planner prevents this
        raise ProtocolError(f"unsupported node {type(node).__name__}")
    return bracketed(node, env)


# --------------------------------------------------------------------------------------------
# One test's record from one run
# --------------------------------------------------------------------------------------------


def make_record(plan: Plan, reason: str, detail: str | None = None, wall_s: float = 0.0) -> dict:
    """The per-test record of ``parts["tests"]``."""
    return {
        "test": plan.source,
        "reason": reason,
        "detail": detail,
        "check": "parent" if plan.strict else "child",
        "wall_s": round(wall_s, 4),
    }


def _failure_reason(exc_name: str) -> str:
    return "memory" if exc_name == "MemoryError" else "crash"


class _Messages:
    """What one child said, checked message by message (the driver's protocol)."""

    def __init__(self, probes: int) -> None:
        self.probes = probes
        self.exec_ok = False
        self.exec_error: str | None = None
        self.outcomes: dict[int, Any] = {}  # probe index -> value or ProbeFailed

    def take(self, message: Any) -> None:
        """Record one message; ProtocolError if it is malformed or out of order."""
        if not isinstance(message, list) or not message:
            raise ProtocolError("bad message")
        kind = message[0]
        started = self.exec_ok or self.exec_error is not None
        if kind == EXEC_OK and not started:
            self.exec_ok = True
        elif kind == EXEC_ERROR and not started:
            self.exec_error = str(message[1])[:100] if len(message) > 1 else "?"
        elif kind in PROBE_RESULTS and self.exec_ok and len(message) == 3:
            self.take_result(kind, message[1], message[2])
        else:
            raise ProtocolError(f"unexpected message {str(kind)[:30]}")

    def take_result(self, kind: str, index: Any, body: Any) -> None:
        """One probe's result: its value, or why it has none."""
        if not isinstance(index, int) or not 0 <= index < self.probes:
            raise ProtocolError("bad probe index")
        if index in self.outcomes:
            raise ProtocolError("duplicate result")
        if kind == VALUE:
            self.outcomes[index] = decode(body)
        elif kind == RAISED:
            name = str(body)[:100]
            self.outcomes[index] = ProbeFailed(_failure_reason(name), f"raised {name}")
        else:
            self.outcomes[index] = ProbeFailed("wrong", str(body)[:200])


def _unfinished(plan: Plan, run: RunResult) -> dict:
    """The record of a run that ended before every probe had a result."""
    if run.timed_out or run.cpu_limited:
        limit = "wall clock" if run.timed_out else "cpu"
        return make_record(plan, "timeout", f"{limit} limit", run.wall_s)
    how = (
        f"killed by signal {run.signal}"
        if run.signal is not None
        else f"exited ({run.returncode}) before the test finished"
    )
    return make_record(plan, "crash", how, run.wall_s)


def _verdict(plan: Plan, outcomes: dict[int, Any], wall: float) -> dict:
    """Judge the test on the probes' values."""
    env = {probe_name(i): value for i, value in outcomes.items()}
    try:
        assert plan.judge is not None
        passed = bool(judge(plan.judge, env))
    except ProbeFailed as exc:
        return make_record(plan, exc.reason, exc.detail, wall)
    except JudgeLimit as exc:
        return make_record(plan, "wrong", f"test too large to judge: {exc}", wall)
    except ProtocolError as exc:
        return make_record(plan, "crash", f"bad result: {exc}", wall)
    except Exception as exc:  # the assertion itself raised (TypeError on None < 3, ...)
        return make_record(plan, "wrong", f"test raised {type(exc).__name__}", wall)
    return make_record(plan, "passed" if passed else "wrong", None, wall)


def interpret(plan: Plan, run: RunResult) -> tuple[dict, bool]:
    """(test record, whether the program failed before the test could start) for one run."""
    messages = _Messages(len(plan.probes))
    try:
        if run.overflow:
            raise ProtocolError("result flood")
        for message in run.messages:
            messages.take(message)
    except (ProtocolError, RecursionError) as exc:
        return make_record(plan, "crash", f"bad result: {exc}", run.wall_s), not messages.exec_ok
    if messages.exec_error is not None:
        name = messages.exec_error
        return make_record(plan, _failure_reason(name), f"raised {name}", run.wall_s), True
    if len(messages.outcomes) < len(plan.probes):
        return _unfinished(plan, run), not messages.exec_ok
    return _verdict(plan, messages.outcomes, run.wall_s), False
