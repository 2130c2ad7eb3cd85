"""`tool_env`: typed functions as tools; calls parsed and checked as the tool verifier checks
them, run under a timeout, their results or errors the next message."""

from __future__ import annotations

import time

import pytest
import torch

from rlvr.models.tiny import build_char_tokenizer
from rlvr.rollout.episodes import EpisodeLimits, PlainTurns, run_episodes
from rlvr.tasks.tool_env import ToolSchemaError, tool_env
from tests.helpers import ScriptedEngine

TOKENIZER = build_char_tokenizer()


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def divide(a: int, b: int) -> float:
    """Divide a by b.

    Args:
        a: the dividend
        b: the divisor
    """
    return a / b


def stall(seconds: int) -> int:
    """Sleep.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return 0


def call(name: str, **arguments) -> str:
    import json

    return json.dumps({"name": name, "arguments": arguments})


def answered(env) -> float:
    return float(env.final_reply.strip() == str(env.row["answer"]))


def opened(factory, row=None):
    env = factory()
    messages, tools, info = env.reset(row or {"prompt": "6*7?", "answer": 42}, seed=0)
    return env, messages, tools


def test_schemas_come_from_signatures_and_docstrings():
    factory = tool_env(multiply, divide)
    _, messages, tools = opened(factory)
    assert messages == [{"role": "user", "content": "6*7?"}]
    assert [t["function"]["name"] for t in tools] == ["multiply", "divide"]
    parameters = tools[0]["function"]["parameters"]
    assert parameters["properties"]["a"] == {"type": "integer", "description": "the first factor"}
    assert parameters["required"] == ["a", "b"]


def test_a_call_runs_and_its_result_is_the_next_message():
    env, _, _ = opened(tool_env(multiply, reward=answered))
    messages, reward, done, info = env.step(f"<tool_call>{call('multiply', a=6, b=7)}</tool_call>")
    assert messages == [{"role": "tool", "name": "multiply", "content": "42"}]
    assert (reward, done, info["tool_calls"], info["tool_errors"]) == (None, False, 1, 0)
    assert env.calls == [{"name": "multiply", "arguments": {"a": 6, "b": 7}, "result": "42"}]
    messages, reward, done, _ = env.step("42")  # no call: the answer
    assert (messages, reward, done) == ([], 1.0, True)


@pytest.mark.parametrize(
    "reply, error",
    [
        (call("divide", a=1, b=0), "error: ZeroDivisionError: division by zero"),
        (call("divide", a="1", b=2), "error: arguments of divide: a: '1' is not of type 'integer'"),
        (call("power", a=1, b=2), "error: unknown tool 'power'; tools: multiply, divide"),
        ("<tool_call>{not json</tool_call>", "error: a malformed tool call"),
    ],
)
def test_a_failing_call_tells_the_model_why_and_is_counted(reply, error):
    env, _, _ = opened(tool_env(multiply, divide))
    messages, reward, done, info = env.step(reply)
    assert messages[0]["content"].startswith(error) and messages[0]["role"] == "tool"
    assert (reward, done, info["tool_errors"]) == (None, False, 1)


def test_a_hanging_tool_ends_the_episode_at_its_timeout():
    env, _, _ = opened(tool_env(stall, tool_timeout_s=0.2))
    start = time.monotonic()
    messages, reward, done, info = env.step(call("stall", seconds=60))
    assert time.monotonic() - start < 2
    assert (messages, reward, done) == ([], 0.0, True)
    assert info["status"] == "timeout" and info["tool_timeouts"] == 1


def test_max_calls_end_the_episode_scored():
    env, _, _ = opened(tool_env(multiply, reward=lambda env: 0.5, max_calls=2))
    assert env.step(call("multiply", a=1, b=2))[2] is False
    assert env.step(call("multiply", a=1, b=2))[1:3] == (0.5, True)


def test_a_function_that_cannot_be_a_tool_is_refused_in_one_line():
    def untyped(a, b):
        return a

    with pytest.raises(ToolSchemaError, match="tool untyped: .*type hints on every argument"):
        tool_env(untyped)
    with pytest.raises(ToolSchemaError, match="two tools are named multiply"):
        tool_env(multiply, multiply)


def test_whole_episodes_through_the_loop():
    factory = tool_env(multiply, reward=answered, tool_message=lambda name, text: f"={text}\n")
    replies = [call("multiply", a=6, b=7), "42"]
    episodes = run_episodes(
        ScriptedEngine(TOKENIZER, replies),
        PlainTurns(TOKENIZER),
        factory,
        [{"prompt": "6*7?", "answer": 42}],
        [0],
        2,
        EpisodeLimits(max_turns=3, max_tokens=200, max_reply_tokens=80),
        1.0,
        torch.Generator().manual_seed(0),
        TOKENIZER.decode,
        TOKENIZER.eos_token_id,
    )
    for e in episodes:
        assert e.status == "done" and e.episode_return(1.0) == 1.0
        assert e.counts["tool_calls"] == 1 and e.counts["tool_errors"] == 0
        text = TOKENIZER.decode(e.ids)
        assert text == replies[0] + "<|endoftext|>=42\n42<|endoftext|>"
        env_ids = TOKENIZER("=42\n", add_special_tokens=False)["input_ids"]
        start = len(TOKENIZER(replies[0], add_special_tokens=False)["input_ids"]) + 1
        assert e.ids[start : start + len(env_ids)] == env_ids
        assert e.action[start : start + len(env_ids)] == [0] * len(env_ids)
