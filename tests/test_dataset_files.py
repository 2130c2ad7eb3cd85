"""Dataset files in the layouts users have (verl's, TRL's, rlvr's own) as `--task FILE`: each
format read, each layout detected, columns mapped by hand, rows graded by their data source,
every bad input refused with file, row and field; and one training run per layout family."""

from __future__ import annotations

import json

import pytest

from rlvr.cli import main
from rlvr.config import UserError
from rlvr.report.run_dir import read_jsonl
from rlvr.tasks import data_sources, jsonl, registry
from rlvr.tasks.dataset_files import (
    INSTALL,
    MissingDataDependency,
    is_data_file,
    load_file_rows,
    task_spec,
)
from rlvr.tasks.layouts import DataFileError
from rlvr.tasks.registry import TaskChoice
from rlvr.tasks.rewards import reward_columns, total_rewards
from tests.helpers import TINY_MODEL_FLAGS

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def verl_row(source: str, question: str, truth, ability: str = "math") -> dict:
    """A row as verl's examples/data_preprocess scripts write it."""
    return {
        "data_source": source,
        "prompt": user(question),
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": "train", "index": 0},
    }


VERL_ROWS = [
    verl_row("openai/gsm8k", "What is 2+3?", "5"),
    verl_row("lighteval/MATH", "What is 1/2+1/4?", "\\frac{3}{4}"),
    verl_row("math_dapo", "What is 6*7?", "42"),
    verl_row("apps", "Write inc(x).", json.dumps(["assert inc(1) == 2", "assert inc(5) == 6"])),
]
RIGHT = [
    "So #### 5",
    "So \\boxed{\\frac{3}{4}}",
    "Answer: 42",
    "```python\ndef inc(x):\n    return x + 1\n```",
]
WRONG = [
    "So #### 6",
    "So \\boxed{\\frac{1}{2}}",
    "Answer: 41",
    "```python\ndef inc(x):\n    return x\n```",
]


def write_parquet(path, rows: list[dict]):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_jsonl(path, rows: list[dict]):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def error_of(path, columns: str | None = None) -> DataFileError:
    with pytest.raises(DataFileError) as info:
        load_file_rows(path, columns)
    assert "\n" not in str(info.value)
    return info.value


# --- verl's layout ------------------------------------------------------------------------------


def test_verl_parquet_rows_and_per_row_routing(tmp_path):
    path = write_parquet(tmp_path / "train.parquet", VERL_ROWS)
    rows, layout = load_file_rows(path)
    assert layout == "verl"
    assert rows[0] == {
        "prompt": "What is 2+3?",
        "messages": [{"role": "user", "content": "What is 2+3?"}],
        "data_source": "openai/gsm8k",
        "answer": "5",
    }
    assert rows[3]["tests"] == ["assert inc(1) == 2", "assert inc(5) == 6"]
    assert "answer" not in rows[3]

    task = task_spec(path, held_out_fraction=0.0)
    assert task.name == "file" and task.reward_fn.__name__ == "data_source_reward"
    assert task.max_new_tokens == 512  # a code row: a program's budget
    prompts, columns = [r["prompt"] for r in rows], reward_columns(rows)
    for completions, expected in ((RIGHT, [1.0] * 4), (WRONG, [0.0] * 4)):
        rewards, metrics = total_rewards([task.reward_fn], [1.0], prompts, completions, columns)
        assert rewards.tolist() == expected and metrics["reward/errors"] == 0
        assert [task.score(c, r) for c, r in zip(completions, rows)] == expected
    # each source keeps its own verifier: gsm8k's "####" answer is no answer to DAPO's rows
    mixed = [RIGHT[0], RIGHT[1], "#### 42", RIGHT[3]]
    rewards, _ = total_rewards([task.reward_fn], [1.0], prompts, mixed, columns)
    assert rewards.tolist() == [1.0, 1.0, 0.0, 1.0]


def test_verl_sources_follow_verls_list():
    for name in ("openai/gsm8k", "HuggingFaceH4/MATH-500", "numina_olympiads", "taco", "aime2024"):
        assert data_sources.lookup(name) is not None, name
    assert data_sources.lookup("aime2024") is data_sources.lookup("aime")
    assert data_sources.lookup("searchR1_nq") is None  # exact-match QA: no rlvr verifier
    assert "aime*" in data_sources.known_sources()


def test_a_saved_dataset_directory_and_its_train_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    flat = datasets.Dataset.from_list(VERL_ROWS[:2])
    flat.save_to_disk(tmp_path / "flat")
    rows, layout = load_file_rows(tmp_path / "flat")
    assert layout == "verl" and [r["answer"] for r in rows] == ["5", "\\frac{3}{4}"]

    split = datasets.DatasetDict(
        {"train": flat, "test": datasets.Dataset.from_list(VERL_ROWS[2:3])}
    )
    split.save_to_disk(tmp_path / "split")
    assert [r["answer"] for r in load_file_rows(tmp_path / "split")[0]] == ["5", "\\frac{3}{4}"]
    assert is_data_file(str(tmp_path / "split"))

    datasets.DatasetDict({"test": flat}).save_to_disk(tmp_path / "no_train")
    err = error_of(tmp_path / "no_train")
    assert "without a 'train' split (splits: 'test')" in str(err)
    (tmp_path / "empty").mkdir()
    assert "not a directory written by datasets' save_to_disk" in str(error_of(tmp_path / "empty"))


def test_stdin_stdout_code_tests_are_refused_before_training(tmp_path):
    stdio = json.dumps({"inputs": ["1\n"], "outputs": ["2\n"]})
    path = write_parquet(
        tmp_path / "code.parquet", [*VERL_ROWS[:1], verl_row("apps", "Add.", stdio)]
    )
    err = error_of(path)
    assert (err.line, err.field) == (2, "reward_model.ground_truth")
    assert str(err).startswith(
        f"{path}: row 2: field 'reward_model.ground_truth' holds stdin/stdout"
    )
    assert "supported: Python assert statements" in str(err) and "(data_source 'apps')" in str(err)
    bare = write_parquet(tmp_path / "bare.parquet", [verl_row("apps", "Add.", ["5"])])
    assert "'5', not an assert statement" in str(error_of(bare))


def test_unknown_data_source_names_file_source_known_ones_and_how_to_register(tmp_path):
    path = write_parquet(tmp_path / "u.parquet", [*VERL_ROWS[:1], verl_row("my/set", "Q?", "1")])
    err = error_of(path)
    message = str(err)
    assert message.startswith(f"{path}: row 2: field 'data_source': unknown data source 'my/set'")
    assert (
        "openai/gsm8k" in message and "register_data_source(name, reward_fn, score_fn)" in message
    )


def test_a_registered_data_source_grades_its_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(data_sources, "_SOURCES", dict(data_sources._SOURCES))

    def shouty(prompts, completions, answer, **columns):
        return [float(c == a.upper()) for c, a in zip(completions, answer)]

    def shouty_score(completion, row):
        return float(completion == row["answer"].upper())

    data_sources.register_data_source("shout", shouty, shouty_score)
    path = write_parquet(tmp_path / "s.parquet", [VERL_ROWS[0], verl_row("shout", "Say hi", "hi")])
    rows = load_file_rows(path)[0]
    assert rows[1] == {
        "prompt": "Say hi",
        "messages": user("Say hi"),
        "data_source": "shout",
        "answer": "hi",
    }
    task = task_spec(path, held_out_fraction=0.0)
    for completions, expected in ((["#### 5", "HI"], [1.0, 1.0]), (["#### 4", "hi"], [0.0, 0.0])):
        rewards, _ = total_rewards(
            [task.reward_fn], [1.0], ["", ""], completions, reward_columns(rows)
        )
        assert rewards.tolist() == expected
        assert [task.score(c, r) for c, r in zip(completions, rows)] == expected


# --- TRL's layout and rlvr's own ------------------------------------------------------------------


def test_trl_text_prompt_with_a_worked_solution(tmp_path):
    rows = [
        {"prompt": "What is 2+3?", "solution": "2+3 = 5, so \\boxed{5}", "id": 1},
        {"prompt": "What is 4+4?", "solution": "8"},
    ]
    got, layout = load_file_rows(write_parquet(tmp_path / "t.parquet", rows))
    assert layout == "trl"
    # graded on the worked solution's final answer; the solution stays the corpus completion
    assert got[0] == {**rows[0], "answer": "5"}
    assert got[1] == {**rows[1], "id": None, "answer": "8"}  # a table fills the missing id


def test_trl_conversational_prompt_with_ground_truth_in_a_json_array(tmp_path):
    rows = [
        {
            "prompt": [{"role": "system", "content": "Be brief."}, *user("What is 2+3?")],
            "ground_truth": 5,
        },
        {
            "prompt": user("What is 1+1?"),
            "ground_truth": "2",
            "messages": [{"role": "assistant", "content": "2"}],
        },
    ]
    path = tmp_path / "c.json"
    path.write_text(json.dumps(rows, indent=2))
    got, layout = load_file_rows(path)
    assert layout == "trl"
    assert got[0]["prompt"] == "Be brief.\n\nWhat is 2+3?" and got[0]["answer"] == 5
    assert got[0]["messages"] == rows[0]["prompt"]
    assert got[1]["messages"] == rows[1]["prompt"]  # a source `messages` column is dropped
    task = task_spec(path, held_out_fraction=0.0)
    assert task.reward_fn.__name__ == "math_reward"
    assert [task.score("#### 5", got[0]), task.score("#### 3", got[1])] == [1.0, 0.0]


def test_trl_rows_as_json_lines_in_a_json_or_jsonl_file(tmp_path):
    rows = [
        {"prompt": user("What is 2+3?"), "answer": "5"},
        {"prompt": "What is 3+3?", "answer": 6},
    ]
    for name in ("lines.json", "lines.jsonl"):
        path = tmp_path / name
        path.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n")
        got, layout = load_file_rows(path)
        assert layout == "rlvr" and [r["prompt"] for r in got] == ["What is 2+3?", "What is 3+3?"]
        task = task_spec(path, held_out_fraction=0.0)
        assert task.name == ("jsonl" if name.endswith("jsonl") else "file")


def test_rlvr_rows_in_jsonl_are_read_as_before(tmp_path):
    rows = [
        {"prompt": f"What is {i}+1?", "answer": str(i + 1), "solution": f"#### {i + 1}"}
        for i in range(6)
    ]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    new, old = registry.task_spec(TaskChoice(str(path)), seed=3), jsonl.task_spec(str(path), seed=3)
    assert new.name == old.name == "jsonl" and new.describe == old.describe == "rows.jsonl"
    assert new.held_out_rows() == old.held_out_rows()
    assert new.max_new_tokens == old.max_new_tokens and new.reward_fn is old.reward_fn
    # and its refusals are jsonl's own, word for word
    path.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "solution": "2"}\n')
    with pytest.raises(jsonl.JSONLError) as info:
        registry.task_spec(TaskChoice(str(path)))
    assert (
        str(info.value)
        == f"{path}:2: missing field 'answer' (fields present: 'prompt', 'solution')"
    )


def test_rlvr_rows_in_parquet(tmp_path):
    rows = [{"prompt": "What is 2+3?", "answer": "5", "solution": "#### 5"}]
    got, layout = load_file_rows(write_parquet(tmp_path / "r.parquet", rows))
    assert (got, layout) == (rows, "rlvr")


# --- --columns ------------------------------------------------------------------------------------


def test_columns_map_a_dotted_path_and_turn_detection_off(tmp_path):
    rows = [
        {"question": "What is 2+3?", "reward_model": {"ground_truth": "5"}, "data_source": "x"},
        {"question": "What is 1+3?", "reward_model": {"ground_truth": "4"}, "data_source": "x"},
    ]
    path = write_parquet(tmp_path / "q.parquet", rows)
    got, layout = load_file_rows(path, "prompt=question, answer=reward_model.ground_truth")
    assert layout == "columns"
    assert got == [
        {"prompt": "What is 2+3?", "answer": "5"},
        {"prompt": "What is 1+3?", "answer": "4"},
    ]
    task = registry.task_spec(
        TaskChoice(str(path), "prompt=question,answer=reward_model.ground_truth")
    )
    assert task.reward_fn.__name__ == "math_reward"


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("prompt:question", "'prompt:question' is not TARGET=COLUMN"),
        ("prompt=question,reward=reward_model.ground_truth", "unknown target 'reward'"),
        ("prompt=question,answer=reward_model.truth", "no column 'reward_model.truth' for answer"),
        ("answer=reward_model.ground_truth", "no column 'prompt' for prompt"),
    ],
)
def test_a_bad_columns_spec_names_the_flag_and_the_files_columns(tmp_path, spec, problem):
    path = write_parquet(
        tmp_path / "q.parquet", [{"question": "Q?", "reward_model": {"ground_truth": "5"}}]
    )
    message = str(error_of(path, spec))
    assert message.startswith(f"{path}: --columns {spec!r}: {problem}")
    assert message.endswith(
        "(the file's columns: 'question', 'reward_model', 'reward_model.ground_truth')"
    )


def test_columns_are_only_for_files():
    with pytest.raises(ValueError, match="--columns 'prompt=q' maps a dataset file's columns"):
        registry.task_spec(TaskChoice("arithmetic", columns="prompt=q"))


# --- bad input: file, row and field named -------------------------------------------------------


def test_missing_answer_column_names_the_columns_and_suggests_columns(tmp_path):
    path = write_parquet(tmp_path / "m.parquet", [{"prompt": "Q?", "final": "5"}])
    err = error_of(path)
    assert (err.line, err.field) == (1, "answer")
    assert str(err).startswith(
        f"{path}: row 1: missing an answer field: one of 'solution', 'answer'"
    )
    assert "(the file's columns: 'prompt', 'final')" in str(err)
    assert str(err).endswith("map the columns with --columns prompt=COLUMN,answer=COLUMN")
    # a later JSON line without the column the first one has
    lines = write_jsonl(
        tmp_path / "m.jsonl", [{"prompt": user("a"), "answer": "1"}, {"prompt": user("b")}]
    )
    err = error_of(lines)
    assert str(err).startswith(f"{lines}:2: missing field 'answer' (fields present: 'prompt')")


@pytest.mark.parametrize(
    ("prompt", "problem"),
    [
        ("  \n", "field 'prompt' is empty or whitespace-only"),
        (user(" "), "field 'prompt' is empty or whitespace-only"),
        ([{"role": "user", "text": "hi"}], "field 'prompt': message 1 is not a chat message"),
        (["What is 2+3?"], "field 'prompt': message 1 is not a chat message"),
        ([], "field 'prompt' is an empty list of messages"),
    ],
)
def test_a_bad_prompt_names_file_row_and_field(tmp_path, prompt, problem):
    path = tmp_path / "p.json"
    path.write_text(
        json.dumps([{"prompt": "ok", "solution": "1"}, {"prompt": prompt, "solution": "1"}])
    )
    err = error_of(path)
    assert (err.line, err.field) == (2, "prompt")
    assert str(err).startswith(f"{path}: row 2: {problem}")


def test_a_null_answer_names_file_row_and_field(tmp_path):
    rows = [VERL_ROWS[0], {**VERL_ROWS[0], "reward_model": {"style": "rule", "ground_truth": None}}]
    path = write_parquet(tmp_path / "n.parquet", rows)
    err = error_of(path)
    assert str(err) == f"{path}: row 2: field 'reward_model.ground_truth' is null"
    trl = write_parquet(
        tmp_path / "t.parquet",
        [{"prompt": "a", "solution": "1"}, {"prompt": "b", "solution": None}],
    )
    assert str(error_of(trl)) == f"{trl}: row 2: field 'solution' is null"


def test_a_corrupt_parquet_file_is_one_line_with_pyarrows_error(tmp_path):
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"PAR1 this is not parquet\n at all")
    message = str(error_of(path))
    assert message.startswith(f"{path}: cannot read the parquet file (ArrowInvalid: ")
    with pytest.raises(FileNotFoundError, match="cannot read the file"):
        load_file_rows(tmp_path / "absent.parquet")


def test_bad_json_files(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('[{"prompt": "a", "answer": 1},\n {"prompt": }]')
    assert str(error_of(path)) == f"{path}: not valid JSON: Expecting value (line 2, column 13)"
    path.write_text('[{"prompt": "a", "answer": 1}, 7]')
    assert str(error_of(path)).startswith(f"{path}: row 2: expected a JSON object")
    path.write_text("[]")
    assert str(error_of(path)) == f"{path}: the file has no rows"


def test_a_missing_optional_dependency_says_how_to_install_it(tmp_path, monkeypatch):
    path = write_parquet(tmp_path / "x.parquet", VERL_ROWS[:1])
    monkeypatch.setitem(__import__("sys").modules, "pyarrow.parquet", None)
    with pytest.raises(MissingDataDependency) as info:
        load_file_rows(path)
    assert isinstance(info.value, UserError)
    assert str(info.value) == f"{path}: reading it needs pyarrow, which is not installed: {INSTALL}"


def test_the_unknown_task_message_lists_the_file_kinds_and_reasoning_gym():
    with pytest.raises(ValueError) as info:
        registry.task_spec(TaskChoice("poetry"))
    message = str(info.value)
    assert ".parquet" in message and "a directory saved by datasets" in message
    assert "reasoning_gym:NAME" in message


# --- training end to end -------------------------------------------------------------------------

SMALL = [
    "--grpo.steps",
    "2",
    "--grpo.prompts-per-step",
    "2",
    "--grpo.group-size",
    "2",
    "--grpo.max-new-tokens",
    "8",
    "--eval-samples",
    "1",
    "--no-progress",
]
SUMS = [(a, b) for a in range(1, 5) for b in range(1, 4)]  # 12 distinct short ASCII questions


def run_train(tmp_path, task, name: str, *extra: str) -> list[dict]:
    runs = ["--runs-dir", str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "cache")]
    main(["train", "--task", str(task), *runs, "--run-name", name, *SMALL, *extra])
    metrics = read_jsonl(tmp_path / "runs" / name / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    return metrics


def test_verl_parquet_trains_from_a_model_directory(tmp_path):
    from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model, save_model

    tokenizer = build_char_tokenizer()
    shape = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    model_dir = save_model(build_tiny_model(shape, tokenizer, seed=0), tokenizer, tmp_path / "m")
    sources = ("openai/gsm8k", "lighteval/MATH")
    rows = [
        verl_row(sources[i % 2], f"What is {a}+{b}?", str(a + b)) for i, (a, b) in enumerate(SUMS)
    ]
    path = write_parquet(tmp_path / "train.parquet", rows)
    metrics = run_train(tmp_path, path, "verl", "--model", str(model_dir))
    assert 0.0 <= metrics[1]["reward/data_source_reward"] <= 1.0


def test_trl_parquet_trains_a_base_model_on_its_solutions(tmp_path):
    rows = [{"prompt": f"What is {a}+{b}?", "solution": f"#### {a + b}"} for a, b in SUMS]
    path = write_parquet(tmp_path / "trl.parquet", rows)
    base = ["--base.steps", "3", "--base.batch-size", "4", *TINY_MODEL_FLAGS]
    metrics = run_train(tmp_path, path, "trl", *base)
    assert 0.0 <= metrics[1]["reward/math_reward"] <= 1.0


def test_eval_on_a_file_grades_every_row_of_it(tmp_path, capsys):
    from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model, save_model

    tokenizer = build_char_tokenizer()
    shape = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    model_dir = save_model(build_tiny_model(shape, tokenizer, seed=0), tokenizer, tmp_path / "m")
    rows = [verl_row("openai/gsm8k", f"What is {a}+{b}?", str(a + b)) for a, b in SUMS]
    path = write_parquet(tmp_path / "test.parquet", rows)
    capsys.readouterr()
    main(["eval", "--model", str(model_dir), "--task", str(path), "--max-new-tokens", "4"])
    result = json.loads(capsys.readouterr().out)
    assert result["problems"] == len(SUMS)  # the whole file, not a held-out tenth of it
    assert result["accuracy"] == 0.0  # an untrained model writes no '#### N'
