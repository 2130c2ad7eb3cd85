"""Two calculator calls in a chain, then the answer: the second call uses the first's result,
which the model sees only in the tool's message (`rlvr.tasks.tool_env`, one episode each).

An episode as the lab's character model sees it (`rlvr.rollout.episodes.PlainTurns`):

    increase 17 by 25, then multiply by 3\\n
    {"arguments":{"a":17,"b":25},"name":"sum"}<EOS>=042\\n
    {"arguments":{"a":42,"b":3},"name":"mul"}<EOS>=126\\n
    #### 126<EOS>

The first step is `increase A by B` (tool `sum`) or `decrease A by B` (tool `sub`) on two-digit
operands whose result is two digits too (10..99), the second `multiply by K` (tool `mul`, K in
2..9); calls are bare JSON in `rlvr.tasks.tool_task`'s form (arguments first: the tiny model
copies by relative position, and every call is one width), checked against the tools' schemas
and run by `tool_env`; each result comes back in three digits, `=042\\n`. A reply without a call
ends the episode: reward 1 when it is `#### N` with N the chain's true result (leading zeros
allowed: the answer copies the tool message's three digits), else 0. A chat model sees
the same texts as a user turn, assistant turns and "tool" turns through its template.

Budgets: a reply is at most one call (42 characters) plus EOS; an episode three replies and two
tool messages (at most 110 tokens after the 38-character opening). Four replies at most (one
spare: a malformed call gets its error back and may be retried).

Flawed corpus: (the conversation so far, exactly as PlainTurns renders it, the next reply),
from episodes of a careless player. Each of its three replies slips with probability
`flaw_prob / SLIP_DIVISOR` (4), one slip an episode at most (so two never cancel), in habits as in
`tool_task`: the first call with an operand off by one or the wrong tool for the verb, the
second call with the first result miscopied (a digit off by one) or the factor off by one, the
answer with a digit off by one. The tools then return what the flawed call computes and the
player carries on consistently from it, as a model would: an early slip makes the final answer
wrong. At the lab's `flaw_prob` 0.65 about 60 % of the corpus's episodes end right; the base,
which also miscopies on its own, solves fewer held-out chains, and not all.

Train and held-out chains never coincide: the held-out set (200) is drawn first from its own
seed; training draws in it are redrawn.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from rlvr.tasks.spec import REPLY_END, Row, TaskSpec, distinct_draws, draws_excluding
from rlvr.tasks.tool_env import ToolEnv, tool_env

NAME = "tool_chain"
HELD_OUT_SIZE = 200
HELD_OUT_SEED = 9173
FACTORS = range(2, 10)
VERBS = {"sum": "increase", "sub": "decrease"}
MAX_NEW_TOKENS = 44  # the widest call (42 characters, a 3-digit operand 43) and EOS
EPISODE_TOKENS = 3 * MAX_NEW_TOKENS + 2 * len("=-999\n") + 8
MAX_TURNS = 4
SLIP_DIVISOR = 4
"""Each reply slips with probability flaw_prob / SLIP_DIVISOR (three replies must all be right:
at 2 the lab's base solved 2 % of held-out chains, too few for a group to hold a success)."""


def _add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first addend
        b: the second addend
    """
    return a + b


def _subtract(a: int, b: int) -> int:
    """Subtract b from a.

    Args:
        a: the number to subtract from
        b: the number to subtract
    """
    return a - b


def _multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


_add.__name__, _subtract.__name__, _multiply.__name__ = "sum", "sub", "mul"
FUNCTIONS = {"sum": _add, "sub": _subtract, "mul": _multiply}


@dataclass(frozen=True)
class Chain:
    """`op(a, b)`, then times `k`."""

    op: str
    a: int
    b: int
    k: int

    @property
    def first(self) -> int:
        return FUNCTIONS[self.op](self.a, self.b)

    @property
    def answer(self) -> int:
        return self.first * self.k

    @property
    def prompt(self) -> str:
        return f"{VERBS[self.op]} {self.a} by {self.b}, then multiply by {self.k}\n"


def call(tool: str, a: Any, b: Any) -> str:
    """A call as the model writes it (compact bare JSON, arguments first)."""
    return json.dumps({"arguments": {"a": a, "b": b}, "name": tool}, separators=(",", ":"))


def answer_text(value: int) -> str:
    """The final reply: the result in three digits, as the tool message shows it."""
    return f"#### {value:03d}"


def tool_message(name: str, text: str) -> str:
    """`=042\n`: an integer result in three digits (a fixed width: the digits to copy sit at
    one offset), anything else (an error) as it is."""
    try:
        return f"={int(text):03d}\n"
    except ValueError:
        return f"={text}\n"


def _draw(rng: random.Random) -> Chain:
    while True:
        op, a, b = rng.choice(tuple(VERBS)), rng.randrange(10, 100), rng.randrange(10, 100)
        chain = Chain(op, a, b, rng.choice(FACTORS))
        if 10 <= chain.first <= 99:
            return chain


def held_out_chains() -> list[Chain]:
    return distinct_draws(_draw, attrgetter("op", "a", "b", "k"), HELD_OUT_SIZE, HELD_OUT_SEED)


def train_chains(seed: int | str) -> Iterator[Chain]:
    excluded = {(c.op, c.a, c.b, c.k) for c in held_out_chains()}
    return draws_excluding(_draw, attrgetter("op", "a", "b", "k"), excluded, seed)


def row(chain: Chain) -> Row:
    return {"prompt": chain.prompt, "answer": str(chain.answer)}


_FINAL = re.compile(r"#### (-?\d+)")


def score(completion: Any, row: Row) -> float:
    """1.0 when the final reply is exactly `#### N` with N the chain's result."""
    match = _FINAL.fullmatch(str(completion).strip())
    return float(match is not None and int(match.group(1)) == int(row["answer"]))


def reward_fn(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any], **kwargs: Any
) -> list[float]:
    """TRL reward function (column `answer`): `score` on each final reply."""
    return [score(c, {"answer": a}) for c, a in zip(completions, answer, strict=True)]


def episode_reward(env: ToolEnv) -> float:
    """`score` on the episode's final reply."""
    return score(env.final_reply, env.row)


ENVIRONMENT = tool_env(
    *FUNCTIONS.values(), reward=episode_reward, max_calls=MAX_TURNS - 1, tool_message=tool_message
)


def _off(value: int, rng: random.Random) -> int:
    """`value` with one digit off by one (a miscopy): never `value`, never a leading 0."""
    digits = str(abs(value))
    i = rng.randrange(len(digits))
    d = int(digits[i])
    leading = i == 0 and len(digits) > 1
    choices = [x for x in (d - 1, d + 1) if 0 <= x <= 9 and not (leading and x == 0)]
    off = int(digits[:i] + str(rng.choice(choices)) + digits[i + 1 :])
    return off if value >= 0 else -off


def episode_replies(
    chain: Chain, rng: random.Random, flaw_prob: float
) -> tuple[list[str], list[str]]:
    """(the careless player's three replies, the two tool messages after the calls)."""
    slip = flaw_prob / SLIP_DIVISOR
    slipped = next((turn for turn in range(3) if rng.random() < slip), None)  # one at most
    op, a, b = chain.op, chain.a, chain.b
    if slipped == 0:
        if rng.random() < 0.6:  # habit: an operand off by one
            a, b = (a + rng.choice((-1, 1)), b) if rng.random() < 0.5 else (a, b + 1)
        else:
            op = "sub" if op == "sum" else "sum"
    first = FUNCTIONS[op](a, b)
    x, k = first, chain.k
    if slipped == 1:
        if rng.random() < 0.6:  # habit: the first result miscopied
            x = _off(first, rng)
        else:
            k = k + 1 if k < 9 else k - 1
    product = x * k
    final = _off(product, rng) if slipped == 2 else product
    replies = [call(op, a, b), call("mul", x, k), answer_text(final)]
    return replies, [tool_message(op, str(first)), tool_message("mul", str(product))]


def corpus(seed: int | str, flaw_prob: float) -> Iterator[tuple[str, str]]:
    """Endless (conversation so far, next reply) pairs of the careless player's episodes."""
    if not 0.0 <= flaw_prob <= 1.0:
        raise ValueError(f"flaw_prob must be in [0, 1], got {flaw_prob}")
    rng = random.Random(f"tool-chain-flaws/{seed}")
    for chain in train_chains(f"tool-chain-corpus/{seed}"):
        replies, messages = episode_replies(chain, rng, flaw_prob)
        seen = chain.prompt
        for i, reply in enumerate(replies):
            yield seen, reply
            if i < len(messages):
                seen += reply + REPLY_END + messages[i]


def task_spec() -> TaskSpec:
    """The tool-chain environment as a `TaskSpec`."""
    held_out = [row(c) for c in held_out_chains()]

    def train_rows(seed: int) -> Iterator[Row]:
        return (row(c) for c in train_chains(f"tool-chain-train/{seed}"))

    def corpus_pairs(seed: int, flaw_prob: float) -> Iterator[tuple[str, str]]:
        return corpus(seed, flaw_prob)

    return TaskSpec(
        name=NAME,
        held_out_rows=lambda: [dict(r) for r in held_out],
        train_rows=train_rows,
        corpus=corpus_pairs,
        reward_fn=reward_fn,
        score=score,
        max_new_tokens=MAX_NEW_TOKENS,
        describe="two chained calculator calls, then the answer",
        min_new_tokens=MAX_NEW_TOKENS,
        environment=ENVIRONMENT,
        max_turns=MAX_TURNS,
        episode_tokens=EPISODE_TOKENS,
    )
