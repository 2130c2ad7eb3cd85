"""Seeded synthetic tool-call problems, graded by running the call (`rlvr.verifiers.tool`).

A problem asks for one calculator operation in words; the completion is one bare JSON tool call
(the form `rlvr.verifiers.tool` accepts without tags; the Hermes `<tool_call>` tags would add 23
characters to every completion), and the row's `answer` is the call's expected RESULT:

    "increase 17 by 25\n"   {"arguments": {"a": 17, "b": 25}, "name": "sum"}   answer 42
    "decrease 17 by 25\n"   {"arguments": {"a": 17, "b": 25}, "name": "sub"}   answer -8
    "multiply 17 by 25\n"   {"arguments": {"a": 17, "b": 25}, "name": "mul"}   answer 425

Operands are two-digit (10..99), the three verbs have eight letters and the completion is
`json.dumps` of the call, so every prompt is 18 characters and every correct completion 48,
and each digit of the call sits at one fixed distance from the digit of the prompt it copies
(the fixed-width trick of `rlvr.tasks.arithmetic`). The model has to map the verb to the tool's
name (increase -> sum, decrease -> sub, multiply -> mul) and copy the operands in order.

The arguments come before the name. A JSON object's keys are unordered and the verifier reads
either order, but the distance matters to a 1 M-parameter model: with the name first the
operands are written 44 characters after the prompt's, and the tiny model pretrained on the
flawed corpus (the lab's 800 steps of 16, flaw rate 0.65) never learned to copy them (0.5 %
greedy held-out accuracy; 100 % on a flawless corpus); with the arguments first (distance 29)
it reached 25 % greedy and 21 % sampled. A first version with prompts of three widths ("add A
and B", "subtract B from A", "multiply A by B") was worse still (73 % even without flaws).

The reward is the tool verifier's: the call is parsed, checked against the tool's JSON schema
(`a`, `b` integers, nothing else), run, and its result compared with `answer` (1 or 0).

Tools: `sum`, `sub` and `mul` (`TOOLS`), registered in this process's tool registry when the
module is imported, so a worker process that unpickles `tool_task_reward` (a module-level
function, pickled by reference) imports this module and has them too. Registration is
idempotent; a different tool already registered under one of these names is left alone (with a
warning), and this task's own reward and score pass `tools=TOOLS` explicitly, so they grade
with these tools whatever the registry holds. (Short names, and not "add": the tool verifier's
tests register their own "add".)

Flawed corpus: a completion may carry one realistic mistake, always one that scores 0:
  * "argument": one operand off by one (`"a": 18` for 17);
  * "swap": the operands swapped (`sub` only, the one tool where order matters);
  * "tool": a wrong tool (`sub` for "increase ..."), never one that gives the same result;
  * "malformed" (rarer): the closing brace missing, single quotes, or an operand as a string
    (`"a": "17"`, a schema violation).
Mistakes are habits: each tool has its own slip rate (`flaw_prob` times 0.5 for `sum`, 1.0 for
`mul`, 1.5 for `sub`: the mean is `flaw_prob` while `flaw_prob` <= 2/3) and its own habitual
slip (`HABITS`: an operand off by one, `sum` for "multiply", swapped operands), which makes up
`HABIT_SHARE` (3/4) of its slips; the rest are drawn with weights 0.3, 0.25, 0.3, 0.15 (swap
only for `sub`). At the lab's default `flaw_prob` 0.65 the wrong call is the most common
completion for "decrease" and "multiply" and the right one for "increase", so the base model
solves some problems and not others.
Corpus completions are at most `MAX_NEW_TOKENS - 1` characters (the quoted operand adds two).

Train and held-out problems never coincide (for `sum` and `mul` not even with the operands
swapped): the held-out set is drawn first from its own seed; training draws in it are redrawn.
Verification costs about 0.03 ms per completion, 4 ms per 128 (no sandbox: the tools are
trusted code).
"""

from __future__ import annotations

import json
import random
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from rlvr.tasks.spec import Row, TaskSpec, distinct_draws, draws_excluding
from rlvr.verifiers import tool as tool_verifier

NAME = "tool"
OPERAND_RANGE = range(10, 100)
_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


def tool_sum(a: int, b: int) -> int:
    return a + b


def tool_sub(a: int, b: int) -> int:
    return a - b


def tool_mul(a: int, b: int) -> int:
    return a * b


TOOLS: dict[str, tool_verifier.Tool] = {
    "sum": tool_verifier.Tool("sum", _SCHEMA, tool_sum),
    "sub": tool_verifier.Tool("sub", _SCHEMA, tool_sub),
    "mul": tool_verifier.Tool("mul", _SCHEMA, tool_mul),
}
"""This task's tools by name; each takes integers `a` and `b`."""
_PROMPTS = {
    "sum": "increase {a} by {b}\n",
    "sub": "decrease {a} by {b}\n",
    "mul": "multiply {a} by {b}\n",
}
_COMMUTATIVE = {"sum", "mul"}
PROMPT_CHARS = len("increase 10 by 10\n")
COMPLETION_CHARS = len(json.dumps({"arguments": {"a": 10, "b": 10}, "name": "sum"}))
MAX_NEW_TOKENS = COMPLETION_CHARS + 2 + 1  # + a quoted operand (flawed corpus) + EOS
FLAWS = ("argument", "swap", "tool", "malformed")
_FLAW_WEIGHTS = {"argument": 0.3, "swap": 0.25, "tool": 0.3, "malformed": 0.15}
HABITS: dict[str, tuple[float, str]] = {
    "sum": (0.5, "argument"),
    "mul": (1.0, "tool"),
    "sub": (1.5, "swap"),
}
"""Per tool: relative slip rate (mean 1) and the habitual slip (`mul`'s: calling `sum`)."""
HABIT_SHARE = 0.75
"""Share of a tool's slips that are its habitual one; the rest are drawn by `_FLAW_WEIGHTS`."""


def register_tools() -> None:
    """Put `TOOLS` in this process's tool registry (idempotent; see the module docstring)."""
    registered = tool_verifier.registered_tools()
    for name, tool in TOOLS.items():
        existing = registered.get(name)
        if existing is None:
            tool_verifier.register_tool(name, tool.schema, tool.fn)
        elif existing.fn is not tool.fn:
            warnings.warn(
                f"tool {name!r} is already registered with another function; the tool task "
                "grades with its own tools (tools=TOOLS) and leaves the registry as it is",
                RuntimeWarning,
                stacklevel=2,
            )


register_tools()


@dataclass(frozen=True)
class ToolTaskConfig:
    """Sizes and seeds of the tool task."""

    held_out_size: int = 200
    """Number of held-out problems (never used for training)."""
    held_out_seed: int = 5678
    """Seed of the held-out draw; fixed so that every run evaluates on the same problems."""


@dataclass(frozen=True)
class Problem:
    """One call: tool `tool` on operands `a` and `b`."""

    tool: str
    a: int
    b: int

    @property
    def prompt(self) -> str:
        return _PROMPTS[self.tool].format(a=self.a, b=self.b)

    @property
    def answer(self) -> int:
        return TOOLS[self.tool].fn(a=self.a, b=self.b)

    @property
    def solution(self) -> str:
        """The correct completion."""
        return _call(self.tool, self.a, self.b)

    @property
    def key(self) -> tuple[str, int, int]:
        """Identity for the train/held-out split: operands in order only where order matters."""
        if self.tool in _COMMUTATIVE:
            return (self.tool, min(self.a, self.b), max(self.a, self.b))
        return (self.tool, self.a, self.b)


def _call(tool: str, a: Any, b: Any) -> str:
    return json.dumps({"arguments": {"a": a, "b": b}, "name": tool})


def _draw_problem(rng: random.Random) -> Problem:
    return Problem(rng.choice(tuple(TOOLS)), rng.choice(OPERAND_RANGE), rng.choice(OPERAND_RANGE))


def _check_config(config: ToolTaskConfig) -> None:
    space = len(TOOLS) * len(OPERAND_RANGE) ** 2 // 2  # about, counting commuted calls once
    if not 0 < config.held_out_size <= space // 4:
        raise ValueError(f"held_out_size must be in 1..{space // 4}, got {config.held_out_size}")


def held_out_problems(config: ToolTaskConfig) -> list[Problem]:
    """The fixed held-out set: `held_out_size` distinct problems drawn from `held_out_seed`."""
    _check_config(config)
    return distinct_draws(
        _draw_problem, attrgetter("key"), config.held_out_size, config.held_out_seed
    )


def train_problems(config: ToolTaskConfig, seed: int | str) -> Iterator[Problem]:
    """An endless seeded stream of training problems, none of them in the held-out set."""
    excluded = {p.key for p in held_out_problems(config)}
    return draws_excluding(_draw_problem, attrgetter("key"), excluded, seed)


def rows(problems: Sequence[Problem]) -> list[Row]:
    """Task rows (`prompt`, `answer`) as the trainer and reward functions consume them."""
    return [{"prompt": p.prompt, "answer": p.answer} for p in problems]


def _near(value: int, rng: random.Random) -> int:
    steps = [d for d in (-1, 1) if value + d in OPERAND_RANGE]
    return value + rng.choice(steps)


def flawed_solution(problem: Problem, rng: random.Random) -> tuple[str, str]:
    """(flaw kind, completion): one realistic mistake; the completion scores 0.

    `HABIT_SHARE` of the time the tool's habitual slip (`HABITS`), else any slip.
    """
    tool, a, b = problem.tool, problem.a, problem.b
    kinds = [k for k in FLAWS if k != "swap" or (tool == "sub" and a != b)]
    habit = HABITS[tool][1]
    if habit in kinds and rng.random() < HABIT_SHARE:
        kind = habit
    else:
        kind = rng.choices(kinds, weights=[_FLAW_WEIGHTS[k] for k in kinds])[0]
    if kind == "argument":
        if rng.random() < 0.5:
            return kind, _call(tool, _near(a, rng), b)
        return kind, _call(tool, a, _near(b, rng))
    if kind == "swap":
        return kind, _call(tool, b, a)
    if kind == "tool":
        if kind == habit:
            return kind, _call("sum", a, b)  # multiply -> sum: never the same result here
        others = [t for t in TOOLS if t != tool and TOOLS[t].fn(a=a, b=b) != problem.answer]
        return kind, _call(rng.choice(others), a, b)
    variant = rng.randrange(3)
    if variant == 0:
        return kind, problem.solution[:-1]  # closing brace missing
    if variant == 1:
        return kind, problem.solution.replace('"', "'")
    if rng.random() < 0.5:
        return kind, _call(tool, str(a), b)
    return kind, _call(tool, a, str(b))


def slip_rate(tool: str, flaw_prob: float) -> float:
    """The chance that a corpus completion for `tool` is flawed (mean over tools: `flaw_prob`,
    exactly while `flaw_prob * 1.5 <= 1`)."""
    return min(1.0, flaw_prob * HABITS[tool][0])


def corpus(config: ToolTaskConfig, seed: int | str, flaw_prob: float) -> Iterator[tuple[str, str]]:
    """Endless (prompt, completion) pairs over training problems; about `flaw_prob` flawed."""
    if not 0.0 <= flaw_prob <= 1.0:
        raise ValueError(f"flaw_prob must be in [0, 1], got {flaw_prob}")
    rng = random.Random(f"tool-flaws/{seed}")
    for problem in train_problems(config, f"tool-corpus/{seed}"):
        if flaw_prob > 0 and rng.random() < slip_rate(problem.tool, flaw_prob):
            yield problem.prompt, flawed_solution(problem, rng)[1]
        else:
            yield problem.prompt, problem.solution


def tool_task_reward(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any], **kwargs: Any
) -> list[float]:
    """TRL reward function (column `answer`): 1.0 when the one call returns the answer."""
    if len(completions) != len(answer):
        raise ValueError(f"{len(completions)} completions but {len(answer)} answers")
    return [
        tool_verifier.score(c, expected, tools=TOOLS) for c, expected in zip(completions, answer)
    ]


def tool_task_score(completion: Any, row: Row) -> float:
    """The tool verifier on one completion and its row (held-out evaluation)."""
    return tool_verifier.score(completion, row["answer"], tools=TOOLS)


def task_spec(seed_offset: int = 0) -> TaskSpec:
    """The tool task; `seed_offset` shifts every seed (the held-out draw's too): 0 is canonical."""
    config = ToolTaskConfig(held_out_seed=ToolTaskConfig.held_out_seed + seed_offset)
    held_out = rows(held_out_problems(config))

    def held_out_rows() -> list[Row]:
        return [dict(row) for row in held_out]

    def train_rows(seed: int) -> Iterator[Row]:
        for problem in train_problems(config, f"tool-train/{seed}/{seed_offset}"):
            yield {"prompt": problem.prompt, "answer": problem.answer}

    def corpus_pairs(seed: int, flaw_prob: float) -> Iterator[tuple[str, str]]:
        return corpus(config, f"{seed}/{seed_offset}", flaw_prob)

    return TaskSpec(
        name=NAME,
        held_out_rows=held_out_rows,
        train_rows=train_rows,
        corpus=corpus_pairs,
        reward_fn=tool_task_reward,
        score=tool_task_score,
        max_new_tokens=MAX_NEW_TOKENS,
        min_new_tokens=COMPLETION_CHARS + 1,  # the correct completion and EOS
        describe="calculator tool calls (sum/sub/mul, JSON)",
    )
