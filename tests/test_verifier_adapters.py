"""Tests for the format and weak verifiers and for the TRL / verl adapters of every verifier."""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from typing import Any

import numpy as np
import pytest

from rlvr.verifiers import adapters
from rlvr.verifiers.adapters import (
    VERIFIERS,
    TRLReward,
    VerlScore,
    compute_score,
    math_compute_score,
    trl_reward,
)
from rlvr.verifiers.format import format_reward
from rlvr.verifiers.format import verify as verify_format
from rlvr.verifiers.math import math_reward
from rlvr.verifiers.math import score as strict_score
from rlvr.verifiers.tool import Tool, register_tool, tool_reward, unregister_tool
from rlvr.verifiers.weak import score as weak_score
from rlvr.verifiers.weak import weak_math_reward

# --- the format verifier -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "reward", "reason"),
    [
        ("<think>7+8=15</think> #### 15", 1.0, "ok"),
        ("\n <think>\nstep\n</think>\n\\boxed{15}\n", 1.0, "ok"),  # surrounding whitespace
        ("<think>step</think>15", 1.0, "ok"),
        ("#### 15", 0.0, "missing_think"),
        ("<think>step #### 15", 0.0, "unclosed_think"),  # truncated
        ("<think></think> #### 15", 0.0, "empty_reasoning"),
        ("<think>\n\n</think>\n\n#### 15", 0.0, "empty_reasoning"),  # Qwen3 non-thinking mode
        ("<think>step</think>", 0.0, "no_answer"),
        ("<think>step</think>  \n", 0.0, "no_answer"),
        ("Sure! <think>step</think> 15", 0.0, "text_before_think"),
        ("<think>a</think><think>b</think> 15", 0.0, "extra_tags"),  # two blocks
        ("<think>a<think>b</think> 15", 0.0, "extra_tags"),  # nested
        ("<think>a</think> 15 </think>", 0.0, "extra_tags"),  # a stray close
        ("</think> x <think>", 0.0, "extra_tags"),  # closed before opened
        (None, 0.0, "error"),
        ([{"role": "assistant", "content": "<think>a</think> 1"}], 1.0, "ok"),
    ],
)
def test_format(completion: Any, reward: float, reason: str) -> None:
    assert verify_format(completion) == (reward, {"reason": reason})


@pytest.mark.parametrize(
    ("completion", "reward", "reason"),
    [
        ("7+8=15</think> #### 15", 1.0, "ok"),  # the prompt opened the block
        ("7+8=15 #### 15", 0.0, "unclosed_think"),
        ("<think>7+8=15</think> #### 15", 0.0, "extra_tags"),  # a second opening
        ("</think> #### 15", 0.0, "empty_reasoning"),
        ("a</think> b </think> 15", 0.0, "extra_tags"),
    ],
)
def test_format_when_the_prompt_opens_think(completion: str, reward: float, reason: str) -> None:
    assert verify_format(completion, think_in_prompt=True) == (reward, {"reason": reason})


def test_format_reward_reads_the_prompt() -> None:
    prompts = ["Q: 7+8?", "Q: 7+8? <think>\n", "Q: 7+8? <think>\n"]
    completions = ["<think>7+8=15</think> 15", "7+8=15</think> 15", "<think>7+8</think> 15"]
    assert format_reward(prompts, completions) == [1.0, 1.0, 0.0]
    assert format_reward(prompts, completions, think_in_prompt=False) == [1.0, 0.0, 1.0]


# --- the weak verifier: gameable on purpose ------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "answer", "weak", "strict"),
    [
        ("#### 825", "825", 1.0, 1.0),  # an honest answer: both agree
        ("#### 826", "825", 0.0, 0.0),
        # the hacks the weak verifier pays for and the strict one does not
        ("maybe 824, maybe 825, maybe 826", "825", 1.0, 0.0),  # listing candidates
        ("#### 1825", "825", 1.0, 0.0),  # a longer number contains the answer
        ("0123456789", "7", 1.0, 0.0),  # one string of digits covers every digit
        ("<think>it is 825</think> #### 826", "825", 1.0, 0.0),  # the reasoning counts
        ("\\boxed{824} (or 825)", "825", 1.0, 0.0),  # next to a wrong final answer
        ("357+468=825? #### 357+468", "825", 1.0, 0.0),
        # ...and an honest answer it misses
        ("\\boxed{\\frac{1}{2}}", "0.5", 0.0, 1.0),
        (None, "825", 0.0, 0.0),
        ("#### 825", "", 0.0, 0.0),  # an empty reference matches nothing
    ],
)
def test_weak_verifier_is_gameable(
    completion: Any, answer: str, weak: float, strict: float
) -> None:
    assert (weak_score(completion, answer), strict_score(completion, answer)) == (weak, strict)


# --- TRL: called exactly as GRPOTrainer._calculate_rewards calls a reward function ---------


ROUND_SCHEMA = {
    "type": "object",
    "properties": {"number": {"type": "number"}, "ndigits": {"type": "integer"}},
    "required": ["number"],
    "additionalProperties": False,
}
ROUND = Tool("round", ROUND_SCHEMA, round)  # a builtin: pickles by reference into any worker


@pytest.fixture
def registered_round() -> Iterator[None]:
    register_tool("round", ROUND_SCHEMA, round, replace=True)
    yield
    unregister_tool("round")


def round_call(number: float, ndigits: int) -> str:
    body = f'{{"name": "round", "arguments": {{"number": {number}, "ndigits": {ndigits}}}}}'
    return f"<tool_call>{body}</tool_call>"


# One GRPO batch per verifier: completions, the dataset's extra columns, expected rewards.
BATCHES: dict[str, tuple[list[Any], dict[str, list[Any]], list[float | None]]] = {
    "math": (
        ["<think>7+8=15</think> #### 15", "#### 16", "\\boxed{\\frac{30}{2}}", "#### 15"],
        {"answer": ["15", "15", "15", None]},  # None: a row this verifier does not apply to
        [1.0, 0.0, 1.0, None],
    ),
    "tool": (
        [round_call(2.567, 1), round_call(2.567, 2), "2.6", round_call(2.5, 0)],
        {"answer": [2.6, 2.6, 2.6, "2"]},  # round(2.5) == 2: banker's rounding, still a match
        [1.0, 0.0, 0.0, 1.0],
    ),
    "format": (
        ["<think>a</think> 15", "15", "<think></think> 15", "<think>a</think> 15"],
        {"answer": ["15"] * 4},  # the column is there; the format verifier ignores it
        [1.0, 0.0, 0.0, 1.0],
    ),
    "weak_math": (
        ["#### 15", "#### 16", "1515", "#### 14 or 15"],
        {"answer": ["15"] * 4},
        [1.0, 0.0, 1.0, 1.0],
    ),
}


def call_like_trl(fn: Any, completions: list[Any], columns: dict[str, list[Any]]) -> list:
    """What GRPOTrainer does (trl/trainer/grpo_trainer.py, _calculate_rewards)."""
    prompts = ["Q: 7+8? <think>\n" if i == 3 else "Q: 7+8?" for i in range(len(completions))]
    reward_kwargs = {**columns, "trainer_state": object()}  # dataset columns + trainer state
    completion_ids = [[1, 2, 3]] * len(completions)
    assert not asyncio.iscoroutinefunction(fn)  # TRL's synchronous path
    assert isinstance(fn.__name__, str)  # TRL names each reward function by __name__
    return list(
        fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **reward_kwargs)
    )


@pytest.mark.parametrize("verifier", sorted(VERIFIERS))
def test_trl_adapter_called_like_grpo_trainer(verifier: str, registered_round: None) -> None:
    completions, columns, expected = BATCHES[verifier]
    fn = trl_reward(verifier)
    assert fn.__name__ == f"{verifier}_reward"
    if verifier == "format":  # the 4th prompt opens <think>: that completion has a second one
        expected = [1.0, 0.0, 0.0, 0.0]
    assert call_like_trl(fn, completions, columns) == expected


@pytest.mark.parametrize("verifier", sorted(VERIFIERS))
def test_trl_adapter_with_conversational_completions(verifier: str, registered_round: None) -> None:
    completions, columns, expected = BATCHES[verifier]
    messages = [[{"role": "assistant", "content": c}] for c in completions]
    fn = TRLReward(verifier, think_in_prompt=False) if verifier == "format" else TRLReward(verifier)
    assert call_like_trl(fn, messages, columns) == expected


def test_module_level_trl_functions_called_like_grpo_trainer(registered_round: None) -> None:
    functions = {
        "math": math_reward,
        "tool": tool_reward,
        "weak_math": weak_math_reward,
    }
    for verifier, fn in functions.items():
        completions, columns, expected = BATCHES[verifier]
        columns = {"answer": [a if a is not None else "15" for a in columns["answer"]]}
        expected = [e if e is not None else 1.0 for e in expected]
        assert call_like_trl(fn, completions, columns) == expected, verifier
    completions, columns, _ = BATCHES["format"]
    assert call_like_trl(format_reward, completions, columns) == [1.0, 0.0, 0.0, 0.0]


def test_trl_adapter_options_and_errors() -> None:
    custom = TRLReward("math", column="solution", name="accuracy", marker="Answer:")
    assert custom.__name__ == "accuracy"
    assert custom(prompts=["q"], completions=["Answer: 15"], solution=["15"]) == [1.0]
    with pytest.raises(KeyError):
        custom(prompts=["q"], completions=["Answer: 15"], answer=["15"])  # no "solution"
    with pytest.raises(ValueError):
        custom(prompts=["q"], completions=["a", "b"], solution=["15"])
    with pytest.raises(ValueError):
        TRLReward("no_such_verifier")
    explicit_tools = TRLReward("tool", tools=[ROUND])  # no registry needed
    assert explicit_tools(prompts=["q"], completions=[round_call(1.25, 1)], answer=[1.2]) == [1.0]
    several_answers = TRLReward("math")
    assert several_answers(prompts=["q"], completions=["#### 0.5"], answer=[["1/2", "0.5"]]) == [
        1.0
    ]


# --- verl: called exactly as its reward managers call compute_score ------------------------


def naive_reward_manager(fn: Any, rows: list[dict[str, Any]]) -> tuple[list[float], dict]:
    """verl's NaiveRewardManager loop (verl/workers/reward_manager/naive.py)."""
    rewards, reward_extra_info = [], defaultdict(list)
    for row in rows:
        extra_info = row.get("extra_info", {})
        extra_info["num_turns"] = None  # the manager adds this before the call
        result = fn(
            data_source=row["data_source"],
            solution_str=row["response"],
            ground_truth=row["reward_model"]["ground_truth"],
            extra_info=extra_info,
        )
        assert isinstance(result, dict)
        rewards.append(result["score"])
        for key, value in result.items():
            reward_extra_info[key].append(value)
    return rewards, reward_extra_info


VERL_ROWS = [
    {"data_source": "openai/gsm8k", "response": "#### 72", "reward_model": {"ground_truth": "72"}},
    {"data_source": "openai/gsm8k", "response": "#### 71", "reward_model": {"ground_truth": "72"}},
    {
        "data_source": "math",
        "response": "\\boxed{\\frac12}",
        "reward_model": {"ground_truth": "0.5"},
    },
    {"data_source": "gsm8k", "response": "#### 72", "reward_model": {"ground_truth": np.int64(72)}},
    {
        "data_source": "mixed",
        "response": "<think>a</think> 1",
        "reward_model": {"ground_truth": ""},
        "extra_info": {"verifier": "format"},
    },
    {
        "data_source": "tool",
        "response": round_call(3.14159, 2),
        "reward_model": {"ground_truth": "3.14"},
    },
    {"data_source": "weak_math", "response": "1 2 3", "reward_model": {"ground_truth": "2"}},
]


def test_verl_compute_score_called_like_the_naive_reward_manager(registered_round: None) -> None:
    rewards, info = naive_reward_manager(compute_score, VERL_ROWS)
    assert rewards == [1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert set(info) == {"score", "reason", "pred"}  # the same keys for every row
    assert info["reason"] == ["correct", "wrong", "correct", "correct", "ok", "correct", "found"]
    assert info["pred"] == ["72", "71", "\\frac12", "72", "", "round", ""]
    for values in info.values():  # what verl's validation metrics then do with each key
        assert len(values) == len(VERL_ROWS) and None not in values
        if not isinstance(values[0], str):
            assert np.isfinite(np.mean(values))


@pytest.mark.parametrize("fn", [adapters.math_compute_score, VerlScore("math", timeout_s=1.0)])
def test_verl_fixed_verifier(fn: Any) -> None:
    rewards, info = naive_reward_manager(fn, VERL_ROWS[:4])
    assert rewards == [1.0, 0.0, 1.0, 1.0]
    assert fn("x", "#### 5", "5") == {"score": 1.0, "reason": "correct", "pred": "5"}  # positional


def test_verl_bad_rows_score_zero_with_the_same_keys() -> None:
    for row in [(None, None, None), ("math", "#### 5", None), ("math", 5, "5")]:
        assert compute_score(*row) == {"score": 0.0, "reason": "error", "pred": ""}


# --- pickling and worker processes ---------------------------------------------------------


ADAPTERS = [
    trl_reward("math"),
    trl_reward("tool", tools=[ROUND]),
    trl_reward("format"),
    trl_reward("weak_math"),
    math_reward,
    format_reward,
    weak_math_reward,
    compute_score,
    math_compute_score,
    VerlScore("tool", tools=[ROUND]),
]


@pytest.mark.parametrize("fn", ADAPTERS, ids=lambda fn: getattr(fn, "__name__", repr(fn)))
def test_pickle_round_trip(fn: Any) -> None:
    copy = pickle.loads(pickle.dumps(fn))
    if isinstance(fn, TRLReward):  # by value: a new object that grades the same
        assert copy is not fn and copy.__name__ == fn.__name__
        completions, columns, _ = BATCHES[fn.verifier]
        assert call_like_trl(copy, completions, columns) == call_like_trl(fn, completions, columns)
    elif isinstance(fn, VerlScore):
        assert copy is not fn
        row = (
            ("tool", round_call(1.5, 0), "2") if fn.verifier == "tool" else ("math", "#### 5", "5")
        )
        assert copy(*row) == fn(*row)
        assert copy(*row)["score"] == 1.0
    else:  # module-level functions pickle by reference
        assert copy is fn


def test_adapters_inside_a_process_pool() -> None:
    # TRL may pickle reward functions to worker processes; verl's prime manager runs
    # compute_score positionally in a ProcessPoolExecutor. Fresh (spawned) interpreters.
    context = multiprocessing.get_context("spawn")
    trl_fn = trl_reward("tool", tools=[ROUND])
    verl_fn = VerlScore("tool", tools=[ROUND])
    completions, columns, expected = BATCHES["tool"]
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        trl_future = pool.submit(
            trl_fn,
            prompts=["q"] * 4,
            completions=completions,
            completion_ids=[[1]] * 4,
            trainer_state=None,
            **columns,
        )
        math_future = pool.submit(
            trl_reward("math"),
            prompts=["q", "q"],
            completions=["\\boxed{\\frac{6}{8}}", "#### 1"],
            answer=["0.75", "2"],
        )
        prime = [  # prime's call: partial(evaluation_func, task, completion, reference, extra)
            pool.submit(partial(compute_score, "math", "\\boxed{\\frac{2}{4}}", "0.5", None)),
            pool.submit(partial(verl_fn, "tool", round_call(9.99, 0), "10", {"index": 0})),
            pool.submit(partial(compute_score, "format", "<think>a</think> b", "", None)),
        ]
        assert trl_future.result(timeout=60) == expected
        assert math_future.result(timeout=60) == [1.0, 0.0]
        assert [f.result(timeout=60)["score"] for f in prime] == [1.0, 1.0, 1.0]
