"""The layouts dataset files come in, and how their columns become rlvr's task rows.

The layout is detected from the first row (a table's rows all have its columns):

  ======  ================================================================================
  verl    `data_source`, `prompt` (chat messages), `reward_model` {"style", "ground_truth"},
          `ability`, `extra_info`: each row graded by its data source's verifier
          (`rlvr.tasks.data_sources`), the reference is ``reward_model.ground_truth``
  rlvr    `prompt` and `answer`, optionally `solution` (a worked completion for a base model):
          rlvr's own rows, graded by the strict math verifier
  trl     `prompt` and, without an `answer` column, `solution` or else `ground_truth`:
          graded by the strict math verifier on the column's final answer (the last
          ``\\boxed{}`` or ``####`` of a worked solution, else the whole text)
  ======  ================================================================================

A row with both `answer` and `solution` is rlvr's (answer graded, solution the corpus), whatever
its prompt: TRL's column order (solution first) would grade a worked solution where a short
answer is at hand. `--columns prompt=question,answer=reward_model.ground_truth` maps columns by
hand instead (dotted paths reach into nested dicts/structs; targets `prompt`, `answer`,
`solution`; an unmapped target reads its own name) and turns detection off.

A prompt is text or a list of chat messages (``[{"role": ..., "content": ...}]``). A message
prompt becomes the row's `messages` (role and content only) and its `prompt` is their contents
joined by a blank line: a model without a chat template reads that, one with a template reads
the messages (`rlvr.models.chat.row_formatter`). A source column called `messages` is never
kept (it could hold a whole conversation, answers included).

Every bad row is refused before any model loads, naming the file, the row (the line of a
JSON-lines file) and the field: `DataFileError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.tasks import data_sources
from rlvr.tasks.jsonl import JSONLError
from rlvr.tasks.spec import Row
from rlvr.verifiers.math import extract_final_answer

ANSWER_COLUMNS = ("solution", "answer", "ground_truth")
"""TRL's reference columns, in the order the first present one is taken (`answer`: rlvr's)."""
COLUMN_TARGETS = ("prompt", "answer", "solution")
"""The row fields `--columns` may map."""
VERL_ANSWER = "reward_model.ground_truth"
MESSAGE_SEPARATOR = "\n\n"
_MAP_HINT = "map the columns with --columns prompt=COLUMN,answer=COLUMN"


class DataFileError(JSONLError):
    """A dataset file that cannot be used as rows; the message names file, row and field.

    A `JSONLError` (so a `UserError` and a ValueError). `line` is the 1-based line of a
    JSON-lines file, written ``FILE:LINE:`` as `JSONLError` writes it, or the 1-based row of a
    table or a JSON array (`by_line` False), written ``FILE: row N:``.
    """

    def __init__(
        self,
        path: Path,
        message: str,
        line: int | None = None,
        field: str | None = None,
        *,
        by_line: bool = True,
    ):
        super().__init__(path, message, line, field)
        if line is not None and not by_line:
            self.args = (f"{path}: row {line}: {message}",)


@dataclass(frozen=True)
class Table:
    """A file's records as read, before any layout is applied."""

    path: Path
    records: list[Row]
    numbers: list[int]
    """The 1-based line (JSON lines) or row of each record."""
    by_line: bool
    """Whether `numbers` are lines of a JSON-lines file."""

    def error(self, index: int, message: str, field: str | None = None) -> DataFileError:
        """The refusal of record `index` (0-based), naming its line or row."""
        return DataFileError(self.path, message, self.numbers[index], field, by_line=self.by_line)


def detect(first: Row) -> tuple[str, str] | None:
    """(layout, the column graded against) of a file whose first record is `first`:
    ("verl", "reward_model.ground_truth"), ("rlvr", "answer"), ("trl", "solution" or
    "ground_truth"); None when it is none of them."""
    if "data_source" in first and "reward_model" in first and "prompt" in first:
        return "verl", VERL_ANSWER
    if "prompt" not in first:
        return None
    if "answer" in first:
        return "rlvr", "answer"
    column = next((c for c in ANSWER_COLUMNS if c in first), None)
    return ("trl", column) if column else None


def rows_of(table: Table, columns: str | None = None) -> tuple[list[Row], str]:
    """(rlvr task rows, layout name) of `table`: the detected layout, or "columns" when
    `columns` (a `--columns` spec) maps them; every record checked (`DataFileError`)."""
    if not table.records:
        raise DataFileError(table.path, "the file has no rows")
    if columns is not None:
        mapping = parse_columns(columns, table)
        return [_mapped_row(table, i, mapping) for i in range(len(table.records))], "columns"
    first = table.records[0]
    found = detect(first)
    if found is None:
        raise _no_layout(table, first)
    layout, column = found
    convert = {"verl": _verl_row, "rlvr": _rlvr_row, "trl": _trl_row}[layout]
    return [convert(table, i, column) for i in range(len(table.records))], layout


def parse_columns(spec: str, table: Table) -> dict[str, str]:
    """{target: source path} of a `--columns` spec such as
    "prompt=question,answer=reward_model.ground_truth"; `prompt` and `answer` default to the
    columns of their own name. Refused, naming the flag and the file's columns: an item without
    `=`, a target not in `COLUMN_TARGETS` (or given twice), a path the first row lacks."""
    names = column_names(table.records[0]) if table.records else []
    have = ", ".join(map(repr, names)) or "none"

    def refuse(problem: str) -> DataFileError:
        return DataFileError(
            table.path, f"--columns {spec!r}: {problem} (the file's columns: {have})"
        )

    mapping: dict[str, str] = {}
    for item in (part.strip() for part in spec.split(",")):
        target, eq, source = (s.strip() for s in item.partition("="))
        if not eq or not target or not source:
            raise refuse(f"{item!r} is not TARGET=COLUMN")
        if target not in COLUMN_TARGETS:
            raise refuse(f"unknown target {target!r}; choose {', '.join(COLUMN_TARGETS)}")
        if target in mapping:
            raise refuse(f"{target!r} is mapped twice")
        mapping[target] = source
    for target in ("prompt", "answer"):
        mapping.setdefault(target, target)
    for target, source in mapping.items():
        if table.records and not _get(table.records[0], source)[0]:
            raise refuse(f"no column {source!r} for {target}")
    return mapping


def column_names(record: Row) -> list[str]:
    """The record's column names, and the dotted paths into its nested dicts (structs)."""
    names = []
    for key, value in record.items():
        names.append(str(key))
        if isinstance(value, dict):
            names += [f"{key}.{inner}" for inner in column_names(value)]
    return names


def _get(record: Row, path: str) -> tuple[bool, Any]:
    """(found, value) of a column or a dotted path into nested dicts."""
    if path in record:
        return True, record[path]
    value: Any = record
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _required(table: Table, index: int, path: str) -> Any:
    """The non-null value at `path` of record `index`; refused when missing or null."""
    found, value = _get(table.records[index], path)
    if not found:
        have = ", ".join(map(repr, column_names(table.records[index]))) or "none"
        message = f"missing field {path!r} (fields present: {have}); {_MAP_HINT}"
        raise table.error(index, message, path)
    if value is None:
        raise table.error(index, f"field {path!r} is null", path)
    return value


def _prompt_fields(table: Table, index: int, path: str = "prompt") -> Row:
    """{"prompt": text} or {"prompt": joined contents, "messages": [...]} of record `index`."""
    value = _required(table, index, path)
    if isinstance(value, str):
        text, messages = value, None
    elif isinstance(value, (list, tuple)):
        messages = list(_messages(table, index, path, value))
        text = MESSAGE_SEPARATOR.join(m["content"] for m in messages)
    else:
        kind = type(value).__name__
        message = f"field {path!r} must be text or a list of chat messages, not {kind}"
        raise table.error(index, message, path)
    if not text.strip():
        raise table.error(index, f"field {path!r} is empty or whitespace-only", path)
    return {"prompt": text} if messages is None else {"prompt": text, "messages": messages}


def _messages(table: Table, index: int, path: str, value: Any) -> Iterator[dict[str, str]]:
    """Each item of a message-list prompt as {"role", "content"}; refused if one is not."""
    if not value:
        raise table.error(index, f"field {path!r} is an empty list of messages", path)
    for number, message in enumerate(value, start=1):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if not (isinstance(role, str) and role and isinstance(content, str)):
            shown = repr(message)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            problem = (
                f"field {path!r}: message {number} is not a chat message "
                f'{{"role": text, "content": text}}: {shown}'
            )
            raise table.error(index, problem, path)
        yield {"role": role, "content": content}


def _reference(table: Table, index: int, path: str, value: Any) -> Any:
    """A math reference (text or a number); refused otherwise, naming `path`."""
    try:
        return data_sources.math_fields(value)["answer"]
    except ValueError as exc:
        raise table.error(index, f"field {path!r} {exc}", path) from None


def _kept(record: Row) -> Row:
    """The record's columns that a row carries on (all but a source `messages` column)."""
    return {k: v for k, v in record.items() if k != "messages"}


def _rlvr_row(table: Table, index: int, column: str) -> Row:
    """rlvr's own row: every column kept, `prompt` checked, `answer` a math reference."""
    prompt = _prompt_fields(table, index)
    answer = _reference(table, index, column, _required(table, index, column))
    return {**_kept(table.records[index]), **prompt, "answer": answer}


def _trl_row(table: Table, index: int, column: str) -> Row:
    """A TRL row: every column kept; `answer` is `column`'s final answer (`extract_final_answer`
    of a worked solution, else the whole value)."""
    prompt = _prompt_fields(table, index)
    value = _reference(table, index, column, _required(table, index, column))
    final = extract_final_answer(value) if isinstance(value, str) else None
    return {**_kept(table.records[index]), **prompt, "answer": final or value}


def _verl_row(table: Table, index: int, column: str) -> Row:
    """A verl row: prompt, data_source and the fields its verifier reads from the ground truth
    (`answer` for math, `tests` for code)."""
    prompt = _prompt_fields(table, index)
    name = _required(table, index, "data_source")
    source = data_sources.lookup(name)
    if source is None:
        known = ", ".join(data_sources.known_sources())
        message = (
            f"field 'data_source': unknown data source {name!r} (known: {known}); register one "
            "with rlvr.tasks.data_sources.register_data_source(name, reward_fn, score_fn)"
        )
        raise table.error(index, message, "data_source")
    truth = _required(table, index, column)
    try:
        fields = source.fields(truth)
    except ValueError as exc:
        message = f"field {column!r} {exc} (data_source {name!r})"
        raise table.error(index, message, column) from None
    return {**prompt, "data_source": name, **fields}


def _mapped_row(table: Table, index: int, mapping: dict[str, str]) -> Row:
    """A row of the `--columns` mapping: prompt, answer (a math reference) and, when mapped,
    solution (text)."""
    row = _prompt_fields(table, index, mapping["prompt"])
    row["answer"] = _reference(
        table, index, mapping["answer"], _required(table, index, mapping["answer"])
    )
    if "solution" in mapping:
        solution = _required(table, index, mapping["solution"])
        if not isinstance(solution, str):
            kind = type(solution).__name__
            message = f"field {mapping['solution']!r} (the solution) must be text, not {kind}"
            raise table.error(index, message, mapping["solution"])
        row["solution"] = solution
    return row


def _no_layout(table: Table, first: Row) -> DataFileError:
    """The refusal of a file whose first record is in no known layout."""
    have = ", ".join(map(repr, column_names(first))) or "none"
    if "prompt" not in first:
        message = f"missing field 'prompt' (the file's columns: {have}); {_MAP_HINT}"
        return table.error(0, message, "prompt")
    expected = ", ".join(map(repr, ANSWER_COLUMNS))
    message = (
        f"missing an answer field: one of {expected}, or verl's data_source and "
        f"{VERL_ANSWER} (the file's columns: {have}); {_MAP_HINT}"
    )
    return table.error(0, message, "answer")
