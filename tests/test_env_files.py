"""`--env FILE.py:NAME`: an rlvr environment (class or factory), a `tool_env`, and a TRL-style
environment class used unchanged, each loaded and run through the episode loop; every bad spec
refused in one line before training; a TRL class trains end to end through `rlvr train`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlvr.cli import main
from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model, save_model
from rlvr.rollout.episodes import EpisodeLimits, PlainTurns, run_episodes
from rlvr.tasks.env_files import EnvFileError, load_environment, user_env_task
from tests.helpers import SMALL_TRAIN_FLAGS, ScriptedEngine

ENVS = Path(__file__).parent / "data" / "envs"
TOKENIZER = build_char_tokenizer()


def episodes(factory, replies, row):
    return run_episodes(
        ScriptedEngine(TOKENIZER, replies),
        PlainTurns(TOKENIZER),
        factory,
        [row],
        [0],
        1,
        EpisodeLimits(max_turns=4, max_tokens=300, max_reply_tokens=80),
        1.0,
        torch.Generator().manual_seed(0),
        TOKENIZER.decode,
        TOKENIZER.eos_token_id,
    )


def spec(file: str, name: str) -> str:
    return f"{ENVS / file}:{name}"


@pytest.mark.parametrize("name", ["Countdown", "make_countdown"])
def test_an_rlvr_class_or_factory(name):
    factory = load_environment(spec("rlvr_countdown.py", name))
    (e,) = episodes(factory, ["3", "7"], {"prompt": "reach 7\n", "answer": 7})
    assert e.status == "done" and e.replies == ["3", "7"] and e.episode_return(1.0) == 1.0
    assert TOKENIZER.decode(e.ids) == "3<|endoftext|>no\n7<|endoftext|>"


def test_a_tool_env():
    factory = load_environment(spec("tool_calc.py", "calculator"))
    call = '{"name": "mul", "arguments": {"a": 6, "b": 7}}'
    (e,) = episodes(factory, [call, "42"], {"prompt": "6*7\n"})
    assert e.status == "done" and e.episode_return(1.0) == 1.0 and e.counts["tool_calls"] == 1


def test_a_trl_environment_class_unchanged():
    factory = load_environment(spec("trl_calculator.py", "Calculator"))
    env = factory()
    messages, tools, _ = env.reset({"prompt": "2+3?", "answer": 5}, seed=0)
    assert messages == [{"role": "user", "content": "2+3?\nUse the tool, then answer."}]
    assert [t["function"]["name"] for t in tools] == ["add"]
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    (e,) = episodes(factory, [call, "5"], {"prompt": "2+3?", "answer": 5})
    assert e.status == "done" and e.episode_return(1.0) == 1.0  # get_reward: the tool was used
    (e,) = episodes(factory, ["5"], {"prompt": "2+3?", "answer": 5})
    assert e.episode_return(1.0) == 0.0


def test_rows_from_the_module_or_a_task():
    task = user_env_task(spec("rlvr_countdown.py", "Countdown"), None)
    assert len(task.held_out_rows()) == 4 and task.max_turns == 3
    train = task.train_rows(0)
    assert {next(train)["answer"] for _ in range(16)} <= set(range(4, 20))
    with pytest.raises(EnvFileError, match="no rows: pass --task FILE"):
        user_env_task(spec("trl_calculator.py", "Calculator"), None)


@pytest.mark.parametrize(
    "where, message",
    [
        (spec("missing.py", "X"), "no file"),
        (spec("broken.py", "X"), "importing .*broken.py failed: ModuleNotFoundError"),
        (spec("rlvr_countdown.py", "Nope"), "has no Nope; environments there: Countdown"),
        (spec("rlvr_countdown.py", "NOT_AN_ENV"), "NOT_AN_ENV is a int, not an environment"),
        (spec("rlvr_countdown.py", "needs_arguments"), "a function with required arguments"),
        (spec("trl_calculator.py", "NoTools"), "no public methods to offer as tools"),
        ("no_colon", "expected FILE.py:NAME"),
        ("not.a.module:X", "importing not.a.module failed"),
    ],
)
def test_a_bad_spec_is_one_line(where, message):
    with pytest.raises(EnvFileError, match=message) as info:
        load_environment(where)
    assert "\n" not in str(info.value)


def test_a_trl_class_trains_through_rlvr_train(tmp_path, capsys):
    model_dir = tmp_path / "model"
    tokenizer = build_char_tokenizer()
    size = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    save_model(build_tiny_model(size, tokenizer, seed=0), tokenizer, model_dir)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(json.dumps({"prompt": f"{n}+1=", "answer": str(n + 1)}) + "\n" for n in range(40))
    )
    runs = tmp_path / "runs"
    main(
        [
            "train",
            "--env",
            spec("trl_calculator.py", "Calculator"),
            "--task",
            str(rows),
            "--model",
            str(model_dir),
            *SMALL_TRAIN_FLAGS,
            "--grpo.max-new-tokens",
            "8",
            "--runs-dir",
            str(runs),
        ]
    )
    records = [json.loads(x) for x in (runs / "lab" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "env/turns_mean" in r]
    assert len(steps) == 2 and all(r["env/error_frac"] == 0.0 for r in steps)
    assert "eval/greedy_acc" in records[-1]


def test_a_user_env_without_a_model_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(
            ["train", "--env", spec("rlvr_countdown.py", "Countdown"), "--runs-dir", str(tmp_path)]
        )
    err = capsys.readouterr().err
    assert "has no corpus to pretrain the lab's tiny base on; pass --model DIR" in err
