"""A task from a dataset file as users have them: `--task FILE` (and `--columns`).

Files read:

  ``.jsonl``     one JSON object a line (`rlvr.tasks.jsonl`'s reader: blank lines skipped,
                 errors name the line)
  ``.json``      a JSON array of objects, or JSON lines
  ``.parquet``   read with pyarrow (verl's and TRL's usual format)
  a directory    written by `datasets.Dataset.save_to_disk` (`datasets.load_from_disk`); of a
                 `DatasetDict`, its "train" split

pyarrow and datasets are imported only for the files that need them (`pip install
'rlvr[data]'`). Nothing is fetched from a hub: a name that is not a local file or directory is
not read here.

The rows' layout (verl's, TRL's or rlvr's own) is detected, or mapped with `--columns`:
`rlvr.tasks.layouts`. A `.jsonl` file of rlvr's own rows (text `prompt` and `answer` on its
first line) and no `--columns` is `rlvr.tasks.jsonl.task_spec`'s, exactly as before.

Rows are read whole into memory (one list of dicts), which suits files up to a few hundred
thousand rows.
"""

from __future__ import annotations

import importlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from rlvr.config import ConfigError, UserError
from rlvr.tasks import data_sources, jsonl
from rlvr.tasks.jsonl import JSONLFileNotFoundError, Pair, split_rows
from rlvr.tasks.layouts import DataFileError, Table, rows_of
from rlvr.tasks.spec import Row, TaskSpec, endless_shuffles
from rlvr.verifiers import math as math_verifier

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
INSTALL = "pip install 'rlvr[data]'"
CODE_MAX_NEW_TOKENS = 512
"""The completion budget of a file with code rows: a program, not a number."""


class MissingDataDependency(UserError, ImportError):
    """pyarrow or datasets is needed for a file and is not installed; the message says how."""


def is_data_file(name: str) -> bool:
    """Whether `--task name` names a dataset file: a `FILE_SUFFIXES` name (present or not: a
    missing one is refused when read) or an existing directory."""
    return name.endswith(FILE_SUFFIXES) or Path(name).is_dir()


def read_table(path: str | Path) -> Table:
    """The records of the dataset file or saved-dataset directory at `path`, unchecked.

    Refused (`DataFileError`, naming the file): JSON that does not parse (with the line), an
    array item that is not an object, a parquet file pyarrow cannot read (its error in one
    line), a directory that is not a saved dataset, a `DatasetDict` without a "train" split. A
    missing file is a `JSONLFileNotFoundError`.
    """
    path = Path(path)
    if path.is_dir():
        return _saved_dataset(path)
    if path.suffix == ".parquet":
        return _parquet(path)
    if path.suffix == ".json":
        return _json(path)
    return _json_lines(path)


def load_file_rows(path: str | Path, columns: str | None = None) -> tuple[list[Row], str]:
    """(task rows, layout: "verl", "trl", "rlvr" or "columns") of a dataset file, every row
    checked before it is used (`rlvr.tasks.layouts.rows_of`)."""
    return rows_of(read_table(path), columns)


def all_rows(path: str | Path, columns: str | None = None) -> list[Row]:
    """Every row of a dataset file as its task's rows (training and held-out together): what
    `rlvr eval --task FILE` evaluates, since a file given to an evaluation is a test set."""
    if columns is None and str(path).endswith(".jsonl") and is_rlvr_jsonl(Path(path)):
        return jsonl.load_rows(path)
    return load_file_rows(path, columns)[0]


def task_spec(
    path: str | Path, held_out_fraction: float = 0.1, seed: int = 0, columns: str | None = None
) -> TaskSpec:
    """The task of a dataset file: its rows split by prompt (`jsonl.split_rows`, seeded) into
    training and held-out rows, graded as their layout says.

    verl's rows: `data_sources.data_source_reward` (each row by its `data_source`); the others:
    the strict math verifier (`math_reward`). Name "jsonl" for a `.jsonl` file, "file"
    otherwise. A base model trains on (prompt, solution) when every training row has a text
    `solution`; without one, start from a checkpoint (`--model DIR`). The completion budget is
    the longest solution or answer plus 16 characters (at least 16), `CODE_MAX_NEW_TOKENS` with
    code rows.
    """
    if columns is None and str(path).endswith(".jsonl") and is_rlvr_jsonl(Path(path)):
        return jsonl.task_spec(path, held_out_fraction, seed)
    rows, layout = load_file_rows(path, columns)
    train, held_out = split_rows(rows, held_out_fraction, seed)
    name = Path(path).name

    def corpus(seed: int, flaw_prob: float) -> Iterator[Pair]:
        """The training rows' (prompt, solution) pairs, repeated without end (no flaws)."""
        if not all(isinstance(r.get("solution"), str) for r in train):
            raise ConfigError(
                f"{path}: rows have no 'solution' column to train a base model on; "
                "pass --model DIR to start from a checkpoint"
            )
        endless = itertools.chain.from_iterable(itertools.repeat(train))
        return ((r["prompt"], r["solution"]) for r in endless)

    longest = max(len(str(r.get("solution", r.get("answer", "")))) for r in rows)
    budget = max(16, longest + 16)
    verl = layout == "verl"
    if verl and any("tests" in r for r in rows):
        budget = max(budget, CODE_MAX_NEW_TOKENS)
    return TaskSpec(
        name="jsonl" if str(path).endswith(".jsonl") else "file",
        held_out_rows=lambda: held_out,
        train_rows=lambda seed: endless_shuffles(train, seed),
        corpus=corpus,
        reward_fn=data_sources.data_source_reward if verl else math_verifier.math_reward,
        score=data_sources.data_source_score if verl else _math_score,
        max_new_tokens=budget,
        describe=f"{name} ({layout} layout)",
    )


def _math_score(completion: Any, row: Row) -> float:
    """The strict math verifier on one completion of `row` (its `answer`)."""
    return math_verifier.score(completion, row["answer"], prompt=row.get("prompt"))


def is_rlvr_jsonl(path: Path) -> bool:
    """Whether a .jsonl file is read by `jsonl.task_spec` as before: its first non-blank line
    is rlvr's own row (a `prompt` that is not a message list, an `answer`), or is in no other
    layout, or is not a readable object (so its errors are the ones rlvr has always given)."""
    try:
        with path.open("rb") as lines:
            first = next((line for line in lines if line.strip()), b"")
        row = json.loads(first.decode("utf-8-sig"))
    except (OSError, ValueError):
        return True  # unreadable, not UTF-8, not JSON, empty: jsonl's own message
    if not isinstance(row, dict) or "prompt" not in row:
        return True
    if "data_source" in row and "reward_model" in row:
        return False  # verl's
    if "answer" in row:
        return not isinstance(row["prompt"], list)  # a message list is TRL's conversational
    return not any(c in row for c in ("solution", "ground_truth"))  # TRL's, else jsonl's refusal


def _optional(module: str, path: Path) -> ModuleType:
    """The optional module `module`, imported now; missing: `MissingDataDependency`."""
    try:
        return importlib.import_module(module)
    except ImportError:
        package = module.split(".")[0]
        raise MissingDataDependency(
            f"{path}: reading it needs {package}, which is not installed: {INSTALL}"
        ) from None


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _json(path: Path) -> Table:
    """A .json file: a JSON array of objects (rows numbered 1..), else JSON lines."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        message = f"{path}: cannot read the file ({exc.strerror or exc})"
        raise JSONLFileNotFoundError(message) from None
    if not data.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):
        return _json_lines(path)
    try:
        value = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as err:
        raise DataFileError(path, f"not UTF-8 text ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        where = f"line {err.lineno}, column {err.colno}"
        raise DataFileError(path, f"not valid JSON: {err.msg} ({where})") from None
    for number, item in enumerate(value, start=1):
        if not isinstance(item, dict):
            message = f'expected a JSON object like {{"prompt": ..., ...}}, got {item!r:.40}'
            raise DataFileError(path, message, number, by_line=False)
    return Table(path, value, list(range(1, len(value) + 1)), by_line=False)


def _json_lines(path: Path) -> Table:
    """A JSON-lines file's objects, numbered by line (jsonl's reader and messages; no field is
    required here: the layout checks them)."""
    numbered = jsonl._numbered_rows(path, ())
    return Table(path, [row for _, row in numbered], [n for n, _ in numbered], by_line=True)


def _parquet(path: Path) -> Table:
    """A parquet file's rows (structs as dicts, lists as lists), read with pyarrow."""
    parquet = _optional("pyarrow.parquet", path)
    if not path.is_file():
        raise JSONLFileNotFoundError(f"{path}: cannot read the file (no such file)")
    try:
        records = parquet.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow's errors (ArrowInvalid, OSError, ...) have no common base
        message = f"cannot read the parquet file ({type(exc).__name__}: {_one_line(exc)})"
        raise DataFileError(path, message) from None
    return Table(path, records, list(range(1, len(records) + 1)), by_line=False)


def _saved_dataset(path: Path) -> Table:
    """The rows of a `save_to_disk` directory: a Dataset, or a DatasetDict's "train" split."""
    datasets = _optional("datasets", path)
    try:
        loaded = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as exc:
        message = (
            "not a directory written by datasets' save_to_disk "
            f"({type(exc).__name__}: {_one_line(exc)})"
        )
        raise DataFileError(path, message) from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            splits = ", ".join(map(repr, loaded)) or "none"
            message = (
                f"a DatasetDict without a 'train' split (splits: {splits}); pass one split's "
                f"directory instead, e.g. --task {path / next(iter(loaded), 'SPLIT')}"
            )
            raise DataFileError(path, message)
        loaded = loaded["train"]
    records = loaded.to_list()
    return Table(path, records, list(range(1, len(records) + 1)), by_line=False)
