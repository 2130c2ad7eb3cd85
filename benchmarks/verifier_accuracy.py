"""Accuracy of the strict math verifier on hand-graded cases, against math-verify used directly.

    python benchmarks/verifier_accuracy.py    # the cases in tests/data/math_verifier_cases.jsonl
    python benchmarks/verifier_accuracy.py --cases FILE.jsonl --show-misses
    python benchmarks/verifier_accuracy.py --json accuracy.json   # the table also as a JSON dict

Each line of the cases file is ``{"category", "completion", "answer", "prompt"?, "expected"}``
with ``expected`` 1 (a right answer the verifier should accept) or 0 (one it should refuse).
``rlvr`` is ``rlvr.verifiers.math.score(completion, answer, prompt=prompt)``; ``math-verify``
is ``math_verify.verify(parse("\\\\boxed{answer}"), parse(completion))`` with its defaults (it
never sees the prompt). A decision is right when the score equals ``expected``. Accuracy divides
the right decisions by the cases of the row; a false accept is a 1 for an ``expected`` 0, a false
reject the reverse.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlvr.verifiers.math import score

CASES = Path(__file__).resolve().parents[1] / "tests" / "data" / "math_verifier_cases.jsonl"


def load_cases(path: str | Path = CASES) -> list[dict[str, Any]]:
    """The cases of a JSONL file, in file order."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def rlvr_decision(case: dict[str, Any]) -> int:
    """1 if rlvr's strict verifier accepts the case's completion, else 0."""
    return int(score(case["completion"], case["answer"], prompt=case.get("prompt")) == 1.0)


def math_verify_decision(case: dict[str, Any]) -> int:
    """1 if math-verify alone (parse + verify, its defaults) accepts the completion, else 0."""
    from math_verify import parse, verify

    try:
        gold = parse("\\boxed{" + str(case["answer"]) + "}")
        return int(bool(verify(gold, parse(case["completion"]))))
    except Exception:  # math-verify raises on some inputs (and on time-outs off the main thread)
        return 0


def tally(
    cases: list[dict[str, Any]], decide: Callable[[dict[str, Any]], int]
) -> tuple[dict[str, list[int]], list[tuple[dict[str, Any], int]]]:
    """Per category [cases, right, false accepts, false rejects], and the misses."""
    table: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    misses = []
    for case in cases:
        got, row = decide(case), table[case["category"]]
        row[0] += 1
        row[1] += got == case["expected"]
        row[2] += got == 1 and case["expected"] == 0
        row[3] += got == 0 and case["expected"] == 1
        if got != case["expected"]:
            misses.append((case, got))
    return dict(table), misses


def totals(table: dict[str, list[int]]) -> list[int]:
    """[cases, right, false accepts, false rejects] summed over the categories."""
    return [sum(row[i] for row in table.values()) for i in range(4)]


def json_report(ours: dict[str, list[int]], theirs: dict[str, list[int]]) -> dict[str, Any]:
    """The printed table as a dict: per category (and ``all``) the cases and each verifier's
    accuracy, right decisions, false accepts and false rejects."""

    def cell(row: list[int]) -> dict[str, Any]:
        return {
            "accuracy": row[1] / row[0],
            "right": row[1],
            "false_accepts": row[2],
            "false_rejects": row[3],
        }

    def entry(a: list[int], b: list[int]) -> dict[str, Any]:
        return {"cases": a[0], "rlvr": cell(a), "math_verify": cell(b)}

    return {
        "categories": {c: entry(ours[c], theirs[c]) for c in sorted(ours)},
        "all": entry(totals(ours), totals(theirs)),
    }


def write_json(path: str | Path, ours: dict[str, list[int]], theirs: dict[str, list[int]]) -> None:
    from rlvr.report.environment import environment

    report = {**json_report(ours, theirs), "environment": environment()}
    Path(path).write_text(json.dumps(report, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=str(CASES))
    parser.add_argument("--show-misses", action="store_true", help="print every miss of rlvr")
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="also write the table as a JSON dict: categories.<category> and all, each with "
        "cases and, for rlvr and math_verify, accuracy, right, false_accepts, false_rejects",
    )
    args = parser.parse_args()
    cases = load_cases(args.cases)
    ours, our_misses = tally(cases, rlvr_decision)
    theirs, _ = tally(cases, math_verify_decision)
    print("| category | cases | rlvr | rlvr FA/FR | math-verify | math-verify FA/FR |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for category in sorted(ours) + ["all"]:
        a = totals(ours) if category == "all" else ours[category]
        b = totals(theirs) if category == "all" else theirs[category]
        print(
            f"| {category} | {a[0]} | {a[1] / a[0]:.3f} | {a[2]}/{a[3]} "
            f"| {b[1] / b[0]:.3f} | {b[2]}/{b[3]} |"
        )
    print("\nFA: false accepts (a wrong or hacked answer scored 1); FR: false rejects.")
    if args.json:
        write_json(args.json, ours, theirs)
    if args.show_misses:
        for case, got in our_misses:
            shown = case["completion"] if len(case["completion"]) < 200 else "<long>"
            print(f"{case['category']}: got {got} for {shown!r} vs {case['answer']!r}")


if __name__ == "__main__":
    main()
