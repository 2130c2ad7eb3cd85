"""Symbolic comparison for the math verifier: sympy and math-verify in worker processes.

`symbolic_verdict` is what `rlvr.verifiers.math` calls when neither side is a plain number
(its module docstring, "Comparison", has the policy). The comparison runs in a persistent worker
process (``python -c``, JSON lines on stdin/stdout; `worker_main`), never in the caller, so the
time limit holds on any thread and inside worker processes: math-verify's own ``signal.alarm``
only works on the main thread. The worker interrupts itself at 80% of the limit (SIGALRM, which
works there: it is the worker's main thread); if it is stuck in C code past the full limit, the
caller kills that one process, and the next call starts a fresh one. Workers also run under a
4 GiB address-space limit.

Why not ``concurrent.futures.ProcessPoolExecutor``: a running future cannot be cancelled, and
the executor has no way to kill one stuck worker; killing its process marks the whole pool
broken and fails every pending future. The small pool here (`_Pool`) owns its processes, kills
exactly the one that ran over, and is re-created in a forked child (its pipes belong to the
parent).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = [
    "SymbolicTimeout",
    "SymbolicUnavailable",
    "compare_symbolic",
    "symbolic_verdict",
    "warm_up",
    "worker_main",
]

_SOFT_TIMEOUT_FRACTION = 0.8  # the worker interrupts itself first, so it need not be killed
_WORKER_STARTUP_TIMEOUT_S = 60.0
_WORKER_MEMORY_BYTES = 4 << 30
_MAX_WORKERS = max(1, min(4, os.cpu_count() or 1))
_UNESCAPED_PERCENT = re.compile(r"(?<!\\)%")


# --- caller side -------------------------------------------------------------------------


class SymbolicTimeout(Exception):
    """The worker ran past the limit (it was interrupted or killed)."""


class SymbolicUnavailable(Exception):
    """No worker could be started, or it died mid-request (never cached: the next call retries)."""


class _Worker:
    """One persistent worker process speaking JSON lines over its stdin/stdout."""

    def __init__(self) -> None:
        src_dir = str(Path(__file__).resolve().parents[2])
        code = (
            f"import sys; sys.path.insert(0, {src_dir!r}); "
            "from rlvr.verifiers.math_symbolic import worker_main; worker_main()"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # a terminal's Ctrl-C is the caller's to handle
        )
        self._buffer = b""
        self._next_id = 0
        deadline = time.monotonic() + _WORKER_STARTUP_TIMEOUT_S
        if self._read_line(deadline) != b"ready":
            self.kill()
            raise RuntimeError("the math verifier's worker process did not start")

    def _read_line(self, deadline: float) -> bytes | None:
        """The next line, or None at the deadline; raises EOFError if the worker died."""
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError("the math verifier's worker process exited")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def request(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """The worker's reply, or None when it is still busy after ``timeout_s``."""
        self._next_id += 1
        payload = {**payload, "id": self._next_id}
        deadline = time.monotonic() + timeout_s
        self.proc.stdin.write(json.dumps(payload).encode() + b"\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        while (line := self._read_line(deadline)) is not None:
            reply = json.loads(line)
            if reply.get("id") == self._next_id:
                return reply
        return None

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.close_pipes()

    def close_pipes(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass

    def stop(self) -> None:
        """Close its stdin (the worker exits at EOF); kill it if it lingers."""
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(timeout=1)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class _Pool:
    """Workers for this process: started on demand, up to `_MAX_WORKERS` busy at once."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.condition = threading.Condition()
        self.idle: list[_Worker] = []
        self.busy: set[_Worker] = set()
        self.size = 0

    def acquire(self) -> _Worker:
        with self.condition:
            while not self.idle and self.size >= _MAX_WORKERS:
                self.condition.wait()
            if self.idle:
                worker = self.idle.pop()
                self.busy.add(worker)
                return worker
            self.size += 1
        try:
            worker = _Worker()  # started outside the lock: it takes a while
        except BaseException:
            with self.condition:
                self.size -= 1
                self.condition.notify()
            raise
        with self.condition:
            self.busy.add(worker)
        return worker

    def release(self, worker: _Worker, healthy: bool) -> None:
        if not healthy:
            worker.kill()
        with self.condition:
            self.busy.discard(worker)
            if healthy:
                self.idle.append(worker)
            else:
                self.size -= 1
            self.condition.notify()

    def shutdown(self) -> None:
        with self.condition:
            workers, self.idle = self.idle + list(self.busy), []
            self.busy.clear()
            self.size = 0
        for worker in workers:
            worker.stop()

    def forget(self) -> None:
        """In a forked child: drop the parent's workers without touching them."""
        for worker in self.idle + list(self.busy):
            worker.close_pipes()


_POOL: _Pool | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> _Pool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():
            _POOL = _Pool()
        return _POOL


def _shutdown_workers() -> None:
    """Stop this process's workers (at exit; tests use it to force a fresh start)."""
    pool = _POOL
    if pool is not None and pool.pid == os.getpid():
        pool.shutdown()


def _after_fork_in_child() -> None:
    global _POOL, _POOL_LOCK
    if _POOL is not None:
        _POOL.forget()
    _POOL = None
    _POOL_LOCK = threading.Lock()  # a lock held by another thread at fork time stays held


atexit.register(_shutdown_workers)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def warm_up() -> None:
    """Start a worker now, so the first symbolic comparison does not wait for it (~0.5 s)."""
    pool = _pool()
    pool.release(pool.acquire(), healthy=True)


@lru_cache(maxsize=8192)
def symbolic_verdict(
    gold: str, predicted: str, gold_percent: bool, predicted_percent: bool, timeout_s: float
) -> str:
    """The worker's verdict; raises SymbolicTimeout (never cached) past ``timeout_s``."""
    pool = _pool()
    try:
        worker = pool.acquire()
    except Exception as exc:
        raise SymbolicUnavailable from exc  # counted as an error, not as a wrong answer
    payload = {
        "gold": gold,
        "pred": predicted,
        "gold_percent": gold_percent,
        "pred_percent": predicted_percent,
        "soft_timeout_s": timeout_s * _SOFT_TIMEOUT_FRACTION,
    }
    healthy = False
    try:
        reply = worker.request(payload, timeout_s)
        if reply is None:
            raise SymbolicTimeout  # still busy: the pool kills it below
        healthy = not reply.get("restart", False)
        if reply["verdict"] == "timeout":
            raise SymbolicTimeout
        return str(reply["verdict"])
    except (OSError, EOFError, ValueError, KeyError) as exc:
        raise SymbolicUnavailable from exc
    finally:
        pool.release(worker, healthy)


# --- worker side (runs in the worker process only) -----------------------------------------


class _SoftTimeout(BaseException):
    """Raised by SIGALRM in the worker; BaseException so math-verify's handlers let it pass."""


@lru_cache(maxsize=1)
def _extraction_config() -> list[Any]:
    """math-verify's default extraction, without its unit stripping: it drops ``h`` (hours)
    and ``m`` (metres) from ``\\frac{1}{2} b h``; rlvr.verifiers.math splits units itself."""
    from latex2sympy2_extended.latex2sympy2 import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    normalization = NormalizationConfig(
        basic_latex=True, units=False, malformed_operators=True, nits=True, boxed="all"
    )
    return [LatexExtractionConfig(normalization_config=normalization), ExprExtractionConfig()]


@lru_cache(maxsize=4096)
def _parse_exact(expression: str) -> Any:
    """math-verify's reading of ``\\boxed{expression}`` with every float made exact and the
    symbol ``i`` read as the imaginary unit; or None."""
    from math_verify import parse
    from sympy import Basic
    from sympy.matrices import MatrixBase

    latex = "\\boxed{" + _UNESCAPED_PERCENT.sub(r"\\%", expression) + "}"
    parsed = parse(latex, _extraction_config(), parsing_timeout=None)
    expr = next((p for p in parsed if isinstance(p, (Basic, MatrixBase))), None)
    if expr is None:
        return None
    return expr.applyfunc(_exact_float) if isinstance(expr, MatrixBase) else _exact_float(expr)


def _exact_float(value: Any) -> Any:
    """Every sympy Float replaced by the rational number its decimal digits spell, and the
    symbol ``i`` by the imaginary unit (math-verify reads ``e^{i\\pi}`` with a symbol i)."""
    from sympy import Float, I, Rational, Symbol

    replacements: dict[Any, Any] = {f: Rational(str(f)) for f in value.atoms(Float)}
    for symbol in getattr(value, "free_symbols", ()):
        if isinstance(symbol, Symbol) and symbol.name == "i":
            replacements[symbol] = I
    return value.xreplace(replacements) if replacements else value


def _summed(expr: Any) -> Any:
    """A series in closed form where sympy finds one (``\\sum_{n \\ge 0} x^n`` -> ``1/(1-x)``,
    the branch where it converges); else the expression unchanged."""
    from sympy import Piecewise, Sum

    if not isinstance(expr, Sum):
        return expr
    closed = expr.doit()
    if isinstance(closed, Piecewise):
        closed = closed.args[0].expr
    return expr if closed.has(Sum) else closed


def _as_vectors(gold: Any, predicted: Any) -> tuple[Any, Any]:
    """A column or row vector against a tuple (``(3, 4)``, which math-verify reads as an open
    interval when it has two entries): both as tuples of their entries."""
    from sympy import Interval, Tuple
    from sympy.matrices import MatrixBase

    def entries(value: Any) -> Any:
        if isinstance(value, MatrixBase) and 1 in value.shape:
            return Tuple(*list(value))
        if isinstance(value, Interval) and value.left_open and value.right_open:
            return Tuple(value.start, value.end)
        return value if isinstance(value, Tuple) else None

    if isinstance(gold, MatrixBase) != isinstance(predicted, MatrixBase):
        gold_entries, predicted_entries = entries(gold), entries(predicted)
        if gold_entries is not None and predicted_entries is not None:
            return gold_entries, predicted_entries
    return gold, predicted


def _assigned_values(expr: Any) -> Any:
    """``x = 5`` -> 5, also inside sets and tuples (``x=1, x=2`` -> {1, 2})."""
    from sympy import Eq, FiniteSet, Symbol, Tuple

    if isinstance(expr, Eq) and isinstance(expr.lhs, Symbol):
        return _assigned_values(expr.rhs)
    if isinstance(expr, (FiniteSet, Tuple)):
        return type(expr)(*[_assigned_values(arg) for arg in expr.args])
    return expr


def _is_scalar(expr: Any) -> bool:
    from sympy import Expr
    from sympy.matrices import MatrixBase
    from sympy.matrices.expressions import MatrixExpr

    return isinstance(expr, Expr) and not isinstance(expr, (MatrixBase, MatrixExpr))


def _non_finite(expr: Any) -> bool:
    from sympy import S

    return bool(expr.has(S.Infinity, S.NegativeInfinity, S.ComplexInfinity, S.NaN))


def _judge(gold: Any, predicted: Any) -> str:
    """Verdict "correct", "wrong" or "hedged" for two parsed, exact sympy objects."""
    from math_verify import verify as math_verify_equal
    from sympy import EmptySet, FiniteSet, Set, Tuple
    from sympy.logic.boolalg import BooleanFunction

    gold, predicted = _as_vectors(_summed(gold), predicted)
    values = _assigned_values(predicted)
    if _is_scalar(gold):
        if isinstance(values, FiniteSet) and len(values) == 1:
            values = next(iter(values))  # {5} is 5
        if values == EmptySet:
            return "wrong"
        if isinstance(values, (Set, BooleanFunction)) or getattr(values, "is_Relational", False):
            return "hedged"  # a set, interval or inequality offers many values
        if isinstance(values, Tuple):
            return "hedged" if len(values) > 1 else "wrong"
        if not _is_scalar(values):
            return "wrong"  # a matrix, a truth value
        predicted = values
        if not gold.free_symbols and values.free_symbols:
            return "wrong"  # a free symbol never equals a number
    if not _non_finite(gold) and _non_finite(values):
        return "wrong"  # nor does infinity
    equal = math_verify_equal(
        [gold], [predicted], allow_set_relation_comp=True, timeout_seconds=None
    )
    return "correct" if equal else "wrong"


def compare_symbolic(
    gold: str, predicted: str, gold_percent: bool = False, predicted_percent: bool = False
) -> str:
    """The worker's verdict: "correct", "wrong", "hedged", "unparsable" or "bad_reference"."""
    from sympy import Rational

    gold_expr = _parse_exact(gold)
    if gold_expr is None:
        return "bad_reference"
    predicted_expr = _parse_exact(predicted)
    if predicted_expr is None:
        return "unparsable"
    verdict = _judge(gold_expr, predicted_expr)
    if verdict == "wrong" and gold_percent != predicted_percent:
        if predicted_percent and _is_scalar(predicted_expr):
            return _judge(gold_expr, predicted_expr * Rational(1, 100))
        if gold_percent and _is_scalar(gold_expr):
            return _judge(gold_expr * Rational(1, 100), predicted_expr)
    return verdict


def _serve(request: dict[str, Any]) -> dict[str, Any]:
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, max(0.01, float(request["soft_timeout_s"])))
            verdict = compare_symbolic(
                str(request["gold"]),
                str(request["pred"]),
                bool(request["gold_percent"]),
                bool(request["pred_percent"]),
            )
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _SoftTimeout:
        return {"verdict": "timeout"}
    except MemoryError:
        return {"verdict": "timeout", "restart": True}  # past the memory limit: start afresh
    except Exception:
        return {"verdict": "error"}
    return {"verdict": verdict}


def worker_main() -> None:
    """Entry point of the worker process: JSON requests on stdin, JSON verdicts on stdout."""
    import logging

    protocol = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # stray prints from libraries go to stderr, never into the protocol
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (_WORKER_MEMORY_BYTES, _WORKER_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):
        pass
    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.CRITICAL)

    def on_alarm(signum: int, frame: Any) -> None:
        raise _SoftTimeout

    signal.signal(signal.SIGALRM, on_alarm)
    compare_symbolic("1", "1")  # import sympy and math-verify, build the parser's tables
    protocol.write(b"ready\n")
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
        except ValueError:
            continue
        reply = {"id": request.get("id"), **_serve(request)}
        protocol.write(json.dumps(reply).encode() + b"\n")
        if reply.get("restart"):
            return
