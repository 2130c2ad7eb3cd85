"""verl's `data_source` column: which rlvr verifier grades a row of a file in verl's layout.

verl picks a scoring function by each row's `data_source` (`default_compute_score` in
volcengine/verl `verl/utils/reward_score/__init__.py`, read at commit b178a3c, January 2026).
The same names route here, each to rlvr's own verifier:

  ==========================================================  ===================================
  data_source                                                 verifier
  ==========================================================  ===================================
  openai/gsm8k                                                strict math (``#### N``, as verl's
                                                              gsm8k scorer reads)
  lighteval/MATH, DigitalLearningGmbH/MATH-lighteval,         strict math (``\\boxed{}``)
  HuggingFaceH4/MATH-500
  numina_aops_forum, numina_synthetic_math, numina_amc_aime,  strict math (verl: prime_math,
  numina_synthetic_amc, numina_cn_k12, numina_olympiads       ``\\boxed{}``)
  math_dapo, math, math_dapo_reasoning, and any name that     strict math with the marker
  starts with "aime"                                          ``Answer:`` (verl: math_dapo)
  codecontests, apps, codeforces, taco                        sandboxed code (assert tests)
  ==========================================================  ===================================

Deviations from verl, all on purpose:
  * Rewards are 1/0 (DAPO's scorer gives -1 for a wrong answer) and every math source gets the
    strict verifier (`rlvr.verifiers.math`: one final answer, no hedging), not verl's string
    matchers. DAPO's ``Answer:`` is matched case-sensitively, and a ``\\boxed{}`` answer counts
    there as well.
  * Code: rlvr's sandbox runs Python ``assert`` tests against the program's functions. verl's
    code rows usually hold stdin/stdout tests (a JSON string ``{"inputs": [...], "outputs":
    [...]}``, APPS style); the sandbox has no stdin/stdout runner, so such rows are refused
    before training (`code_fields`), never graded 0 in silence.
  * Not routed: ``hiyouga/geometry3k`` (image prompts) and the ``searchR1_*`` sources
    (exact-match QA); a file naming them is refused as an unknown source.

Another source: `register_data_source(name, reward_fn, score_fn)` before the task is built (e.g.
in a script that then calls `rlvr.cli.main([...])`). Its rows get the ground truth as their
`answer` column; `reward_fn` is TRL's form, ``fn(prompts, completions, answer, **columns)``,
and `score_fn(completion, row)` grades one held-out completion.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.tasks.spec import Row
from rlvr.verifiers import code as code_verifier
from rlvr.verifiers import math as math_verifier

RewardFn = Callable[..., Sequence[float | None]]
ScoreFn = Callable[[Any, Row], float]

DAPO_MARKER = "Answer:"
"""The answer marker of verl's DAPO sources (their prompts ask for a last line "Answer: ...")."""
PREFIXES = ("aime",)
"""Name prefixes that route like a full name (verl: `data_source.startswith("aime")`)."""
SUPPORTED_TESTS = (
    "supported: Python assert statements, as a list of strings, a JSON string of one, or one "
    'per line (e.g. ["assert f(1) == 2"])'
)
STDIO_TESTS = (
    'stdin/stdout tests ({"inputs": [...], "outputs": [...]}), which rlvr\'s code verifier does '
    f"not run; {SUPPORTED_TESTS}"
)


@dataclass(frozen=True)
class DataSource:
    """How rows of one data source are graded."""

    reward_fn: RewardFn
    """TRL's form, fn(prompts, completions, **columns), on this source's rows only."""
    score_fn: ScoreFn
    """(completion, row) -> reward of one held-out completion."""
    fields: Callable[[Any], Row]
    """ground_truth -> the row fields `reward_fn` reads (e.g. {"answer": ...}); raises
    ValueError, saying what is wrong, for a ground truth this verifier cannot use."""


def answer_fields(ground_truth: Any) -> Row:
    """{"answer": ground_truth}: the fields of a registered source's row."""
    return {"answer": ground_truth}


def math_fields(ground_truth: Any) -> Row:
    """{"answer": ground_truth} for a math verifier: a non-empty text or a number."""
    if isinstance(ground_truth, bool) or not isinstance(ground_truth, (str, int, float)):
        raise ValueError(f"must be text or a number, not {type(ground_truth).__name__}")
    if isinstance(ground_truth, str) and not ground_truth.strip():
        raise ValueError("is empty")
    return {"answer": ground_truth}


def code_fields(ground_truth: Any) -> Row:
    """{"tests": [assert statements]} from a code row's ground truth: a list of strings, a
    JSON string of one, or a text with one statement per line, every one an ``assert``.
    stdin/stdout tests (a dict, or a JSON object string, with "inputs" and "outputs") are
    refused (`STDIO_TESTS`)."""
    value = ground_truth
    if isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass  # not JSON: a text of assert lines
    if isinstance(value, dict):
        if "inputs" in value or "outputs" in value:
            raise ValueError(f"holds {STDIO_TESTS}")
        keys = ", ".join(map(repr, value))
        raise ValueError(f"is a mapping of {keys}, not tests; {SUPPORTED_TESTS}")
    if isinstance(value, str):
        value = [line for line in value.splitlines() if line.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
        raise ValueError(f"is not a list of test statements; {SUPPORTED_TESTS}")
    if not value:
        raise ValueError("holds no tests")
    # a bare expression is a test to the verifier, and a constant one ("5") always passes
    strays = [t for t in value if not t.lstrip().startswith("assert")]
    if strays:
        raise ValueError(f"holds {strays[0]!r}, not an assert statement; {SUPPORTED_TESTS}")
    return {"tests": list(value)}


def math_score(completion: Any, row: Row) -> float:
    """The strict math verifier (``####`` or ``\\boxed{}``) on one completion of `row`."""
    return math_verifier.score(completion, row["answer"], prompt=row.get("prompt"))


def dapo_reward(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any], **columns: Any
) -> list[float]:
    """TRL reward function (column `answer`): the strict math verifier with the marker
    ``Answer:`` (a ``\\boxed{}`` counts too)."""
    if len(completions) != len(answer):
        raise ValueError(f"{len(completions)} completions but {len(answer)} answers")
    return [
        math_verifier.score(c, a, DAPO_MARKER, prompt=p)
        for p, c, a in zip(prompts, completions, answer, strict=True)
    ]


def dapo_score(completion: Any, row: Row) -> float:
    """`dapo_reward` on one completion of `row`."""
    return math_verifier.score(completion, row["answer"], DAPO_MARKER, prompt=row.get("prompt"))


def code_score(completion: Any, row: Row) -> float:
    """The sandboxed code verifier's pass fraction of one completion's program on `row`'s
    tests (the program is the completion's last ``python`` block, `extract_code`)."""
    return code_verifier.score(code_verifier.extract_code(completion), row["tests"])


_MATH = DataSource(math_verifier.math_reward, math_score, math_fields)
_DAPO = DataSource(dapo_reward, dapo_score, math_fields)
_CODE = DataSource(code_verifier.code_reward, code_score, code_fields)
_SOURCES: dict[str, DataSource] = {
    "openai/gsm8k": _MATH,
    **dict.fromkeys(
        ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"), _MATH
    ),
    **dict.fromkeys(("math_dapo", "math", "math_dapo_reasoning", "aime"), _DAPO),
    **dict.fromkeys(
        (
            "numina_aops_forum",
            "numina_synthetic_math",
            "numina_amc_aime",
            "numina_synthetic_amc",
            "numina_cn_k12",
            "numina_olympiads",
        ),
        _MATH,
    ),
    **dict.fromkeys(("codecontests", "apps", "codeforces", "taco"), _CODE),
}


def register_data_source(name: str, reward_fn: RewardFn, score_fn: ScoreFn) -> None:
    """Grade rows whose `data_source` is `name` with `reward_fn` (TRL's form, ``fn(prompts,
    completions, answer, **columns)``; `answer` is each row's ``reward_model.ground_truth``) and
    `score_fn(completion, row)` (held-out evaluation). Replaces a built-in source of that name.

    Call it before the task is built; registrations live in this process only.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a data source name must be a non-empty string, got {name!r}")
    _SOURCES[name] = DataSource(reward_fn, score_fn, answer_fields)


def lookup(name: Any) -> DataSource | None:
    """The source `name` routes to (its own entry, else a prefix's, `PREFIXES`); None if none."""
    if not isinstance(name, str):
        return None
    if name in _SOURCES:
        return _SOURCES[name]
    prefix = next((p for p in PREFIXES if name.startswith(p)), None)
    return _SOURCES.get(prefix) if prefix else None


def known_sources() -> list[str]:
    """The names `lookup` knows, sorted; a prefix is written with a trailing '*' ("aime*")."""
    return sorted(f"{n}*" if n in PREFIXES else n for n in _SOURCES)


def data_source_reward(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    data_source: Sequence[Any],
    **columns: Sequence[Any],
) -> list[float | None]:
    """TRL reward function (column `data_source`): every row graded by its source's verifier.

    Rows are grouped by source and each group is graded in one call of its `reward_fn` (with
    the group's slice of every column), so a code group runs its sandboxes in parallel.
    An unknown source raises ValueError (the trainer scores that batch 0 and counts errors);
    files are checked before training, so it only happens after a registration changed.
    """
    if not len(prompts) == len(completions) == len(data_source):
        raise ValueError(
            f"{len(prompts)} prompts, {len(completions)} completions, "
            f"{len(data_source)} data sources"
        )
    groups: dict[str, list[int]] = {}
    for i, name in enumerate(data_source):
        groups.setdefault(name, []).append(i)
    rewards: list[float | None] = [None] * len(completions)
    for name, rows in groups.items():
        source = lookup(name)
        if source is None:
            raise ValueError(f"unknown data_source {name!r}")
        picked = {key: [values[i] for i in rows] for key, values in columns.items()}
        values = list(
            source.reward_fn([prompts[i] for i in rows], [completions[i] for i in rows], **picked)
        )
        if len(values) != len(rows):
            raise ValueError(f"{name}: {len(values)} rewards for {len(rows)} completions")
        for i, value in zip(rows, values):
            rewards[i] = value
    return rewards


# the math rows' verdicts by reason (no_answer, hedged, ...) reach the trainer's metrics and the
# zero-reward watch through this attribute, as `math_reward`'s do
data_source_reward.reason_counts = math_verifier.reason_counts  # type: ignore[attr-defined]


def data_source_score(completion: Any, row: Row) -> float:
    """One held-out completion graded by its row's source (`lookup(row["data_source"])`)."""
    source = lookup(row["data_source"])
    if source is None:
        raise ValueError(f"unknown data_source {row['data_source']!r}")
    return source.score_fn(completion, row)
