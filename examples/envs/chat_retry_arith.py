"""`retry_arith` for a chat model: two-digit additions put as questions ("What is 83+48?"),
two worked examples first, and "wrong, try again" after a wrong answer, three tries.

    rlvr train grpo --model "$MODEL" --env examples/envs/chat_retry_arith.py:ENV ...

The environment is `rlvr.tasks.retry_arith`'s (reward 0.5**k for a right answer at try k,
0-based; 0 after three wrong ones; the strict math verifier on `#### N`); what changes is the
opening: the question style of `rlvr.tasks.arithmetic` and two solved problems as earlier
turns (the few-shot examples the one-turn SmolLM2 run uses, `--few-shot 2`). The rows are
arithmetic's: 200 held-out problems and training problems never among them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from rlvr.tasks import arithmetic, retry_arith
from rlvr.tasks.arithmetic import ArithmeticTaskConfig, Problem

CONFIG = ArithmeticTaskConfig(digits=2, style="question")
EXAMPLES = [Problem(a=27, b=58, op="+"), Problem(a=64, b=19, op="+")]


def _solved(problem: Problem) -> list[dict[str, str]]:
    answer = str(problem.a + problem.b)
    return [
        {"role": "user", "content": problem.asked(CONFIG.style)},
        {"role": "assistant", "content": arithmetic.short_solution(problem, answer)},
    ]


class ChatRetryArith(retry_arith.RetryArithEnv):
    """`RetryArithEnv` opened with the two solved examples before the question."""

    max_turns = retry_arith.MAX_TRIES

    def reset(
        self, row: Mapping[str, Any], *, seed: int
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
        messages, tools, info = super().reset(row, seed=seed)
        return [m for p in EXAMPLES for m in _solved(p)] + messages, tools, info


ENV = ChatRetryArith


def held_out_rows() -> list[dict[str, str]]:
    return arithmetic.rows(arithmetic.held_out_problems(CONFIG), CONFIG.style)


def train_rows(seed: int) -> Iterator[dict[str, str]]:
    return arithmetic.iter_rows(arithmetic.train_problems(CONFIG, seed), CONFIG.style)
