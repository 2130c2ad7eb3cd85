"""User JSONL rows: each kind of bad input refused with file, line and field; a split by prompt."""

from __future__ import annotations

import json

import pytest

from rlvr.tasks.jsonl import JSONLError, load_rows, split_rows


def _write(tmp_path, text: str | bytes, name: str = "rows.jsonl"):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _error(path, **kwargs) -> JSONLError:
    with pytest.raises(JSONLError) as info:
        load_rows(path, **kwargs)
    return info.value


def test_good_file_loads_and_skips_blank_lines(tmp_path):
    path = _write(
        tmp_path,
        '\ufeff{"prompt": "2+3?", "answer": "5", "id": 1}\n\n   \n'
        '{"prompt": "1+1?", "answer": 2}\r\n',
    )
    rows = load_rows(path)
    assert rows == [
        {"prompt": "2+3?", "answer": "5", "id": 1},
        {"prompt": "1+1?", "answer": 2},
    ]
    assert load_rows(_write(tmp_path, '{"prompt": "p"}', "p.jsonl"), required=("prompt",))


def test_malformed_line_names_file_line_and_json_error(tmp_path):
    path = _write(tmp_path, '{"prompt": "a", "answer": "1"}\n\n{"prompt": "b", "answer": }\n')
    err = _error(path)
    assert err.line == 3
    assert str(err).startswith(f"{path}:3: not valid JSON: Expecting value (column 27)")


def test_missing_field_names_file_line_and_field(tmp_path):
    path = _write(tmp_path, '{"prompt": "a", "answer": "1"}\n{"prompt": "b", "solution": "2"}\n')
    err = _error(path)
    assert (err.line, err.field) == (2, "answer")
    assert str(err) == f"{path}:2: missing field 'answer' (fields present: 'prompt', 'solution')"
    null = _error(_write(tmp_path, '{"prompt": "a", "answer": null}\n', "null.jsonl"))
    assert (null.line, null.field) == (1, "answer") and "is null" in str(null)


@pytest.mark.parametrize("prompt", ["", "   ", "\n\t"])
def test_empty_prompt_names_file_line_and_field(tmp_path, prompt):
    path = _write(
        tmp_path, '{"prompt": "ok", "answer": 1}\n' + json.dumps({"prompt": prompt, "answer": 1})
    )
    err = _error(path)
    assert (err.line, err.field) == (2, "prompt")
    assert str(err) == f"{path}:2: field 'prompt' is empty or whitespace-only"


def test_non_string_prompt(tmp_path):
    err = _error(_write(tmp_path, '{"prompt": ["a"], "answer": 1}\n'))
    assert (err.line, err.field) == (1, "prompt") and "must be a string, got a JSON array" in str(
        err
    )


@pytest.mark.parametrize(
    ("line", "kind"),
    [('["a", "b"]', "array"), ('"text"', "string"), ("42", "number"), ("null", "null")],
)
def test_non_object_line_says_so(tmp_path, line, kind):
    path = _write(tmp_path, '{"prompt": "a", "answer": "1"}\n' + line + "\n")
    err = _error(path)
    assert err.line == 2
    assert str(err).startswith(f"{path}:2: expected a JSON object")
    assert str(err).endswith(f"got a JSON {kind}")


@pytest.mark.parametrize("text", ["", "\n\n", "  \n \t\n"])
def test_empty_file_says_so(tmp_path, text):
    path = _write(tmp_path, text)
    err = _error(path)
    assert err.line is None
    assert str(err) == f"{path}: the file is empty: no rows (expected one JSON object per line)"


def test_non_utf8_line_named(tmp_path):
    path = _write(tmp_path, b'{"prompt": "a", "answer": "1"}\n{"prompt": "\xff", "answer": 1}\n')
    err = _error(path)
    assert err.line == 2 and "not UTF-8" in str(err)


def test_missing_file_is_an_ordinary_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_rows(tmp_path / "nope.jsonl")


def _rows(n: int, copies: int = 1) -> list[dict]:
    return [{"prompt": f"q{i}", "answer": i, "copy": c} for i in range(n) for c in range(copies)]


def test_split_has_no_shared_prompts_and_is_seeded():
    rows = _rows(50, copies=3)
    rows.append({"prompt": "  q7 ", "answer": 7, "copy": 9})  # same prompt up to whitespace
    train, held = split_rows(rows, 0.2, seed=0)
    assert len(train) + len(held) == len(rows)

    def key(r):
        return r["prompt"].strip()

    assert not {key(r) for r in train} & {key(r) for r in held}
    assert len({key(r) for r in held}) == 10  # 20% of 50 distinct prompts
    assert split_rows(rows, 0.2, seed=0) == (train, held)
    assert split_rows(rows, 0.2, seed=1)[1] != held
    # the split depends on the prompts and the seed, not on the rows' order
    assert {key(r) for r in split_rows(rows[::-1], 0.2, seed=0)[1]} == {key(r) for r in held}
    # each side keeps the original order
    assert train == [r for r in rows if r in train]


def test_split_edges():
    rows = _rows(3)
    train, held = split_rows(rows, 0.0, seed=0)
    assert (train, held) == (rows, [])
    train, held = split_rows(rows, 0.01, seed=0)
    assert len(held) == 1 and len(train) == 2  # a positive fraction holds out at least one
    train, held = split_rows(rows, 0.99, seed=0)
    assert len(train) == 1  # and leaves at least one to train on
    with pytest.raises(ValueError, match="held_out_fraction"):
        split_rows(rows, 1.0, seed=0)
    with pytest.raises(ValueError, match="only 1 distinct prompt"):
        split_rows(_rows(1, copies=4), 0.5, seed=0)
