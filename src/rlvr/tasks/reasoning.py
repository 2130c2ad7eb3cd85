"""Addition with a `<think>` scratchpad: the task behind the R1 / Qwen3 pipelines in miniature.

Formats (Qwen3 / R1 style; `<think>` and `</think>` are single tokens of the tiny tokenizer)
-------------------------------------------------------------------------------------------
Prompt: the problem, optionally preceded by a mode tag::

    357+468=             think (the default, as Qwen3's default is thinking)
    /think 357+468=      think
    /no_think 357+468=   answer without thinking

Qwen3 appends its soft switches to the user message; here the tag comes *first*, so that the
operand digits sit at the same distance from the completion in every mode (the fixed-offset
copying that `rlvr.tasks.arithmetic` relies on would otherwise shift by the tag's length).

Completion, thinking: the arithmetic task's fixed-width column steps inside a think block, then
the bare answer::

    <think>7+8+0=15 5+6+1=12 3+4+1=08</think>825

Completion, not thinking (Qwen3 writes an empty think block in no-think mode)::

    <think></think>825

"Language mixing", R1-Zero's readability problem, in miniature: a second notation for the same
steps, digits written as the letters a-j (0 -> a, ..., 9 -> j), same width::

    7+8+0=15  ==  h+i+a=bf

The flawed corpus that "pretrains" the base mixes the two notations *within* a solution (each
step is lettered with probability `mix_prob`) and drops carries as the arithmetic corpus does
(`flaw_prob`), so the base is both inaccurate and unreadable. The final answer is always digits.

Grading
-------
`verify` is strict: the completion must be exactly one think block at the very start
(`<think>` ... `</think>`, nothing before it, no second tag anywhere) followed by the answer,
which, stripped of surrounding whitespace, must be the reference's digits exactly (no marker,
no box, no units, no leading zeros, no hedge: stricter than the general math verifier, which
this format does not need). The reasoning is never graded. An empty think block is allowed:
that is the no-think answer.

`readability` (R1's "language consistency": the share of the chain of thought in the target
language) is the fraction of the think block's whitespace-separated words that are well-formed
steps in digit notation. An all-letter solution is consistent but not in the target notation:
0. A malformed think block (missing, unclosed, duplicated, text before it) or an empty one
scores 0: the reward is for readable reasoning, not for skipping it, so use it with thinking
prompts. `format_consistency_reward` is the same in TRL's reward signature.

Problems are drawn by `rlvr.tasks.arithmetic` (addition only), so held-out and training problems
never coincide, exactly as there (with `variable_steps`, by this module's draw, excluded the
same way).

Variable thinking length (`variable_steps`)
-------------------------------------------
By default every problem has `digits`-digit operands and needs all `digits` steps, so a thinking
budget below the full chain leaves the answer's digits in the wrong places: the budget curve is
a cliff. With `variable_steps` the number of steps a problem needs, k, is uniform in
1..`digits`: both operands are below 10**k and the longer has k real digits; both are
zero-padded to the full width in the prompt, so the digit to copy stays at a fixed offset::

    007+045=   ->  <think>7+5+0=12 0+4+1=05</think>52        (2 steps)
    007+005=   ->  <think>7+5+0=12</think>12                 (1 step)
    357+468=   ->  <think>7+8+0=15 5+6+1=12 3+4+1=08</think>825

The solution stops after the last column in which an operand has a real digit: the carry out of
it is the last step's tens digit, exactly as in the full-width format (a full-width problem's
solution is unchanged), so no problem needs more than `digits` steps. A budget of
`step_budgets(digits)[k]` tokens then holds the whole chain of every problem that needs at most
k steps. The answer has no leading zeros, as always.
"""

from __future__ import annotations

import functools
import itertools
import random
import re
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rlvr.tasks import arithmetic
from rlvr.tasks.arithmetic import ANSWER_MARKER, ArithmeticTaskConfig, Problem
from rlvr.tasks.spec import Row, TaskSpec, distinct_draws, draws_excluding
from rlvr.verifiers.format import THINK_CLOSE, THINK_OPEN, completion_text

__all__ = [
    "MODES",
    "REASONS",
    "PaddedProblem",
    "ReasoningTaskConfig",
    "flawed_solution",
    "cut_solution",
    "format_consistency_reward",
    "held_out_problems",
    "max_completion_tokens",
    "mode_prompt",
    "no_think_examples",
    "readability",
    "readable_solutions",
    "reasoning_reward",
    "rows",
    "score",
    "set_mode",
    "split_think",
    "step_budgets",
    "task_spec",
    "think_completion",
    "thinking_steps",
    "to_letters",
    "train_problems",
    "verify",
]

MODES = ("default", "think", "no_think")
MODE_TAGS = {"default": "", "think": "/think ", "no_think": "/no_think "}
LETTERS = "abcdefghij"
_TO_LETTERS = str.maketrans("0123456789", LETTERS)
DIGIT_STEP = re.compile(r"\d\+\d\+\d=\d\d")
LETTER_STEP = re.compile(r"[a-j]\+[a-j]\+[a-j]=[a-j][a-j]")
_STEP_CHARS = len("9+9+1=19")

REASONS = (
    "correct",
    "wrong",
    "no_answer",
    "missing_think",
    "unclosed_think",
    "extra_tags",
    "text_before_think",
    "error",
)
REASON_COUNTS: Counter[str] = Counter()
_COUNTS_LOCK = threading.Lock()


@dataclass(frozen=True)
class ReasoningTaskConfig:
    """Difficulty, notation mixing and seeds of the reasoning task."""

    digits: int = 3
    """Digits in each operand. At 3, a tiny model that answers without its scratchpad is far
    worse than one that thinks (measured; docs/miniature.md)."""
    mix_prob: float = 0.5
    """Flawed corpus: chance that each step is written in letter notation (h+i+a=bf)."""
    held_out_size: int = 200
    """Number of held-out problems (never used for training)."""
    held_out_seed: int = 1234
    """Seed of the held-out draw; fixed so that every run evaluates on the same problems."""
    variable_steps: bool = False
    """Problems need 1..`digits` steps (uniform), operands zero-padded to `digits` in the prompt
    (`007+045=`); the solution stops after the last column with a real digit (module
    docstring). Off: every problem needs all `digits` steps."""


@dataclass(frozen=True)
class PaddedProblem(Problem):
    """An addition whose prompt writes both operands zero-padded to `width` digits
    (`007+045=`); the worked solution and the answer are those of the plain numbers."""

    width: int = 1

    @property
    def prompt(self) -> str:
        return f"{self.a:0{self.width}d}{self.op}{self.b:0{self.width}d}="


# --- prompts and completions ---------------------------------------------------------------


def mode_prompt(question: str, mode: str = "default") -> str:
    """`357+468=` with the mode's tag in front: '' (default), '/think ' or '/no_think '."""
    if mode not in MODE_TAGS:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return MODE_TAGS[mode] + question


def set_mode(prompt: str, mode: str) -> str:
    """`prompt` with its mode tag (if any) replaced by `mode`'s."""
    for tag in (MODE_TAGS["think"], MODE_TAGS["no_think"]):
        if prompt.startswith(tag):
            prompt = prompt[len(tag) :]
            break
    return mode_prompt(prompt, mode)


def to_letters(step: str) -> str:
    """A step in letter notation: `7+8+0=15` -> `h+i+a=bf`."""
    return step.translate(_TO_LETTERS)


def think_completion(steps: list[str], answer: str) -> str:
    """`<think>` + the steps joined by spaces + `</think>` + answer (no steps: no-think form)."""
    return f"{THINK_OPEN}{' '.join(steps)}{THINK_CLOSE}{answer}"


def flawed_solution(
    problem: Problem, flaw_prob: float, mix_prob: float, rng: random.Random | None = None
) -> str:
    """A thinking completion with dropped carries (`flaw_prob` each) and lettered steps
    (`mix_prob` each); with both 0 it is the clean, readable solution."""
    if mix_prob > 0 and rng is None:
        raise ValueError("a random.Random is needed when mix_prob > 0")
    text = arithmetic.worked_solution(problem, flaw_prob, rng)
    steps, final = text.split(f" {ANSWER_MARKER} ")
    mixed = [
        to_letters(s) if mix_prob > 0 and rng.random() < mix_prob else s for s in steps.split()
    ]
    return think_completion(mixed, final)


def thinking_steps(problem: Problem) -> int:
    """Steps of `problem`'s clean solution: the longer operand's number of digits."""
    return max(len(str(problem.a)), len(str(problem.b)))


def max_completion_tokens(digits: int) -> int:
    """Tokens of the longest correct thinking completion, EOS included."""
    steps = digits * _STEP_CHARS + (digits - 1)
    return 1 + steps + 1 + (digits + 1) + 1  # <think> steps </think> answer EOS


# --- problems and rows ---------------------------------------------------------------------


def _arithmetic_config(config: ReasoningTaskConfig) -> ArithmeticTaskConfig:
    return ArithmeticTaskConfig(
        digits=config.digits,
        operations=("+",),
        held_out_size=config.held_out_size,
        held_out_seed=config.held_out_seed,
    )


def _draw_variable(rng: random.Random, digits: int) -> PaddedProblem:
    """k uniform in 1..digits, then operands below 10**k, at least one of them with k digits
    (0 counts as one digit)."""
    k = rng.randint(1, digits)
    low, high = (10 ** (k - 1) if k > 1 else 0), 10**k - 1
    while True:
        a, b = rng.randint(0, high), rng.randint(0, high)
        if max(a, b) >= low:
            return PaddedProblem(a, b, "+", digits)


def held_out_problems(config: ReasoningTaskConfig) -> list[Problem]:
    """The fixed held-out problems (the arithmetic task's draw, addition only; with
    `variable_steps`, zero-padded problems of 1..digits steps, distinct, from the same seed)."""
    if not config.variable_steps:
        return arithmetic.held_out_problems(_arithmetic_config(config))
    arithmetic._check_config(_arithmetic_config(config))  # the full-width space bounds the size
    draw = functools.partial(_draw_variable, digits=config.digits)
    return distinct_draws(draw, _identity, config.held_out_size, config.held_out_seed)


def train_problems(config: ReasoningTaskConfig, seed: int) -> Iterator[Problem]:
    """An endless seeded stream of training problems, none of them held out."""
    if not config.variable_steps:
        return arithmetic.train_problems(_arithmetic_config(config), seed)
    draw = functools.partial(_draw_variable, digits=config.digits)
    return draws_excluding(draw, _identity, set(held_out_problems(config)), seed)


def _identity(problem: Problem) -> Problem:
    return problem


def rows(problems: list[Problem], mode: str = "default") -> list[Row]:
    """Task rows (`prompt` tagged with `mode`, `answer`)."""
    return [{"prompt": mode_prompt(p.prompt, mode), "answer": p.answer} for p in problems]


def readable_solutions(
    config: ReasoningTaskConfig, count: int, seed: int, mode: str = "default"
) -> list[tuple[str, str]]:
    """`count` (prompt, completion) pairs of clean long chain of thought: correct, digit
    notation only. Cold-start SFT data (R1), and the thinking half of fusion data (Qwen3)."""
    problems = itertools.islice(train_problems(config, seed), count)
    return [(mode_prompt(p.prompt, mode), flawed_solution(p, 0.0, 0.0)) for p in problems]


def no_think_examples(config: ReasoningTaskConfig, count: int, seed: int) -> list[tuple[str, str]]:
    """`count` pairs `/no_think 357+468=` -> `<think></think>825`: the no-think half of
    Qwen3's thinking-mode fusion data."""
    problems = itertools.islice(train_problems(config, seed), count)
    return [(mode_prompt(p.prompt, "no_think"), think_completion([], p.answer)) for p in problems]


def cut_solution(problem: Problem, rng: random.Random, stop_phrase: str = "\n") -> str:
    """The clean thinking cut after k of its d steps (k uniform in 1..d-1), then `stop_phrase`
    + `</think>` + the right answer: what `generate_with_thinking_budget` writes when a budget
    of `step_budgets(d)[k]` tokens runs out (`stop_phrase` must be the one used there).

    Fusion data meant to teach answering from partial thinking. Measured (docs/miniature.md):
    it did not (3 % at two of three steps) and taught the model to stop thinking early when
    sampling, so no pipeline uses it; `scripts/miniature.py --data fused_budget` reproduces."""
    steps = flawed_solution(problem, 0.0, 0.0)[len(THINK_OPEN) :].split(THINK_CLOSE)[0].split()
    k = rng.randint(1, max(1, len(steps) - 1))
    return f"{THINK_OPEN}{' '.join(steps[:k])}{stop_phrase}{THINK_CLOSE}{problem.answer}"


def step_budgets(digits: int) -> list[int]:
    """Thinking budgets that end on a step boundary: 0, 8, 17, ... (k steps: 9k - 1 tokens)."""
    return [0] + [(_STEP_CHARS + 1) * k - 1 for k in range(1, digits + 1)]


# --- grading -------------------------------------------------------------------------------


def split_think(completion: str) -> tuple[str, str, str]:
    """(reason, thinking, answer): reason "ok" when `completion` is exactly one think block at
    the start followed by anything; else "missing_think", "unclosed_think", "extra_tags" or
    "text_before_think" (then thinking and answer are "")."""
    opens, closes = completion.count(THINK_OPEN), completion.count(THINK_CLOSE)
    if not opens:
        return "missing_think", "", ""
    if opens > 1 or closes > 1:
        return "extra_tags", "", ""
    if not closes:
        return "unclosed_think", "", ""
    before, rest = completion.split(THINK_OPEN)
    if THINK_CLOSE in before:
        return "extra_tags", "", ""  # "</think> ... <think>"
    if before.strip():
        return "text_before_think", "", ""
    thinking, answer = rest.split(THINK_CLOSE)
    return "ok", thinking, answer


def verify(completion: Any, answer: str) -> tuple[float, dict[str, Any]]:
    """(1.0 or 0.0, {"reason", "extracted"}); never raises. Reasons: `REASONS`."""
    parts: dict[str, Any] = {"reason": "error", "extracted": None}
    text = completion_text(completion)
    if text is not None and isinstance(answer, str) and answer.strip():
        reason, _, final = split_think(text)
        final = final.strip()
        if reason == "ok":
            parts["extracted"] = final or None
            reason = "no_answer" if not final else "correct" if final == answer.strip() else "wrong"
        parts["reason"] = reason
    with _COUNTS_LOCK:
        REASON_COUNTS[parts["reason"]] += 1
    return (1.0 if parts["reason"] == "correct" else 0.0), parts


def score(completion: Any, answer: str) -> float:
    """1.0 if `completion` is one think block followed by exactly `answer`, else 0.0."""
    return verify(completion, answer)[0]


def reason_counts(reset: bool = False) -> dict[str, int]:
    """Verdicts by reason since the last reset (this process)."""
    with _COUNTS_LOCK:
        counts = dict(REASON_COUNTS)
        if reset:
            REASON_COUNTS.clear()
    return counts


def reasoning_reward(
    prompts: list[Any], completions: list[Any], answer: list[str], **kwargs: Any
) -> list[float]:
    """TRL reward function of `verify` (column `answer`)."""
    if len(completions) != len(answer):
        raise ValueError(f"{len(completions)} completions but {len(answer)} answers")
    return [score(c, a) for c, a in zip(completions, answer, strict=True)]


reasoning_reward.reason_counts = reason_counts  # type: ignore[attr-defined]


def readability(completion: Any) -> float:
    """Fraction of the think block's words that are digit-notation steps (module docstring);
    0 for a malformed or empty think block."""
    text = completion_text(completion)
    if text is None:
        return 0.0
    reason, thinking, _ = split_think(text)
    words = thinking.split()
    if reason != "ok" or not words:
        return 0.0
    return sum(DIGIT_STEP.fullmatch(w) is not None for w in words) / len(words)


def format_consistency_reward(
    prompts: list[Any], completions: list[Any], **kwargs: Any
) -> list[float]:
    """TRL reward function: `readability` of each completion (R1's language consistency)."""
    return [readability(c) for c in completions]


def follows_mode(prompt: Any, completion: Any) -> float:
    """1.0 when the completion obeys the prompt's thinking mode: an empty think block for a
    `/no_think` prompt, a non-empty one otherwise (Qwen3's soft switch); else 0.0."""
    text, prompt_text = completion_text(completion), completion_text(prompt)
    if text is None or prompt_text is None:
        return 0.0
    reason, thinking, _ = split_think(text)
    if reason != "ok":
        return 0.0
    wants_thinking = not prompt_text.lstrip().startswith(MODE_TAGS["no_think"].strip())
    return float(bool(thinking.strip()) == wants_thinking)


def mode_following_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """TRL reward function: `follows_mode` of each (prompt, completion)."""
    return [follows_mode(p, c) for p, c in zip(prompts, completions, strict=True)]


# --- the task ------------------------------------------------------------------------------


def task_spec(config: ReasoningTaskConfig) -> TaskSpec:
    """The reasoning task as a `TaskSpec`; the corpus is thinking-mode, default prompts."""
    if not 0.0 <= config.mix_prob <= 1.0:
        raise ValueError(f"mix_prob must be in [0, 1], got {config.mix_prob}")

    def corpus(seed: int, flaw_prob: float) -> Iterator[tuple[str, str]]:
        rng = random.Random(seed + 1)
        for problem in train_problems(config, seed):
            yield problem.prompt, flawed_solution(problem, flaw_prob, config.mix_prob, rng)

    def train_rows(seed: int) -> Iterator[Row]:
        return ({"prompt": p.prompt, "answer": p.answer} for p in train_problems(config, seed))

    longest = max_completion_tokens(config.digits)
    variable = f", 1..{config.digits} steps" if config.variable_steps else ""
    return TaskSpec(
        name="reasoning",
        held_out_rows=lambda: rows(held_out_problems(config)),
        train_rows=train_rows,
        corpus=corpus,
        reward_fn=reasoning_reward,
        score=lambda completion, row: score(completion, row["answer"]),
        max_new_tokens=longest + 8,
        describe=f"{config.digits}-digit addition with <think>" + variable,
        min_new_tokens=longest,
    )
