"""A user's own rows from a JSONL file: one JSON object per line, e.g.

    {"prompt": "What is 2+3?", "answer": "5"}

Bad input is refused before any training starts, with the file, the line number and the
field, because a bad row found at step 800 costs a run. Blank lines are skipped (a trailing
newline is not an error); everything else that is not a usable row is an error.

The same checks read SFT data (`load_pairs`: `{"prompt", "completion"}` per line, e.g. the
output of `rlvr sample`).
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rlvr.config import ConfigError, UserError
from rlvr.tasks.spec import TaskSpec, endless_shuffles
from rlvr.verifiers import math as math_verifier

Row = dict[str, Any]
Pair = tuple[str, str]  # (prompt, completion), a line of SFT data


class JSONLError(UserError, ValueError):
    """A JSONL file that cannot be used as rows; the message names file, line and field.

    A `UserError` (the CLI prints it on one line and exits 2) and a ValueError.
    """

    def __init__(self, path: Path, message: str, line: int | None = None, field: str | None = None):
        self.path = path
        self.line = line
        self.field = field
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")


class JSONLFileNotFoundError(UserError, FileNotFoundError):
    """A JSONL file that does not exist or cannot be read; the message names it."""


def load_rows(path: str | Path, required: Sequence[str] = ("prompt", "answer")) -> list[Row]:
    """Every row of the JSONL file at `path`, each a dict holding at least the `required` fields.

    Refused, naming the file and line: a line that is not valid JSON (with the JSON error and
    column), a line that is not a JSON object, a missing or null required field, a prompt that
    is not a string or is empty or whitespace-only, a line that is not UTF-8. A file with no
    rows is refused too. Blank lines are skipped; line numbers count them.
    """
    return [row for _, row in _numbered_rows(Path(path), required)]


def load_pairs(path: str | Path) -> list[Pair]:
    """(prompt, completion) pairs of a JSONL file, one `{"prompt", "completion"}` object a line.

    Malformed lines are refused with file, line and field (as `load_rows` refuses them); a
    completion must also be a non-empty string. Other fields (e.g. `reward`) are ignored.
    """
    path = Path(path)
    pairs = []
    for number, row in _numbered_rows(path, ("prompt", "completion")):
        completion = row["completion"]
        if not isinstance(completion, str):
            kind = type(completion).__name__
            message = f"field 'completion' must be a string, not {kind}"
            raise JSONLError(path, message, number, "completion")
        if not completion.strip():
            raise JSONLError(path, "field 'completion' is empty", number, "completion")
        pairs.append((row["prompt"], completion))
    return pairs


def _numbered_rows(path: Path, required: Sequence[str]) -> list[tuple[int, Row]]:
    """(line number, row) of every non-blank line, checked as `load_rows` says."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise JSONLFileNotFoundError(
            f"{path}: cannot read the file ({exc.strerror or exc})"
        ) from None
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark, as some editors write
        data = data[3:]
    rows: list[tuple[int, Row]] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        line = _decode_line(raw, path, number)
        if not line.strip():
            continue
        row = _parse_object(line, path, number)
        _check_fields(row, required, path, number)
        rows.append((number, row))
    if not rows:
        raise JSONLError(path, "the file is empty: no rows (expected one JSON object per line)")
    return rows


def _decode_line(raw: bytes, path: Path, number: int) -> str:
    """Line `number` as text; refused if it is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        message = f"not UTF-8 text ({err.reason} at byte {err.start} of the line)"
        raise JSONLError(path, message, number) from None


def _parse_object(line: str, path: Path, number: int) -> Row:
    """The JSON object on line `number`; refused if it is not valid JSON or not an object."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise JSONLError(path, f"not valid JSON: {err.msg} (column {err.colno})", number) from None
    if not isinstance(row, dict):
        raise JSONLError(
            path,
            f'expected a JSON object like {{"prompt": ..., ...}}, got a JSON {_json_type(row)}',
            number,
        )
    return row


def _check_fields(row: Row, required: Sequence[str], path: Path, number: int) -> None:
    """Refuse a missing or null required field, and a prompt that is not a non-blank string."""
    for field in required:
        if field not in row:
            have = ", ".join(repr(k) for k in row) or "none"
            raise JSONLError(
                path, f"missing field {field!r} (fields present: {have})", number, field
            )
        if row[field] is None:
            raise JSONLError(path, f"field {field!r} is null", number, field)
    if "prompt" not in required:
        return
    prompt = row["prompt"]
    if not isinstance(prompt, str):
        message = f"field 'prompt' must be a string, got a JSON {_json_type(prompt)}"
        raise JSONLError(path, message, number, "prompt")
    if not prompt.strip():
        raise JSONLError(path, "field 'prompt' is empty or whitespace-only", number, "prompt")


def _json_type(value: Any) -> str:
    """The JSON name of a parsed value's type (for error messages)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {list: "array", str: "string", type(None): "null", dict: "object"}.get(
        type(value), type(value).__name__
    )


def _prompt_key(row: Row) -> str:
    """Prompts that differ only in whitespace count as the same prompt."""
    return " ".join(str(row["prompt"]).split())


def split_rows(
    rows: Sequence[Row], held_out_fraction: float, seed: int
) -> tuple[list[Row], list[Row]]:
    """(train, held_out): a seeded split by prompt, so no prompt is on both sides.

    The fraction is of distinct prompts (whitespace-normalised), not of rows: every row of a
    prompt goes to the same side, so a duplicated prompt cannot leak the held-out set into
    training. The split depends only on the set of prompts and `seed`, not on row order; each
    side keeps the rows' original order. With a fraction above 0 both sides get at least one
    prompt.
    """
    if not 0.0 <= held_out_fraction < 1.0:
        raise ValueError(f"held_out_fraction must be in [0, 1), got {held_out_fraction!r}")
    prompts = sorted({_prompt_key(row) for row in rows})
    if held_out_fraction == 0.0:
        return list(rows), []
    if len(prompts) < 2:
        raise ValueError(
            f"cannot hold out prompts: only {len(prompts)} distinct prompt(s) among "
            f"{len(rows)} rows"
        )
    count = min(len(prompts) - 1, max(1, round(held_out_fraction * len(prompts))))
    random.Random(seed).shuffle(prompts)
    held = set(prompts[:count])
    train = [row for row in rows if _prompt_key(row) not in held]
    held_out = [row for row in rows if _prompt_key(row) in held]
    return train, held_out


def task_spec(path: str | Path, held_out_fraction: float = 0.1, seed: int = 0) -> TaskSpec:
    """A math task from a user's JSONL rows (`prompt`, `answer`, optionally `solution`).

    Rows are loaded (and refused, with file/line/field, if malformed) when the spec is built,
    before any model loads. A `solution` column, when every row has one, is the corpus for a
    base model; without it, train from a checkpoint with `--model DIR`.
    """
    rows = load_rows(path)
    train, held_out = split_rows(rows, held_out_fraction, seed)

    def corpus(seed: int, flaw_prob: float) -> Iterator[Pair]:
        """The training rows' (prompt, solution) pairs, repeated without end (no flaws)."""
        if not all("solution" in r for r in train):
            raise ConfigError(
                f"{path}: rows have no 'solution' column to train a base model on; "
                "pass --model DIR to start from a checkpoint"
            )
        endless = itertools.chain.from_iterable(itertools.repeat(train))
        return ((r["prompt"], r["solution"]) for r in endless)

    longest = max(len(str(r.get("solution", r["answer"]))) for r in rows)
    return TaskSpec(
        name="jsonl",
        held_out_rows=lambda: held_out,
        train_rows=lambda seed: endless_shuffles(train, seed),
        corpus=corpus,
        reward_fn=math_verifier.math_reward,
        score=lambda completion, row: math_verifier.score(
            completion, row["answer"], prompt=row.get("prompt")
        ),
        max_new_tokens=max(16, longest + 16),
        describe=Path(path).name,
    )
