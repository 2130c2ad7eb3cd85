"""reasoning-gym's procedural generators as rlvr tasks, graded by rlvr's strict verifiers.

`--task reasoning_gym:SPEC` trains on any of reasoning-gym's generators (``pip install
'rlvr[gym]'``, reasoning-gym 0.1.25). SPEC is one task or a weighted mix:

    chain_sum                                 the generator's defaults
    chain_sum?min_terms=2&max_terms=3         options: the generator's config fields
    chain_sum?max_terms=3+leg_counting*2      a mix: '+' joins tasks, '*W' weighs one (default 1)

Option values are read as JSON where they parse (``3``, ``0.5``, ``true``, ``[1, 2]``,
``"text"``), Python's ``True``/``False``/``None`` too, else as plain text. ``+ & *`` separate
only outside quotes and brackets (``operators=["+","-"]`` is one option); put a plain-text
value that holds them in double quotes. ``seed`` and ``size`` are rlvr's, not options. A mix
draws each training row's task at random by weight, and splits the held-out set by weight.

Grading is rlvr's, never reasoning-gym's scorers
-----------------------------------------------
reasoning-gym's `score_answer` functions give partial credit (its default pays
``len(answer)/len(reply)`` whenever the answer appears anywhere in the reply), some pay for
any answer at all, and some raise on text they cannot parse; docs/verifiers.md ("reasoning-
gym: why its scorers are not the reward") has the measurements. So each task is graded as:

  * ``math``: every held-out reference is a plain number: the strict math verifier
    (`rlvr.verifiers.math`: the answer after ``####`` or in ``\\boxed{}``, hedges score 0).
  * ``exact``: word answers of a task whose reference is its only right answer (reasoning-gym
    grades it against the oracle with its default scorer, or the task is on `EXACT_MATCH`):
    `rlvr.verifiers.exact` (the same answer location; normalised case, spaces, quotes).
  * ``scorer``: answers with many valid forms (any order of prime factors, any valid path):
    reasoning-gym's own scorer, only for the tasks on `SCORER_ALLOW_LIST` (each checked), on
    the final answer located as above; only a score of exactly 1.0 counts, anything else is 0
    and an exception is 0 (counted as ``scorer_error``).

Any other task is refused before a model loads, and so is an unknown task name (with the
nearest names), an option its generator does not take (with the ones it takes), a value of
the wrong type or one its validation rejects (its message), and options that leave too few
distinct questions.

Rows
----
``prompt`` is `INSTRUCTION`, then the question and a newline (the question last, so that what the
answer depends on sits close to it: a tiny model learns that copy by relative position, as the
arithmetic task's docstring explains); ``answer`` is the reference; ``task`` the
generator's name; scorer tasks add ``metadata`` (what their scorer reads; JSON data). The
held-out set is `HELD_OUT_SIZE` distinct questions from a dataset seeded by `seed`; training
rows are an endless stream from datasets seeded by the training seed, skipping every held-out
question. (reasoning-gym's item ``i`` of seed ``s`` is generated from ``Random(s + i)``, so two
seeds' datasets share items; rows are kept apart by question text, not by seed.)

The base-model corpus is ``#### <answer>`` (the answer on one line), with a ``flaw_prob`` share
carrying a near miss that the task's grader scores 0: a number off by one in its last place,
True/False and Yes/No flipped, or two neighbouring characters of a word swapped.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import random
import re
import threading
import types
import typing
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from rlvr.config import UserError
from rlvr.tasks.spec import Row, TaskSpec
from rlvr.verifiers import exact as exact_verifier
from rlvr.verifiers import math as math_verifier
from rlvr.verifiers.format import answer_text, completion_text

__all__ = [
    "EXACT_MATCH",
    "HELD_OUT_SIZE",
    "INSTRUCTION",
    "SCORER_ALLOW_LIST",
    "GymNotInstalledError",
    "GymReward",
    "GymTaskError",
    "TaskRequest",
    "parse_spec",
    "task_spec",
]

PREFIX = "reasoning_gym:"
INSTRUCTION = "Give the final answer after ####.\n"
ANSWER_MARKER = "####"
HELD_OUT_SIZE = 200
CHUNK = 1000
"""Items per generated dataset: training streams reseed every CHUNK rows (some generators,
e.g. acre, precompute work in proportion to a dataset's size)."""
MAX_DRAWS_PER_QUESTION = 20
"""Held-out draws allowed per distinct question before the options count as too narrow."""
FRESH_PROBE = 100
MIN_FRESH_SHARE = 0.5
"""Of FRESH_PROBE draws past the held-out set, at least this share must be new questions, or
training would mostly redraw held-out ones (about: the held-out set is under half the space)."""
RESERVED_OPTIONS = ("seed", "size")

SCORER_ALLOW_LIST: dict[str, str] = {
    "prime_factorization": "factors in any order are right; 1.0 only when the sorted factor "
    "lists are equal (0.5 for a product that matches, 0.01 else; raises on non-integers)",
    "palindrome_generation": "any palindrome of the given letters is right; 1.0 only for a "
    "palindrome using exactly those letters (0.05 / 0.02 otherwise)",
    "knights_knaves": "names may come in any order; 1.0 only when the set of (name, role) "
    "pairs equals the oracle's (0.3 + 0.7 x matches for partial sets)",
    "shortest_path": "any shortest path is right; 1.0 only for a valid path (start to goal, no "
    "X cells) of the oracle's length (0.5 for a longer valid path)",
    "cryptarithm": "any valid letter-to-digit mapping is right; 1.0 only when every letter is "
    "mapped to a distinct digit, no leading zero, and the sum holds (0.01 otherwise)",
}
"""Tasks graded by reasoning-gym's own scorer (answers with many valid forms), each with what
was checked in its 0.1.25 source: the cases that score exactly 1.0 are right answers only."""

EXACT_MATCH: dict[str, str] = {
    "game_of_life_halting": "True/False; its scorer pays any non-empty answer (bool('False'))",
    "color_cube_rotation": "one colour; its scorer compares the oracle, casefolded",
    "family_relationships": "one relation word; its scorer compares the oracle, casefolded",
    "letter_jumble": "the unscrambled words; scorer: oracle match or partial credit",
    "spell_backward": "the reversed word; scorer: oracle match or partial credit",
    "needle_haystack": "one name; its scorer compares the oracle without spaces, casefolded",
    "sentence_reordering": "the sentence; scorer: oracle match or per-word partial credit",
    "dice": "one fraction; its scorer compares the oracle, casefolded",
    "zebra_puzzles": "one name; its scorer compares the oracle, casefolded",
    "tsumego": "one move; scorer: oracle match or partial credit",
    "word_sorting": "the sorted list; scorer: oracle list or positional partial credit",
    "string_insertion": "the string; scorer: oracle match (0.1 for a list of characters)",
}
"""Word-answer tasks whose scorer overrides reasoning-gym's default but whose oracle answer is
still the only right one (read in 0.1.25): graded by exact match. Tasks that keep the default
scorer (it compares with the oracle) are exact-matchable without a listing."""

_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_FLIPS = {"true": "false", "false": "true", "yes": "no", "no": "yes"}
_WEIGHT = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)")


class GymTaskError(UserError, ValueError):
    """A `--task reasoning_gym:...` that cannot be used; one line naming the task and the fix."""


class GymNotInstalledError(UserError, ImportError):
    """reasoning-gym is not installed; the message gives the pip command."""


@dataclass(frozen=True)
class TaskRequest:
    """One task of a spec: a generator name, its options and its weight in a mix."""

    name: str
    options: dict[str, Any]
    weight: float = 1.0
    text: str = ""
    """The part of the spec it came from (for messages)."""


@dataclass(frozen=True)
class _Source:
    """A checked task: its request, its grading method, its held-out rows, a scoring dataset."""

    request: TaskRequest
    method: str  # "math", "exact" or "scorer"
    held_out: list[Row]
    dataset: Any  # the generator instance whose score_answer grades "scorer" rows, else None
    seed_text: str


# --- the spec ------------------------------------------------------------------------------


def parse_spec(spec: str) -> list[TaskRequest]:
    """The tasks of SPEC (module docstring), in order; a malformed spec is a `GymTaskError`.

    Checks only the syntax: names and options are checked against reasoning-gym by
    `task_spec`. The separators ``+ & * ?`` count only outside quotes and brackets, so a
    JSON value may hold them (``operators=["+","-"]``).
    """
    if not spec.strip():
        raise GymTaskError(f"{PREFIX}: no task named; write {PREFIX}NAME, e.g. {PREFIX}chain_sum")
    return [_parse_part(part.strip(), spec) for part in _split_outside(spec, "+")]


def _split_outside(text: str, separator: str) -> list[str]:
    """`text` split at each `separator` that is outside double quotes and brackets."""
    pieces, depth, quoted, start = [], 0, False, 0
    for i, char in enumerate(text):
        if char == '"' and (i == 0 or text[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and char in "[{(":
            depth += 1
        elif not quoted and char in "]})":
            depth -= 1
        elif not quoted and depth == 0 and char == separator:
            pieces.append(text[start:i])
            start = i + 1
    return [*pieces, text[start:]]


def _parse_part(part: str, spec: str) -> TaskRequest:
    """One `NAME?key=value&...*W` part of `spec`."""
    if not part:
        raise GymTaskError(f"{PREFIX}{spec}: an empty task between '+' signs")
    text, weight = part, 1.0
    if len(starred := _split_outside(part, "*")) > 1:
        text, weight_text = "*".join(starred[:-1]), starred[-1].strip()
        if not _WEIGHT.fullmatch(weight_text) or float(weight_text) <= 0:
            raise GymTaskError(
                f"{PREFIX}{part}: the weight after '*' must be a positive number, "
                f"got {weight_text!r}"
            )
        weight = float(weight_text)
    name, _, query = text.partition("?")
    name = name.strip()
    if not name:
        raise GymTaskError(f"{PREFIX}{part}: no task name before '?'")
    options: dict[str, Any] = {}
    for item in _split_outside(query, "&") if query else []:
        key, equals, value = item.partition("=")
        key = key.strip()
        if not equals or not key:
            raise GymTaskError(f"{PREFIX}{part}: option {item!r} is not key=value")
        if key in options:
            raise GymTaskError(f"{PREFIX}{part}: option {key!r} is given twice")
        options[key] = parse_value(value.strip())
    return TaskRequest(name, options, weight, part)


def parse_value(text: str) -> Any:
    """An option value: JSON where it parses (3, 0.5, true, [1, 2], "x"), Python's True /
    False / None, else the text itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return {"True": True, "False": False, "None": None}.get(text, text)


# --- checking a task against reasoning-gym ------------------------------------------------


def _gym() -> Any:
    """The reasoning_gym package (imported here: it is optional)."""
    try:
        import reasoning_gym
    except ImportError:
        raise GymNotInstalledError(
            f"--task {PREFIX}...: reasoning-gym is not installed; pip install 'rlvr[gym]'"
        ) from None
    return reasoning_gym


def _classes(request: TaskRequest) -> tuple[type, type]:
    """(the generator's dataset class, its config dataclass); an unknown name is refused with
    the nearest ones."""
    _gym()
    from reasoning_gym.factory import DATASETS

    if request.name == "composite":
        raise GymTaskError(
            f"{PREFIX}composite: mix tasks with '+' instead, e.g. {PREFIX}chain_sum+gcd"
        )
    if request.name not in DATASETS:
        names = sorted(n for n in DATASETS if n != "composite")
        near = difflib.get_close_matches(request.name, names, n=3, cutoff=0.5)
        hint = f"nearest: {', '.join(near)}" if near else f"{len(names)} tasks, e.g. chain_sum"
        raise GymTaskError(f"{PREFIX}{request.name}: unknown reasoning-gym task; {hint}")
    return DATASETS[request.name]


def _checked_options(request: TaskRequest, config_cls: type) -> dict[str, Any]:
    """`request.options`, each a field of the generator's config with a value of its type."""
    fields = [f.name for f in dataclasses.fields(config_cls) if f.name not in RESERVED_OPTIONS]
    try:
        hints = typing.get_type_hints(config_cls)
    except Exception:  # an annotation that does not resolve: skip the type check
        hints = {}
    checked = {}
    for key, value in request.options.items():
        if key in RESERVED_OPTIONS:
            raise GymTaskError(
                f"{PREFIX}{request.text}: {key!r} is set by rlvr (from --seed), not an option"
            )
        if key not in fields:
            raise GymTaskError(
                f"{PREFIX}{request.text}: {request.name} takes no option {key!r}; "
                f"it takes: {', '.join(fields) or 'none'}"
            )
        fitted = _fit(value, hints.get(key, Any))
        if fitted is _MISFIT:
            kind = _type_name(hints[key])
            raise GymTaskError(
                f"{PREFIX}{request.text}: option {key}={value!r} should be {kind} "
                f"({request.name}'s config field)"
            )
        checked[key] = fitted
    return checked


_MISFIT = object()


def _fit(value: Any, annotation: Any) -> Any:
    """`value` as `annotation` wants it (a list for a tuple field becomes a tuple; an int for a
    float field a float), or `_MISFIT`. Annotations other than plain types, unions, lists and
    tuples are not checked."""
    origin = typing.get_origin(annotation)
    if annotation is Any or annotation is None:
        return value
    if origin in (typing.Union, types.UnionType):
        for arm in typing.get_args(annotation):
            if arm is type(None) and value is None:
                return None
            if arm is not type(None) and (fitted := _fit(value, arm)) is not _MISFIT:
                return fitted
        return _MISFIT
    if annotation is bool:
        return value if isinstance(value, bool) else _MISFIT
    if annotation is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _MISFIT
    if annotation is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return float(value) if ok else _MISFIT
    if annotation is str:
        return value if isinstance(value, str) else str(value)
    if origin in (list, tuple) or annotation in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return _MISFIT
        return tuple(value) if tuple in (origin, annotation) else list(value)
    return value


def _type_name(annotation: Any) -> str:
    """A short name of an annotation for messages (int, float, str, list, ...)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is not None and args and len(args) == 1:
        return _type_name(args[0])
    return getattr(annotation, "__name__", str(annotation))


def _dataset(request: TaskRequest, options: dict[str, Any], seed: int, size: int) -> Any:
    """`reasoning_gym.create_dataset(...)`; its validation errors become one-line refusals."""
    try:
        return _gym().create_dataset(request.name, seed=seed, size=size, **options)
    except UserError:
        raise
    except Exception as exc:
        raise GymTaskError(f"{PREFIX}{request.text}: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line (its type's name if it has none)."""
    message = " ".join(str(exc).split())
    return message or type(exc).__name__


def _items(
    request: TaskRequest, options: dict[str, Any], seed_text: str
) -> Iterator[dict[str, Any]]:
    """An endless stream of generated items: datasets of CHUNK items, each seeded anew from
    `seed_text`. A generator that fails on an item is refused with its message."""
    chunk_seeds = random.Random(seed_text)
    while True:
        dataset = _dataset(request, options, chunk_seeds.getrandbits(31), CHUNK)
        for index in range(CHUNK):
            try:
                item = dataset[index]
            except Exception as exc:
                raise GymTaskError(
                    f"{PREFIX}{request.text}: the generator failed: {_one_line(exc)}"
                ) from None
            yield item


def _row(item: dict[str, Any], name: str, method: str) -> Row:
    """The task row of one generated item (module docstring, "Rows")."""
    answer = item["answer"]
    row: Row = {
        "prompt": f"{INSTRUCTION}{item['question'].strip()}\n",
        "answer": answer if isinstance(answer, str) else json.dumps(answer),
        "task": name,
    }
    if method == "scorer":  # plain JSON data, as the rows may be written to JSONL
        row["metadata"] = json.loads(json.dumps(item.get("metadata", {}), default=str))
    return row


def _source(request: TaskRequest, held_out_count: int, seed: int, position: int) -> _Source:
    """`request` checked against reasoning-gym, with its graded held-out rows."""
    dataset_cls, config_cls = _classes(request)
    options = _checked_options(request, config_cls)
    seed_text = f"{request.text}/{position}"
    items = _items(request, options, f"held_out/{seed}/{seed_text}")
    held: dict[str, dict[str, Any]] = {}
    draws = 0
    limit = MAX_DRAWS_PER_QUESTION * held_out_count
    while len(held) < held_out_count and draws < limit:
        item = next(items)
        draws += 1
        held.setdefault(item["question"], item)
    if len(held) < held_out_count:
        raise GymTaskError(
            f"{PREFIX}{request.text}: only {len(held)} distinct questions in {draws} draws, "
            f"fewer than the {held_out_count} held out; widen the options"
        )
    method = _grading_method(request, list(held.values()), dataset_cls)
    fresh = sum(next(items)["question"] not in held for _ in range(FRESH_PROBE))
    if fresh < MIN_FRESH_SHARE * FRESH_PROBE:
        raise GymTaskError(
            f"{PREFIX}{request.text}: only {fresh} of {FRESH_PROBE} further draws are new "
            f"questions (the {held_out_count} held out are most of what the options allow); "
            "widen the options"
        )
    scorer = _dataset(request, options, 0, CHUNK) if method == "scorer" else None
    rows = [_row(item, request.name, method) for item in held.values()]
    checked = dataclasses.replace(request, options=options)
    return _Source(checked, method, rows, scorer, seed_text)


def _grading_method(request: TaskRequest, items: list[dict[str, Any]], dataset_cls: type) -> str:
    """How `request`'s rows are graded (module docstring), or a refusal."""
    from reasoning_gym.dataset import ProceduralDataset

    if request.name in SCORER_ALLOW_LIST:
        return "scorer"
    answers = [item["answer"] for item in items]
    if not all(isinstance(a, str) and a.strip() for a in answers):
        raise GymTaskError(
            f"{PREFIX}{request.name}: its items carry no reference answer (reasoning-gym "
            "checks them by simulation), and rlvr grades only against a reference; pick another"
        )
    if all(_PLAIN_NUMBER.fullmatch(a.strip()) for a in answers):
        return "math"
    default_scorer = dataset_cls.score_answer is ProceduralDataset.score_answer
    if default_scorer or request.name in EXACT_MATCH:
        return "exact"
    raise GymTaskError(
        f"{PREFIX}{request.name}: its answers are not numbers, may take many valid forms (it "
        "has its own scorer) and it is not on rlvr's scorer allow-list "
        "(rlvr.tasks.reasoning_gym.SCORER_ALLOW_LIST); pick another task"
    )


# --- grading -------------------------------------------------------------------------------


class GymReward:
    """The strict reward of reasoning-gym rows, in TRL's form: columns ``answer``, ``task``
    and (scorer tasks) ``metadata``. Each row is graded by its task's method (module
    docstring); verdicts are counted by reason (`reason_counts`), as ``verifier/<name>/...``
    metrics show them."""

    __name__ = "reasoning_gym_reward"

    def __init__(self, methods: dict[str, str], datasets: dict[str, Any]):
        self.methods = methods
        """task name -> "math", "exact" or "scorer"."""
        self.datasets = datasets
        """task name -> the generator whose `score_answer` grades its "scorer" rows."""
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"methods": self.methods, "datasets": self.datasets}  # a lock does not pickle

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["methods"], state["datasets"])

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        answer: list[Any],
        task: list[Any],
        metadata: list[Any] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        """One reward (1.0 or 0.0) per completion."""
        if not len(completions) == len(answer) == len(task):
            raise ValueError(
                f"{len(completions)} completions, {len(answer)} answers, {len(task)} tasks"
            )
        metadata = metadata or [None] * len(completions)
        rows = zip(completions, answer, task, metadata, strict=True)
        return [self.verify(c, {"answer": a, "task": t, "metadata": m})[0] for c, a, t, m in rows]

    def score(self, completion: Any, row: Row) -> float:
        """The reward of one completion for its row (held-out evaluation)."""
        return self.verify(completion, row)[0]

    def verify(self, completion: Any, row: Row) -> tuple[float, str]:
        """(reward, reason) of one completion for `row`; never raises.

        Reasons: the math and exact verifiers' (correct, wrong, no_answer, hedged, ...);
        for scorer tasks also "partial" (a score strictly between 0 and 1: counted as 0) and
        "scorer_error" (the scorer raised: 0); "error" for a row of an unknown task.
        """
        method = self.methods.get(row.get("task"))
        if method == "math":
            reward, parts = math_verifier.verify(completion, row["answer"])
            reason = parts["reason"]
        elif method == "exact":
            reward, parts = exact_verifier.verify(completion, row["answer"])
            reason = parts["reason"]
        elif method == "scorer":
            reward, reason = self._scorer_verdict(completion, row)
        else:
            reward, reason = 0.0, "error"
        with self._lock:
            self._counts[reason] += 1
        return reward, reason

    def _scorer_verdict(self, completion: Any, row: Row) -> tuple[float, str]:
        """reasoning-gym's scorer on the located final answer: exactly 1.0 or nothing."""
        text = completion_text(completion)
        if text is None:
            return 0.0, "error"
        if answer_text(text) is None:
            return 0.0, "unclosed_think"
        extracted = math_verifier.extract_final_answer(text, ANSWER_MARKER)
        if extracted is None:
            return 0.0, "no_answer"
        entry = {"answer": row["answer"], "metadata": row.get("metadata") or {}}
        try:
            value = self.datasets[row["task"]].score_answer(extracted, entry)
        except Exception:  # a scorer that raises on the model's text must not pay (or crash)
            return 0.0, "scorer_error"
        if value == 1.0:
            return 1.0, "correct"
        partial = isinstance(value, (int, float)) and 0.0 < value < 1.0
        return 0.0, "partial" if partial else "wrong"

    def reason_counts(self, reset: bool = False) -> dict[str, int]:
        """Verdicts by reason since the last reset (this process); optionally reset."""
        with self._lock:
            snapshot = dict(self._counts)
            if reset:
                self._counts.clear()
        return snapshot


# --- the corpus ----------------------------------------------------------------------------


def one_line(answer: str) -> str:
    """The answer as a completion writes it: on one line (`####` reads to the end of a line)."""
    return " ".join(answer.split()) if "\n" in answer else answer.strip()


def near_miss(answer: str, rng: random.Random) -> str:
    """A realistic wrong answer close to `answer`: a number off by one in its last place (up or
    down), True/False or Yes/No flipped (case kept), else two neighbouring characters swapped
    (a transposition; without two different neighbours, one letter or digit changed, or a
    character repeated). Each kind leaves few alternatives, so at the lab's flaw_prob the right
    answer is only just the most frequent completion of its prompt: a base that learns the
    corpus decodes the right answer for some problems and a slip for others."""
    text = one_line(answer)
    if _PLAIN_NUMBER.fullmatch(text):
        try:
            value = Decimal(text)
            step = Decimal(1).scaleb(min(0, value.as_tuple().exponent))
            return str(value + step if rng.random() < 0.5 else value - step)
        except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
            pass
    flipped = _FLIPS.get(text.casefold())
    if flipped is not None:
        return flipped.title() if text[:1].isupper() else flipped
    swaps = [i for i in range(len(text) - 1) if text[i].casefold() != text[i + 1].casefold()]
    if swaps:
        i = rng.choice(swaps)
        return text[:i] + text[i + 1] + text[i] + text[i + 2 :]
    positions = [i for i, c in enumerate(text) if c.isalnum()]
    if not positions:
        i = rng.randrange(len(text))
        return text[: i + 1] + text[i:]
    i = rng.choice(positions)
    pool = "0123456789" if text[i].isdigit() else "abcdefghijklmnopqrstuvwxyz"
    new = rng.choice([c for c in pool if c != text[i].lower()])
    return text[:i] + (new.upper() if text[i].isupper() else new) + text[i + 1 :]


def _flawed_completion(row: Row, reward: GymReward, rng: random.Random) -> str:
    """`#### <a near miss>` that the row's grader scores 0 (tries a few; the right answer
    in the rare case that every near miss it drew is also right)."""
    for _ in range(8):
        completion = f"{ANSWER_MARKER} {near_miss(row['answer'], rng)}"
        if reward.verify(completion, row)[0] == 0.0:
            return completion
    return f"{ANSWER_MARKER} {one_line(row['answer'])}"


# --- the task ------------------------------------------------------------------------------


def _held_out_counts(weights: list[float], total: int) -> list[int]:
    """`total` split by `weights` (largest remainders), at least 1 each."""
    exact = [total * w / sum(weights) for w in weights]
    counts = [max(1, int(e)) for e in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: int(exact[i]) - exact[i])
    for i in by_remainder[: max(0, total - sum(counts))]:
        counts[i] += 1
    return counts


def task_spec(spec: str, seed: int = 0, held_out_size: int = HELD_OUT_SIZE) -> TaskSpec:
    """The reasoning-gym task(s) of `spec` (what follows ``reasoning_gym:``) as a TaskSpec.

    Everything is checked here, before any model loads (a `GymTaskError` otherwise): the
    held-out rows (`held_out_size` in all, split by weight in a mix) are generated from `seed`
    now. Training rows and the corpus are generated lazily from their own seeds.
    """
    requests = parse_spec(spec)
    counts = _held_out_counts([r.weight for r in requests], held_out_size)
    sources = [_source(r, n, seed, i) for i, (r, n) in enumerate(zip(requests, counts))]
    methods: dict[str, str] = {}
    for source in sources:
        known = methods.setdefault(source.request.name, source.method)
        if known != source.method:
            raise GymTaskError(
                f"{PREFIX}{spec}: {source.request.name} is mixed in twice with options that "
                f"grade differently ({known} and {source.method}); give it once"
            )
    datasets = {s.request.name: s.dataset for s in reversed(sources)}  # the first one wins
    reward = GymReward(methods, datasets)
    held_out = [row for s in sources for row in s.held_out]
    excluded = {row["prompt"] for row in held_out}

    def train_rows(train_seed: int) -> Iterator[Row]:
        """An endless seeded stream, each row's task drawn by weight, no held-out question."""
        streams = [
            _rows_excluding(s, f"train/{train_seed}/{s.seed_text}", excluded) for s in sources
        ]
        pick = random.Random(f"mix/{train_seed}")
        weights = [s.request.weight for s in sources]
        while True:
            yield next(pick.choices(streams, weights)[0])

    def corpus(corpus_seed: int, flaw_prob: float) -> Iterator[tuple[str, str]]:
        """(prompt, `#### answer`) pairs of the training stream; a `flaw_prob` share wrong."""
        rng = random.Random(f"corpus/{corpus_seed}")
        for row in train_rows(corpus_seed):
            if rng.random() < flaw_prob:
                yield row["prompt"], _flawed_completion(row, reward, rng)
            else:
                yield row["prompt"], f"{ANSWER_MARKER} {one_line(row['answer'])}"

    longest = max(len(f"{ANSWER_MARKER} {one_line(r['answer'])}") for r in held_out)
    return TaskSpec(
        name="reasoning_gym",
        held_out_rows=lambda: [dict(row) for row in held_out],
        train_rows=train_rows,
        corpus=corpus,
        reward_fn=reward,
        score=reward.score,
        max_new_tokens=longest + 9,  # EOS, and slack for an answer a little longer
        describe="reasoning-gym " + " + ".join(s.request.name for s in sources),  # plot titles
        min_new_tokens=longest + 1,
    )


def _rows_excluding(source: _Source, seed_text: str, excluded: set[str]) -> Iterator[Row]:
    """`source`'s rows from datasets seeded by `seed_text`, skipping prompts in `excluded`."""
    request = source.request
    for item in _items(request, request.options, seed_text):
        row = _row(item, request.name, source.method)
        if row["prompt"] not in excluded:
            yield row
