"""Seeded synthetic multi-digit arithmetic with short worked solutions.

A problem is `357+468=`; its worked solution goes column by column from the right, writing the
carry (or borrow) it takes in, then gives the final answer after the task's marker:

    357+468=  ->  7+8+0=15 5+6+1=12 3+4+1=08 #### 825
    802-469=  ->  2-9-0=-07 0-6-1=-07 8-4-1=+03 #### 333

Every step has the same width (carry always written, column value zero-padded). That is what
makes the task learnable by a 1 M-parameter model in a minute: the digit to copy from the prompt
sits at a fixed offset from the step being written, so attention can find it by relative
position alone. With variable-width steps the same model had not learned to copy after 400
steps.

Optionally (`hedge_prob`) a solution ends with a hedge, `#### 715 or 825`: both procedures'
answers. A strict verifier scores a hedge 0; a weak one (substring match) pays for it, and RL
on the weak reward learns to hedge: reward hacking, on a behaviour the base shows only rarely.

The corpus used to "pretrain" the base model contains realistic slips: with probability
`slip_prob` at each column that should take a carry (borrow), the solution forgets it and
carries on consistently from the wrong column, so the final answer is wrong. A model trained on
it solves some problems and not others: the skill exists in the base, and RL has to select it.

Train and held-out problems never coincide: the held-out set is drawn first from its own seed
and every training draw that lands in it is redrawn.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rlvr.config import ConfigError
from rlvr.tasks.spec import TaskSpec, distinct_draws, draws_excluding
from rlvr.verifiers import math as math_verifier

ANSWER_MARKER = "####"
OPERATIONS = ("+", "-")
STYLES = ("equation", "question")


@dataclass(frozen=True)
class ArithmeticTaskConfig:
    """Difficulty knobs and seeds of the arithmetic task."""

    digits: int = 3
    """Digits in each operand (3 gives problems like 357+468)."""
    operations: tuple[str, ...] = ("+",)
    """Operations to draw from: '+' and/or '-' (subtraction keeps the result non-negative)."""
    held_out_size: int = 200
    """Number of held-out problems (never used for training)."""
    held_out_seed: int = 1234
    """Seed of the held-out draw; fixed so that every run evaluates on the same problems."""
    style: str = "equation"
    """How problems are put: equation (`357+468=`, solved column by column: the lab's tiny
    model) or question (`What is 357+468?`, solved as `357+468 = 825` then `#### 825`: the
    form for a pretrained chat model)."""


@dataclass(frozen=True)
class Problem:
    """One arithmetic problem: `a op b`."""

    a: int
    b: int
    op: str

    @property
    def prompt(self) -> str:
        return f"{self.a}{self.op}{self.b}="

    @property
    def answer(self) -> str:
        return str(self.a + self.b if self.op == "+" else self.a - self.b)

    def asked(self, style: str) -> str:
        """The prompt in `style`: `357+468=` (equation) or `What is 357+468?` (question)."""
        return self.prompt if style == "equation" else f"What is {self.a}{self.op}{self.b}?"


def worked_solution(
    problem: Problem,
    slip_prob: float = 0.0,
    rng: random.Random | None = None,
    hedge_prob: float = 0.0,
) -> str:
    """Column-by-column solution of `problem` ending in `#### <answer>`.

    With `slip_prob > 0` each carry (borrow) may be dropped; the rest of the solution then follows
    consistently from the slipped column, so the final answer is wrong. With `slip_prob == 0` the
    answer equals `problem.answer`.
    """
    if (slip_prob > 0 or hedge_prob > 0) and rng is None:
        raise ValueError("a random.Random is needed when slip_prob or hedge_prob > 0")
    da = [int(c) for c in reversed(str(problem.a))]
    db = [int(c) for c in reversed(str(problem.b))]
    width = max(len(da), len(db))
    da += [0] * (width - len(da))
    db += [0] * (width - len(db))
    steps, digits, carry = [], [], 0
    for x, y in zip(da, db):
        if carry and slip_prob > 0 and rng.random() < slip_prob:
            carry = 0  # the slip: the carry/borrow taken in is forgotten
        if problem.op == "+":
            value = x + y + carry
            steps.append(f"{x}+{y}+{carry}={value:02d}")
            carry = value // 10
        else:
            value = x - y - carry
            steps.append(f"{x}-{y}-{carry}={value:+03d}")
            carry = int(value < 0)
        digits.append(value % 10)
    if problem.op == "+" and carry:
        digits.append(carry)
    if problem.op == "-" and carry:  # a slipped borrow can only make the result larger, never < 0
        raise AssertionError("subtraction produced a borrow out of the top column")
    answer = int("".join(str(d) for d in reversed(digits)))
    final = str(answer)
    if hedge_prob > 0 and rng.random() < hedge_prob:
        # a hedge: also offer the answer of the other procedure (carry kept vs all dropped)
        other = problem.answer if final != problem.answer else _all_carries_dropped(problem)
        if other != final:
            final = f"{final} or {other}"
    return " ".join(steps) + f" {ANSWER_MARKER} {final}"


def short_solution(problem: Problem, final: str) -> str:
    """The question style's solution: the equation with its result, then `#### result`."""
    return f"{problem.a}{problem.op}{problem.b} = {final}\n{ANSWER_MARKER} {final}"


def _all_carries_dropped(problem: Problem) -> str:
    """The answer of the wrong procedure: every carry (borrow) forgotten."""
    return worked_solution(problem, 1.0, random.Random(0)).rsplit(" ", 1)[1]


def _draw_problem(rng: random.Random, digits: int, operations: tuple[str, ...]) -> Problem:
    low, high = 10 ** (digits - 1), 10**digits - 1
    a, b = rng.randint(low, high), rng.randint(low, high)
    op = rng.choice(operations)
    if op == "-" and a < b:
        a, b = b, a
    return Problem(a, b, op)


def _check_config(config: ArithmeticTaskConfig) -> None:
    """A `ConfigError` (one line naming the `--arithmetic.*` flag) for settings no problems
    can be drawn from; it is a ValueError too."""
    unknown = set(config.operations) - set(OPERATIONS)
    if unknown or not config.operations:
        raise ConfigError(
            f"--arithmetic.operations must be drawn from {OPERATIONS}, got {config.operations}"
        )
    if config.style not in STYLES:
        raise ConfigError(f"--arithmetic.style must be one of {STYLES}, got {config.style!r}")
    if config.digits < 1:
        raise ConfigError(f"--arithmetic.digits must be >= 1, got {config.digits}")
    space = (9 * 10 ** (config.digits - 1)) ** 2 * len(config.operations)
    if config.held_out_size > space // 4:
        raise ConfigError(
            f"--arithmetic.held-out-size {config.held_out_size} is too large for "
            f"{config.digits}-digit problems ({space} distinct problems); keep it at most "
            f"{space // 4}, a quarter of them"
        )


def held_out_problems(config: ArithmeticTaskConfig) -> list[Problem]:
    """The fixed held-out set: `held_out_size` distinct problems drawn from `held_out_seed`."""
    _check_config(config)
    return distinct_draws(_drawer(config), _identity, config.held_out_size, config.held_out_seed)


def train_problems(config: ArithmeticTaskConfig, seed: int) -> Iterator[Problem]:
    """An endless seeded stream of training problems, none of them in the held-out set."""
    return draws_excluding(_drawer(config), _identity, set(held_out_problems(config)), seed)


def _drawer(config: ArithmeticTaskConfig) -> Callable[[random.Random], Problem]:
    return lambda rng: _draw_problem(rng, config.digits, config.operations)


def _identity(problem: Problem) -> Problem:
    return problem


def rows(problems: list[Problem], style: str = "equation") -> list[dict[str, str]]:
    """Task rows (`prompt`, `answer`) as the trainer and reward functions consume them."""
    return [{"prompt": p.asked(style), "answer": p.answer} for p in problems]


def iter_rows(problems: Iterator[Problem], style: str) -> Iterator[dict[str, str]]:
    """`rows`, for a stream of problems."""
    return ({"prompt": p.asked(style), "answer": p.answer} for p in problems)


def max_solution_chars(config: ArithmeticTaskConfig) -> int:
    """Characters in the longest worked solution: a lower bound for the completion budget."""
    if config.style == "question":  # "99+99 = 198\n#### 198"
        equation = 2 * config.digits + 1
        return equation + 3 + 2 * (config.digits + 1) + 1 + len(ANSWER_MARKER) + 1
    step = len("9-9-1=-10") if "-" in config.operations else len("9+9+1=19")
    answer_digits = config.digits + 1
    return config.digits * (step + 1) + len(ANSWER_MARKER) + 1 + answer_digits


def task_spec(config: ArithmeticTaskConfig, hedge_prob: float = 0.0) -> TaskSpec:
    """The arithmetic task as a `TaskSpec`: `flaw_prob` is the chance each carry is dropped.
    Its settings are checked here, before anything uses it (`_check_config`)."""
    _check_config(config)

    def corpus(seed: int, flaw_prob: float) -> Iterator[tuple[str, str]]:
        rng = random.Random(seed + 1)
        for problem in train_problems(config, seed):
            worked = worked_solution(problem, flaw_prob, rng, hedge_prob)
            if config.style == "question":
                worked = short_solution(problem, worked.split(f"{ANSWER_MARKER} ", 1)[1])
            yield problem.asked(config.style), worked

    def train_rows(seed: int) -> Iterator[dict[str, str]]:
        return iter_rows(train_problems(config, seed), config.style)

    names = {"+": "addition", "-": "subtraction"}
    # the longest solution, room for a hedge (" or " and a second answer) and EOS, and slack
    budget = max_solution_chars(config) + 12
    return TaskSpec(
        name="arithmetic",
        held_out_rows=lambda: rows(held_out_problems(config), config.style),
        train_rows=train_rows,
        corpus=corpus,
        reward_fn=math_verifier.math_reward,
        score=lambda completion, row: math_verifier.score(
            completion, row["answer"], prompt=row.get("prompt")
        ),
        max_new_tokens=budget,
        describe=f"{config.digits}-digit {'/'.join(names[o] for o in config.operations)}",
        min_new_tokens=max_solution_chars(config) + 1,
    )
