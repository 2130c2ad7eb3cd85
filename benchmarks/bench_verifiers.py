"""Verifications per second on this machine: the math verifier and the code verifier.

    python benchmarks/bench_verifiers.py                 # defaults: 400 math items, 32 programs
    python benchmarks/bench_verifiers.py --math-items 1000 --programs 64
    python benchmarks/bench_verifiers.py --baseline 6b6695c --skip-code   # before/after, one run
    python benchmarks/bench_verifiers.py --lengths        # ms per call, 1 kB to 1 MB completions

Math: ``rlvr.verifiers.math.score`` against ``math_verify.parse`` + ``math_verify.verify`` called
directly, on the same completions (the answer in ``\\boxed{}``) and references: integer answers
(rlvr's exact Decimal fast path) and LaTeX answers written differently from the reference
(``\\frac{2a}{2b}`` for ``\\frac{a}{b}``, so both go through sympy). Every item is distinct, so
no parse cache helps; half of the answers are wrong. ``--baseline REV`` also times the math
verifier as it was at git revision REV (its ``src/rlvr/verifiers/math.py``, and its
``math_extract.py`` where REV has one, loaded beside the current ones) in the same run, so before
and after share the machine's load. It shares the current symbolic worker and its caches, so it
gets items of its own (same kinds, another seed).

Lengths (``--lengths``): ms per call of each in-process verifier, and of the code verifier's
extraction (the part that reads the completion), on completions of 1 kB, 10 kB, 100 kB and
1 MB with the right answer first, last, or absent, the rest filler full of what extractors look
for (numbers, ``$...$`` spans, answer phrases). Linear cost shows as x10 per column.

Code: ``rlvr.verifiers.code.verify`` one program after another against ``verify_batch`` with a
thread pool of sandboxes; each program has three ``assert`` tests, each test its own sandboxed
process. Half of the programs are wrong.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from math_verify import parse as mv_parse
from math_verify import verify as mv_verify

from rlvr.verifiers import exact, tool, weak
from rlvr.verifiers import format as format_verifier
from rlvr.verifiers.code import extract_code, verify_batch
from rlvr.verifiers.code import verify as code_verify
from rlvr.verifiers.math import score as math_score
from rlvr.verifiers.sandbox import missing_protections, sandbox_capabilities


def integer_items(n: int, rng: random.Random) -> list[tuple[str, str]]:
    items = []
    for i in range(n):
        a, b = rng.randint(100, 999), rng.randint(100, 999) + 1000 * i
        answer = a + b + (i % 2)  # every other answer is off by one
        items.append(
            (f"{a}+{b}: add the columns, so the answer is \\boxed{{{answer}}}.", str(a + b))
        )
    return items


def latex_items(n: int, rng: random.Random) -> list[tuple[str, str]]:
    items = []
    for i in range(n):
        p, q = rng.randint(1, 50) + 100 * i, rng.randint(51, 99)
        kind = i % 4
        if kind == 0:
            gold, said = f"\\frac{{{p}}}{{{q}}}", f"\\frac{{{2 * p}}}{{{2 * q}}}"
        elif kind == 1:
            gold, said = f"\\frac{{{p}}}{{{q}}}", f"\\frac{{{p + 1}}}{{{q}}}"
        elif kind == 2:
            gold, said = f"{p}\\sqrt{{{q}}}", f"\\sqrt{{{q}}} \\cdot {p}"
        else:
            gold, said = f"{p}\\pi", f"{p + 1}\\pi"
        items.append((f"Simplifying, we get \\boxed{{{said}}}.", gold))
    return items


def rlvr_math(items: list[tuple[str, str]], score: Callable[..., float] = math_score) -> float:
    return sum(score(completion, gold) for completion, gold in items)


def _module_at(revision: str, name: str, *, required: bool = True) -> Any:
    """src/rlvr/verifiers/NAME.py as it was at a git revision, run as a module of its own;
    None when the file is not there and not ``required``."""
    root = Path(__file__).resolve().parents[1]
    shown = subprocess.run(
        ["git", "show", f"{revision}:src/rlvr/verifiers/{name}.py"],
        cwd=root,
        capture_output=True,
        text=True,
        check=required,
    )
    if shown.returncode:
        return None
    spec = importlib.util.spec_from_loader(f"rlvr_{name}_baseline", loader=None)
    module: Any = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    exec(compile(shown.stdout, f"{revision}:{name}.py", "exec"), module.__dict__)
    return module


def baseline_score(revision: str) -> Callable[..., float]:
    """``score`` of src/rlvr/verifiers/math.py as it was at a git revision, with the
    math_extract.py of that revision where it has one (math.py imports it)."""
    extract = _module_at(revision, "math_extract", required=False)
    key, current = "rlvr.verifiers.math_extract", sys.modules.get("rlvr.verifiers.math_extract")
    if extract is not None:
        sys.modules[key] = extract  # only while math.py's imports run
    try:
        module = _module_at(revision, "math")
    finally:
        if current is not None:
            sys.modules[key] = current
        else:
            sys.modules.pop(key, None)
    return module.score


def direct_math_verify(items: list[tuple[str, str]]) -> float:
    return sum(
        float(mv_verify(mv_parse(f"${gold}$"), mv_parse(completion))) for completion, gold in items
    )


def code_items(n: int) -> tuple[list[str], list[list[str]]]:
    programs, tests = [], []
    for i in range(n):
        offset = i if i % 2 else 0  # odd programs are wrong
        programs.append(
            f"def solve(xs):\n    total = 0\n    for x in xs:\n        total += x * x\n"
            f"    return total + {offset}\n"
        )
        tests.append(
            [
                f"assert solve([1, 2, {i}]) == {5 + i * i}",
                "assert solve([]) == 0",
                f"assert solve(list(range({i + 3}))) == {sum(k * k for k in range(i + 3))}",
            ]
        )
    return programs, tests


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


LENGTHS = (1_000, 10_000, 100_000, 1_000_000)
FILLER = "Check: 12 + 30 = 42, and $x^2 = 4$ gives x = 2. Wait, maybe the answer is 7? "
# verifier -> (grade(completion), its right answer as written)
LENGTH_CASES: dict[str, tuple[Callable[[str], object], str]] = {
    "math": (lambda c: math_score(c, "\\frac{1}{2}"), "So the answer is \\boxed{\\frac{1}{2}}."),
    "exact": (lambda c: exact.score(c, "42"), "#### 42"),
    "weak": (lambda c: weak.score(c, "42"), "\\boxed{42}"),
    "format": (format_verifier.score, "<think>adding</think> 42"),
    "tool": (
        lambda c: tool.score(c, 3),
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
    ),
    "code (extraction)": (extract_code, "```python\ndef f():\n    return 1\n```"),
}


def length_sweep() -> None:
    """Print ms per call for each verifier x answer placement x completion length."""
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print()
    sizes = " | ".join(f"{n // 1000:,} kB" for n in LENGTHS)
    print(f"| verifier | answer | {sizes} |")
    print("| --- | --- |" + " ---: |" * len(LENGTHS))
    for name, (grade, answer) in LENGTH_CASES.items():
        grade(answer + FILLER)  # warm-up
        for where in ("first", "last", "absent"):
            cells = []
            for n in LENGTHS:
                body = (FILLER * (n // len(FILLER) + 1))[:n]
                text = {"first": f"{answer}\n{body}", "last": f"{body}\n{answer}"}.get(where, body)
                seconds, _ = timed(lambda text=text, grade=grade: grade(text))
                cells.append(f"{seconds * 1000:,.1f}")
            print(f"| {name} | {where} | " + " | ".join(cells) + " |")
    print()
    print("ms per call, one call each; the filler is numbers, $...$ spans and answer phrases.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--math-items", type=int, default=400)
    parser.add_argument("--programs", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", help="also time the math verifier of this git revision")
    parser.add_argument("--skip-code", action="store_true", help="time the math verifier only")
    parser.add_argument("--lengths", action="store_true", help="the completion-length sweep only")
    args = parser.parse_args()
    if args.lengths:
        length_sweep()
        return
    before = baseline_score(args.baseline) if args.baseline else None
    rng = random.Random(args.seed)
    cpus = os.cpu_count() or 1
    rows: list[tuple[str, str, int, float, str]] = []  # (group, what, n, seconds, ratio)

    # warm up imports and sympy on items not measured
    warm = integer_items(4, rng) + latex_items(4, rng)
    rlvr_math(warm), direct_math_verify(warm)
    if before is not None:
        rlvr_math(warm, before)

    for label, make in (("integer", integer_items), ("LaTeX", latex_items)):
        items = make(args.math_items, random.Random(rng.random()))
        t_rlvr, s_rlvr = timed(lambda items=items: rlvr_math(items))
        t_mv, s_mv = timed(lambda items=items: direct_math_verify(items))
        rows.append((f"math, {label}", "math_verify parse+verify", len(items), t_mv, "1.00"))
        ratio = f"{t_mv / t_rlvr:.2f}"
        rows.append((f"math, {label}", "rlvr.verifiers.math.score", len(items), t_rlvr, ratio))
        print(f"# math {label}: rlvr passed {s_rlvr:.0f}, math_verify {s_mv:.0f}", file=sys.stderr)
        if before is not None:
            own = make(args.math_items, random.Random(rng.random()))
            t_before, _ = timed(lambda own=own: rlvr_math(own, before))
            what = f"rlvr.verifiers.math.score at {args.baseline}"
            rows.append((f"math, {label}", what, len(items), t_before, f"{t_mv / t_before:.2f}"))

    caps = sandbox_capabilities()
    if args.skip_code:
        print_table(rows, caps, 0, cpus)
        return
    programs, tests = code_items(args.programs)
    code_verify(programs[0], tests[0])  # warm-up
    t_single, single = timed(lambda: [code_verify(p, t) for p, t in zip(programs, tests)])
    rows.append(("code", "verify, one at a time", len(programs), t_single, "1.00"))
    for workers in sorted({cpus, 2 * cpus}):
        t_pool, pooled = timed(lambda w=workers: verify_batch(programs, tests, workers=w))
        assert [r for r, _ in pooled] == [r for r, _ in single]  # type: ignore[union-attr]
        ratio = f"{t_single / t_pool:.2f}"
        rows.append(("code", f"verify_batch, {workers} workers", len(programs), t_pool, ratio))

    print_table(rows, caps, len(tests[0]), cpus)


def print_table(
    rows: list[tuple[str, str, int, float, str]],
    caps: dict[str, bool],
    tests_per_program: int,
    cpus: int,
) -> None:
    print(f"machine: {cpus} CPUs, Python {sys.version.split()[0]}")
    print(f"sandbox protections: {', '.join(k for k, v in caps.items() if v)}")
    print(f"sandbox missing: {', '.join(missing_protections(caps)) or 'nothing'}")
    print()
    print("| verifier | how | items | seconds | verifications/s | ratio |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for group, what, n, seconds, ratio in rows:
        rate = f"{n / seconds:,.1f}"
        if group == "code":
            rate += f" ({n * tests_per_program / seconds:,.0f} tests/s)"
        print(f"| {group} | {what} | {n} | {seconds:.2f} | {rate} | {ratio} |")
    print()
    print("ratio: speed relative to the first row of its group (higher is faster).")


if __name__ == "__main__":
    main()
