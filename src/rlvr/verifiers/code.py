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

import functools
import os
import re
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rlvr.verifiers.code_driver import EXEC_OK, make_payload
from rlvr.verifiers.code_judge import (
    MAX_VALUE_CHARS,
    MAX_VALUE_DEPTH,
    MAX_VALUE_ITEMS,
    Plan,
    interpret,
    make_record,
    plan_test,
)
from rlvr.verifiers.format import completion_text
from rlvr.verifiers.sandbox import SandboxLimits, module_source, run_python_many

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
# Running one program against its tests (planning and judging: code_judge.py; the child's
# side: code_driver.py)
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _driver_source() -> str:
    """The driver sent to every sandbox (read once from the package)."""
    return module_source("code_driver")


def _run_tests(code: str, plans: list[Plan], limits: SandboxLimits) -> list[dict]:
    """One sandbox for the program; each test a fresh process in it (module docstring)."""
    payloads = [
        make_payload(code, plan.probes, MAX_VALUE_CHARS, MAX_VALUE_ITEMS, MAX_VALUE_DEPTH)
        for plan in plans
    ]
    res = run_python_many(_driver_source(), payloads, limits, stop_marker=[EXEC_OK])
    if res.setup_error or not res.started:
        detail = res.setup_error or ("start-up timed out" if res.timed_out else "did not start")
        return [make_record(plan, "error", f"sandbox: {detail}") for plan in plans]
    records: list[dict] = []
    module_failure: dict | None = None
    for plan, run in zip(plans, res.runs):
        if module_failure is not None:
            detail = f"{module_failure['detail']} (module level; not rerun)"
            records.append(make_record(plan, module_failure["reason"], detail))
        elif not run.completed:  # the sandbox itself ran out of time or died
            reason = "timeout" if res.timed_out else "error"
            records.append(make_record(plan, reason, "sandbox ended before this test"))
        else:
            record, failed_early = interpret(plan, run)
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
    plans = [plan_test(t) for t in test_list]
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
        parts["tests"] = [make_record(p, "syntax_error", type(exc).__name__) for p in plans]
        return 0.0
    runnable = [plan for plan in plans if plan.error is None]
    results = iter(_run_tests(code, runnable, limits) if runnable else [])
    for plan in plans:
        if plan.error is not None:
            records.append(make_record(plan, "invalid_test", plan.error))
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
