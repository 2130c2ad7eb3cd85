"""Grade a JSONL file of completions with any rlvr verifier, summarised by reason.

A row may carry its ``prompt`` too: the math verifier then refuses an answer that merely
restates the prompt's expression (``#### 357+468`` for "357+468=").
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

REFERENCE_FIELD = {
    "math": "answer",
    "weak_math": "answer",
    "tool": "answer",
    "code": "tests",
    "format": None,
}


def grade_one(
    verifier: str,
    completion: Any,
    reference: Any,
    *,
    prompt: Any = None,
    explain: bool = False,
    **options: Any,
) -> tuple[float, dict]:
    """(reward, parts) of one completion; `verifier` is a key of REFERENCE_FIELD.

    ``prompt`` goes to the math verifier (its echo rule); the others ignore it. With
    ``explain`` (math only), ``parts["explain"]`` says which rules decided, one step a line
    (`rlvr.verifiers.math.explain`).
    """
    if verifier == "math":
        from rlvr.verifiers import math as math_verifier

        reward, parts = math_verifier.verify(completion, reference, prompt=prompt, **options)
        if explain:
            why = math_verifier.explain(completion, reference, prompt=prompt, **options)
            parts = {**parts, "explain": why}
        return reward, parts
    if verifier == "code":
        from rlvr.verifiers import code

        return code.verify(code.extract_code(completion), reference)
    if verifier not in REFERENCE_FIELD:
        raise ValueError(f"unknown verifier {verifier!r}; choose one of {sorted(REFERENCE_FIELD)}")
    from rlvr.verifiers.adapters import VERIFIERS

    options.pop("marker", None)
    if REFERENCE_FIELD[verifier] is None:
        return VERIFIERS[verifier](completion)
    return VERIFIERS[verifier](completion, reference, **options)


def grade_file(path: str | Path, verifier: str = "math") -> dict[str, Any]:
    """Grade every line of a JSONL file; a malformed line is refused with its number."""
    path = Path(path)
    if verifier not in REFERENCE_FIELD:
        raise ValueError(f"unknown verifier {verifier!r}; choose one of {sorted(REFERENCE_FIELD)}")
    field = REFERENCE_FIELD[verifier]
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        missing = [k for k in ("completion", field) if k and k not in row]
        if not isinstance(row, dict) or missing:
            raise ValueError(f"{path}:{number}: missing field(s) {missing or ['completion']}")
        rows.append(row)
    reasons: Counter[str] = Counter()
    total = 0.0
    for row in rows:
        reference = row.get(field) if field else None
        reward, parts = grade_one(verifier, row["completion"], reference, prompt=row.get("prompt"))
        reasons[str(parts.get("reason"))] += 1
        total += reward
    return {
        "file": str(path),
        "verifier": verifier,
        "completions": len(rows),
        "mean_reward": total / len(rows) if rows else None,
        "by_reason": dict(reasons.most_common()),
    }
