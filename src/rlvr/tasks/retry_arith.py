"""The lab's arithmetic as episodes: a wrong answer is told so and may try again, 3 tries.

The problems, the worked-solution format, the flawed corpus's slips and the strict verifier
are `rlvr.tasks.arithmetic`'s (imported; the default `ArithmeticTaskConfig`: 3-digit
addition, its held-out set). An episode as the lab's character model sees it
(`rlvr.rollout.episodes.PlainTurns`):

    357+468=7+8+0=15 5+6+0=11 3+4+1=08 #### 815<EOS>wrong, try again\\n7+8+0=15 5+6+1=12 ...

The opening is the problem; each reply is a worked solution, graded by the arithmetic
verifier (`rlvr.verifiers.math.score`). A correct one ends the episode with reward
`GAMMA ** k` at try k (0-based: 1, 0.5, 0.25); a wrong one gets `RETRY_MESSAGE` (fixed text)
and another try, up to `MAX_TRIES`; three wrong ones end it with reward 0. `GAMMA` is a
module constant (0.5): a first-try answer is worth more than a corrected one, so RL has a
reason to get it right at once, not just eventually. The environment's reward already carries
the discount; `--env.turn-discount` below 1 would discount a second time.

Budgets: a reply is the arithmetic task's budget (its longest solution plus slack, 48
tokens); an episode after the opening is at most three replies and two retry messages (178
tokens), which with the 8-character problem fits the tiny model's 256 positions
(`rlvr.models.tiny.TinyModelConfig.max_positions`; the lab's shape check counts the longest
held-out prompt, the episode budget and 2).

Flawed corpus: (the conversation so far, exactly as PlainTurns renders it, the next attempt)
pairs. A first attempt is the arithmetic corpus's: each carry dropped with probability
`flaw_prob`. When it is wrong, the conversation continues with `RETRY_MESSAGE` and a second
attempt, which slips less (each carry dropped with `flaw_prob * RETRY_SLIP_SCALE`: told it was
wrong, the solver is more careful, and sometimes fixes the slip, sometimes repeats it), and so
on up to the third. The base model learns that a retry is more often right, so it solves some
episodes at the first try, more by the third, and not all.

Train and held-out problems never coincide: arithmetic's held-out set (drawn first from its
own seed); training draws in it are redrawn.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rlvr.tasks import arithmetic
from rlvr.tasks.arithmetic import ArithmeticTaskConfig, Problem
from rlvr.tasks.spec import REPLY_END, Row, TaskSpec
from rlvr.verifiers import math as math_verifier

NAME = "retry_arith"
MAX_TRIES = 3
GAMMA = 0.5
"""The reward of a correct answer at try k (0-based) is GAMMA ** k."""
RETRY_MESSAGE = "wrong, try again\n"
RETRY_SLIP_SCALE = 0.5
"""A retry drops each carry with probability flaw_prob times this."""
CONFIG = ArithmeticTaskConfig()
MAX_NEW_TOKENS = arithmetic.max_solution_chars(CONFIG) + 12  # arithmetic's own budget
EPISODE_TOKENS = MAX_TRIES * MAX_NEW_TOKENS + (MAX_TRIES - 1) * len(RETRY_MESSAGE)


def is_correct(reply: str, row: Mapping[str, Any]) -> bool:
    """The arithmetic verifier's verdict on one reply."""
    return math_verifier.score(reply, str(row["answer"]), prompt=row.get("prompt")) == 1.0


class RetryArithEnv:
    """One problem, up to `MAX_TRIES` answers (`rlvr.rollout.episodes.Environment`)."""

    def __init__(self) -> None:
        self.row: Mapping[str, Any] | None = None
        self.tries = 0

    def reset(
        self, row: Mapping[str, Any], *, seed: int
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
        self.row, self.tries = row, 0
        return [{"role": "user", "content": str(row["prompt"])}], [], {}

    def step(self, reply: str) -> tuple[list[dict[str, Any]], float, bool, dict[str, Any]]:
        if self.row is None:
            raise RuntimeError("step before reset")
        try_index, self.tries = self.tries, self.tries + 1
        if is_correct(reply, self.row):
            return [], GAMMA**try_index, True, {"tries": self.tries}
        done = self.tries >= MAX_TRIES
        messages = [] if done else [{"role": "user", "content": RETRY_MESSAGE}]
        return messages, 0.0, done, {"tries": self.tries}

    def close(self) -> None:
        pass


def attempts(problem: Problem, flaw_prob: float, rng: random.Random) -> list[str]:
    """The flawed solver's attempts at one problem: until one is right, at most MAX_TRIES."""
    out = []
    for k in range(MAX_TRIES):
        slip = flaw_prob if k == 0 else flaw_prob * RETRY_SLIP_SCALE
        out.append(arithmetic.worked_solution(problem, slip, rng))
        if out[-1].rsplit(" ", 1)[1] == problem.answer:
            break
    return out


def conversation(prompt: str, replies: Sequence[str]) -> list[tuple[str, str]]:
    """(the conversation before each reply as PlainTurns renders it, the reply) per try."""
    pairs, text = [], prompt
    for reply in replies:
        pairs.append((text, reply))
        text += reply + REPLY_END + RETRY_MESSAGE
    return pairs


def corpus(seed: int, flaw_prob: float) -> Iterator[tuple[str, str]]:
    """Endless (conversation so far, next attempt) pairs over training problems."""
    if not 0.0 <= flaw_prob <= 1.0:
        raise ValueError(f"flaw_prob must be in [0, 1], got {flaw_prob}")
    rng = random.Random(f"retry-arith-flaws/{seed}")
    for problem in arithmetic.train_problems(CONFIG, seed):
        yield from conversation(problem.prompt, attempts(problem, flaw_prob, rng))


def score(completion: Any, row: Mapping[str, Any]) -> float:
    """The arithmetic verifier on an episode's final reply."""
    return float(is_correct(str(completion), row))


def task_spec() -> TaskSpec:
    """The retry-arithmetic environment as a `TaskSpec`."""
    held_out = arithmetic.rows(arithmetic.held_out_problems(CONFIG))

    def train_rows(seed: int) -> Iterator[Row]:
        return arithmetic.iter_rows(arithmetic.train_problems(CONFIG, seed), CONFIG.style)

    return TaskSpec(
        name=NAME,
        held_out_rows=lambda: [dict(r) for r in held_out],
        train_rows=train_rows,
        corpus=corpus,
        reward_fn=math_verifier.math_reward,
        score=score,
        max_new_tokens=MAX_NEW_TOKENS,
        describe=f"3-digit addition, {MAX_TRIES} tries (reward {GAMMA}**try)",
        min_new_tokens=arithmetic.max_solution_chars(CONFIG) + 1,
        environment=RetryArithEnv,
        max_turns=MAX_TRIES,
        episode_tokens=EPISODE_TOKENS,
    )
