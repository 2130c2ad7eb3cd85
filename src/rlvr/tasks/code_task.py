"""Seeded synthetic "write a function" problems, graded by the sandboxed code verifier.

A problem is a one-line function of `x` stated in a comment; the prompt opens the definition and
the completion is its body:

    prompt      "# f(x) = 3*(x+17)\\ndef f(x):\\n"
    completion  "    return 3*(x+17)"
    tests       ["assert f(1) == 54", "assert f(15) == 96", "assert f(3) == 60"]

Every expression is exactly 8 characters (one one-digit constant `a` in 2..9, one two-digit
constant `b` in 10..99, eight templates: `a*x + b`, `a*x - b`, `a*(x+b)`, `a*(x-b)`,
`a*x*x+b`, `b - a*x`, `b*x + a`, `x%a + b`), so every prompt is 28 characters, every correct
completion 19, and each character of the body sits at one fixed distance from the character of
the comment it copies: the fixed-width trick of `rlvr.tasks.arithmetic`, which a 1 M-parameter
character model needs to learn copying quickly. The three tests call `f` on distinct inputs in
0..19 chosen per problem (seeded by the problem, so a problem always has the same tests).

What is graded: the program is the prompt followed by the completion (the completion alone is
only the body; `program`). The reward is the pass fraction of the three tests under
`rlvr.verifiers.code` (the code verifier's TRL form, column `tests`); `score` is the same for one
completion and its row. Conversational prompts are not supported by this task's format: then the
completion alone is graded and must define `f` itself.

Flawed corpus: a completion may carry one realistic mistake, always of the same width, and
always one that fails at least one of the row's tests (most fail all three):
  * "operator": one `+ - * %` replaced by another (`3*x - 17` for `3*x + 17`);
  * "constant": a constant off by one (`3*(x+16)`);
  * "swap": operands or constants swapped (`17*x + 3`, `a*(b-x)` for `a*(x-b)`, `a*x - b` for
    `b - a*x`);
  * "parens": parentheses dropped (`3*x + 17` for `3*(x+17)`; those two templates only).
Mistakes are habits, as a real model's are: each template has its own slip rate
(`flaw_prob` times a weight, 0.5 for `a*x + b` up to 1.4 for the parenthesised ones; the weights
average 1, so `flaw_prob` is the corpus's share of flawed completions while `flaw_prob` <= 0.71)
and its own habitual slip (`HABITS`), which makes up `HABIT_SHARE` (3/4) of its slips. At the
lab's default `flaw_prob` 0.65 the habitual slip is the most common completion for four of the
eight templates and the correct body for the other four: a model pretrained on it writes the
right body for some problems and not others, greedily as well as sampled. (With mistakes spread
uniformly, the correct body was every problem's mode and greedy decoding solved all of them.)

Train and held-out problems never coincide, not even as the same function written differently
(`2*(x+10)` and `2*x + 20`): problems are compared by their values on -5..24. The held-out set is
drawn first from its own seed; every training draw equal to a held-out function is redrawn.

Measured with the lab's tiny model pretrained on this corpus (800 steps of 16, `flaw_prob` 0.65):
36 % greedy and 28 % sampled (temperature 1) held-out accuracy; the corpus allows about 50 % and
35 %.

Cost of verification (2 CPU cores, the sandbox of commit 0d3d4a9: one sandbox per program, a
forked process per test). Idle machine: one 3-test completion takes 0.035-0.045 s; a batch of
128 distinct completions 2.3-2.4 s through the verifier's thread pool (2 workers; 4 are no
faster). With other jobs on the cores (load average 5-9): 0.07-0.13 s and 6-10 s. That is above
the ~2 s per 128 of a cheap verifier even when idle: use small GRPO batches for this task. Two
things make it cheaper in practice, both in `reward_fn` and `score`: identical (program, tests)
pairs in a batch are verified once (a GRPO group repeats completions: 16 prompts x 8 samples
drawn from the corpus at `flaw_prob` 0.5 held 44 distinct and took 0.8-0.95 s idle), and verdicts
are kept in a bounded per-process cache (50 000), so re-grading a completion seen before costs
nothing. Verdicts that depend on the machine's load (timeouts, sandbox errors, memory) are never
cached.
"""

from __future__ import annotations

import functools
import random
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from rlvr.tasks.spec import Row, TaskSpec, distinct_draws, draws_excluding
from rlvr.verifiers.code import extract_code, verify_batch

NAME = "code"
FUNCTION = "f"
TEMPLATES: dict[str, str] = {
    "lin_add": "{a}*x + {b}",
    "lin_sub": "{a}*x - {b}",
    "mul_add": "{a}*(x+{b})",
    "mul_sub": "{a}*(x-{b})",
    "quad": "{a}*x*x+{b}",
    "neg": "{b} - {a}*x",
    "steep": "{b}*x + {a}",
    "mod": "x%{a} + {b}",
}
"""Expression templates; `a` is one digit (2..9), `b` two digits (10..99): all 8 characters."""
_SWAPPED: dict[str, str] = {
    "lin_add": "{b}*x + {a}",
    "lin_sub": "{b} - {a}*x",
    "mul_add": "{b}*(x+{a})",
    "mul_sub": "{a}*({b}-x)",
    "quad": "{b}*x*x+{a}",
    "neg": "{a}*x - {b}",
    "steep": "{a}*x + {b}",
    "mod": "x%{b} + {a}",
}
_NO_PARENS: dict[str, str] = {"mul_add": "{a}*x + {b}", "mul_sub": "{a}*x - {b}"}
HABITS: dict[str, tuple[float, str, str]] = {
    "lin_add": (0.5, "swap", "{b}*x + {a}"),
    "lin_sub": (0.6, "operator", "{a}*x + {b}"),
    "steep": (0.7, "swap", "{a}*x + {b}"),
    "mod": (0.8, "operator", "x*{a} + {b}"),
    "quad": (1.3, "operator", "{a}*x+x+{b}"),
    "neg": (1.3, "swap", "{a}*x - {b}"),
    "mul_add": (1.4, "parens", "{a}*x + {b}"),
    "mul_sub": (1.4, "parens", "{a}*x - {b}"),
}
"""Per template: relative slip rate (mean 1), and the habitual slip (kind, expression)."""
HABIT_SHARE = 0.75
"""Share of a template's slips that are its habitual one; the rest are any slip."""
EXPRESSION_CHARS = 8
BODY_PREFIX = "    return "
PROMPT_CHARS = len(f"# {FUNCTION}(x) = \ndef {FUNCTION}(x):\n") + EXPRESSION_CHARS
COMPLETION_CHARS = len(BODY_PREFIX) + EXPRESSION_CHARS
MAX_NEW_TOKENS = COMPLETION_CHARS + 1  # + EOS
FLAWS = ("operator", "constant", "swap", "parens")
A_RANGE = range(2, 10)
B_RANGE = range(10, 100)
INPUT_RANGE = range(0, 20)
_FINGERPRINT_INPUTS = range(-5, 25)
N_TESTS = 3


@dataclass(frozen=True)
class CodeTaskConfig:
    """Sizes and seeds of the code task."""

    held_out_size: int = 100
    """Held-out problems (never trained on). Kept small: each costs ~0.04 s to verify."""
    held_out_seed: int = 4321
    """Seed of the held-out draw; fixed so that every run evaluates on the same problems."""


@functools.lru_cache(maxsize=65_536)
def _function(expression: str) -> Callable[[int], int]:
    # only ever called on expressions this module rendered from its own templates
    return eval(f"lambda x: {expression}", {"__builtins__": {}})


def _evaluate(expression: str, x: int) -> int:
    return _function(expression)(x)


@dataclass(frozen=True)
class Problem:
    """One problem: `TEMPLATES[template]` with constants `a` (one digit) and `b` (two digits)."""

    template: str
    a: int
    b: int

    @property
    def expression(self) -> str:
        return TEMPLATES[self.template].format(a=self.a, b=self.b)

    @property
    def prompt(self) -> str:
        return f"# {FUNCTION}(x) = {self.expression}\ndef {FUNCTION}(x):\n"

    @property
    def solution(self) -> str:
        """The correct completion."""
        return BODY_PREFIX + self.expression

    @property
    def inputs(self) -> tuple[int, ...]:
        """The test inputs: distinct, drawn from a seed derived from the problem itself."""
        rng = random.Random(f"code-inputs/{self.template}/{self.a}/{self.b}")
        return tuple(rng.sample(INPUT_RANGE, N_TESTS))

    @property
    def tests(self) -> list[str]:
        expression = self.expression
        return [f"assert {FUNCTION}({x}) == {_evaluate(expression, x)}" for x in self.inputs]

    @property
    def fingerprint(self) -> tuple[int, ...]:
        """The function's values on -5..24: equal fingerprints mean the same problem."""
        return tuple(_evaluate(self.expression, x) for x in _FINGERPRINT_INPUTS)


def _draw_problem(rng: random.Random) -> Problem:
    return Problem(rng.choice(tuple(TEMPLATES)), rng.choice(A_RANGE), rng.choice(B_RANGE))


def _check_config(config: CodeTaskConfig) -> None:
    space = len(TEMPLATES) * len(A_RANGE) * len(B_RANGE)
    if not 0 < config.held_out_size <= space // 4:
        raise ValueError(f"held_out_size must be in 1..{space // 4}, got {config.held_out_size}")


def held_out_problems(config: CodeTaskConfig) -> list[Problem]:
    """The fixed held-out set: `held_out_size` distinct functions drawn from `held_out_seed`."""
    _check_config(config)
    fingerprint = attrgetter("fingerprint")
    return distinct_draws(_draw_problem, fingerprint, config.held_out_size, config.held_out_seed)


def train_problems(config: CodeTaskConfig, seed: int | str) -> Iterator[Problem]:
    """An endless seeded stream of training problems, none of them a held-out function."""
    excluded = {p.fingerprint for p in held_out_problems(config)}
    return draws_excluding(_draw_problem, attrgetter("fingerprint"), excluded, seed)


def rows(problems: Sequence[Problem]) -> list[Row]:
    """Task rows (`prompt`, `tests`) as the trainer and reward functions consume them."""
    return [{"prompt": p.prompt, "tests": p.tests} for p in problems]


def _flaw_candidates(problem: Problem, kind: str) -> list[str]:
    """Flawed expressions of `kind` for `problem`, all `EXPRESSION_CHARS` wide."""
    a, b, template = problem.a, problem.b, problem.template
    expression = problem.expression
    if kind == "operator":
        out = []
        for i, char in enumerate(expression):
            if char in "+-*%":
                for other in "+-*%".replace(char, ""):
                    if other == "%" and char != "%":
                        continue  # a stray modulo is not a slip anyone makes
                    out.append(expression[:i] + other + expression[i + 1 :])
        return out
    if kind == "constant":
        out = [TEMPLATES[template].format(a=a2, b=b) for a2 in (a - 1, a + 1) if 1 <= a2 <= 9]
        out += [TEMPLATES[template].format(a=a, b=b2) for b2 in (b - 1, b + 1) if 10 <= b2 <= 99]
        return out
    if kind == "swap":
        return [_SWAPPED[template].format(a=a, b=b)]
    if kind == "parens":
        return [_NO_PARENS[template].format(a=a, b=b)] if template in _NO_PARENS else []
    raise ValueError(f"unknown flaw {kind!r}")


def _fails_a_test(problem: Problem, expression: str) -> bool:
    for x in problem.inputs:
        try:
            if _evaluate(expression, x) != _evaluate(problem.expression, x):
                return True
        except ArithmeticError:  # e.g. modulo by zero: the test crashes, so it fails
            return True
    return False


def flawed_solution(problem: Problem, rng: random.Random) -> tuple[str, str]:
    """(flaw kind, completion): one realistic mistake that fails at least one of the tests.

    `HABIT_SHARE` of the time the template's habitual slip (`HABITS`), else any slip.
    """
    kind, habit = HABITS[problem.template][1:]
    expression = habit.format(a=problem.a, b=problem.b)
    if rng.random() < HABIT_SHARE and _fails_a_test(problem, expression):
        return kind, BODY_PREFIX + expression
    kinds = [k for k in FLAWS if _flaw_candidates(problem, k)]
    rng.shuffle(kinds)
    for kind in kinds:
        candidates = [e for e in _flaw_candidates(problem, kind) if _fails_a_test(problem, e)]
        if candidates:
            return kind, BODY_PREFIX + rng.choice(candidates)
    raise AssertionError(f"no detectable flaw for {problem}")  # a constant off by one always is


def slip_rate(template: str, flaw_prob: float) -> float:
    """The chance that a corpus completion of `template` is flawed (mean over templates:
    `flaw_prob`, exactly while `flaw_prob * 1.4 <= 1`)."""
    return min(1.0, flaw_prob * HABITS[template][0])


def corpus(config: CodeTaskConfig, seed: int | str, flaw_prob: float) -> Iterator[tuple[str, str]]:
    """Endless (prompt, completion) pairs over training problems; about `flaw_prob` flawed."""
    if not 0.0 <= flaw_prob <= 1.0:
        raise ValueError(f"flaw_prob must be in [0, 1], got {flaw_prob}")
    rng = random.Random(f"code-flaws/{seed}")
    for problem in train_problems(config, f"code-corpus/{seed}"):
        if flaw_prob > 0 and rng.random() < slip_rate(problem.template, flaw_prob):
            yield problem.prompt, flawed_solution(problem, rng)[1]
        else:
            yield problem.prompt, problem.solution


# --------------------------------------------------------------------------------------------
# Grading
# --------------------------------------------------------------------------------------------

_CACHE_SIZE = 50_000
_cache: OrderedDict[tuple[str, tuple[str, ...]], float] = OrderedDict()
_cache_lock = threading.Lock()
_UNSTABLE = {"timeout", "error", "memory"}  # verdicts that depend on the machine's load


def program(prompt: Any, completion: Any) -> str | None:
    """The program graded for a completion: prompt + completion for plain-text prompts."""
    try:
        if isinstance(prompt, str) and isinstance(completion, str):
            return extract_code(prompt + completion)
        return extract_code(completion)
    except Exception:
        return None


def _test_key(tests: Any) -> tuple[str, ...]:
    return tuple(tests) if isinstance(tests, (list, tuple)) else (str(tests),)


def _grade(programs: Sequence[str | None], tests: Sequence[Any]) -> list[float]:
    if len(programs) != len(tests):
        raise ValueError(f"{len(programs)} completions but {len(tests)} test lists")
    keys = [(p, _test_key(t)) for p, t in zip(programs, tests)]
    rewards: dict[tuple[Any, tuple[str, ...]], float] = {}
    todo: dict[tuple[str, tuple[str, ...]], None] = {}
    with _cache_lock:
        for key in keys:
            if key[0] is None:
                rewards[key] = 0.0
            elif key in _cache:
                _cache.move_to_end(key)
                rewards[key] = _cache[key]
            else:
                todo.setdefault(key)
    if todo:
        pending = list(todo)
        verdicts = verify_batch([k[0] for k in pending], [list(k[1]) for k in pending])
        with _cache_lock:
            for key, (reward, parts) in zip(pending, verdicts):
                rewards[key] = reward
                reasons = {r.get("reason") for r in parts.get("tests", [])} | {parts.get("reason")}
                if not reasons & _UNSTABLE:
                    _cache[key] = reward
                    if len(_cache) > _CACHE_SIZE:
                        _cache.popitem(last=False)
    return [rewards[key] for key in keys]


def clear_cache() -> None:
    """Forget every cached verdict (for timing the verifier)."""
    with _cache_lock:
        _cache.clear()


def code_task_reward(
    prompts: Sequence[Any], completions: Sequence[Any], tests: Sequence[Any], **kwargs: Any
) -> list[float]:
    """TRL reward function (column `tests`): pass fraction of prompt + completion."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    return _grade([program(p, c) for p, c in zip(prompts, completions)], tests)


def code_task_score(completion: str, row: Row) -> float:
    """Pass fraction of one completion on its row (held-out evaluation)."""
    return _grade([program(row["prompt"], completion)], [row["tests"]])[0]


def task_spec(seed_offset: int = 0) -> TaskSpec:
    """The code task; `seed_offset` shifts every seed (the held-out draw's too): 0 is canonical."""
    config = CodeTaskConfig(held_out_seed=CodeTaskConfig.held_out_seed + seed_offset)
    held_out = rows(held_out_problems(config))

    def held_out_rows() -> list[Row]:
        return [dict(row, tests=list(row["tests"])) for row in held_out]

    def train_rows(seed: int) -> Iterator[Row]:
        for problem in train_problems(config, f"code-train/{seed}/{seed_offset}"):
            yield {"prompt": problem.prompt, "tests": problem.tests}

    def corpus_pairs(seed: int, flaw_prob: float) -> Iterator[tuple[str, str]]:
        return corpus(config, f"{seed}/{seed_offset}", flaw_prob)

    return TaskSpec(
        name=NAME,
        held_out_rows=held_out_rows,
        train_rows=train_rows,
        corpus=corpus_pairs,
        reward_fn=code_task_reward,
        score=code_task_score,
        max_new_tokens=MAX_NEW_TOKENS,
        min_new_tokens=MAX_NEW_TOKENS,  # the correct completion and EOS
        describe="one-line Python functions (3 assert tests)",
    )
