"""Guess the number: a multi-turn episode, the secret in 0-99, at most seven guesses.

The episode as the lab's character model sees it (`rlvr.rollout.episodes.PlainTurns`: each
turn's message contents concatenated, every reply ended by the EOS token):

    guess  00-99\\n  49<EOS>higher 50-99\\n  74<EOS>lower  50-73\\n  61<EOS>correct61-61\\n

The opening is `OPENING`; a reply is the guess (the model writes two digits, `07`; the
environment also takes `7`). The environment answers (`message`) with a word padded to seven
characters, `higher` (the secret is above the guess), `lower`, `invalid` (not a number in
0-99: a guess spent) or `correct` (reward 1, the episode ends), then the interval lo-hi that
all hints so far leave and a newline. Seven guesses without `correct` end the episode with
reward 0 (`MAX_TURNS`). The reward is 1 or 0, never discounted here: `--env.turn-discount`
weights a later success less if a run wants it, and the lab's `sampled_turns_per_success`
shows whether training shortened the games.

Why the interval is in the message: a first version answered the bare words (`higher \\n`),
so the model had to recover the interval from the whole history. The lab's tiny base
(1.2 M parameters, 800 steps of 16 pairs, flaw_prob 0.65) learnt the first three levels of
bisection and then repeated its last guess: 20 % of the 100 secrets greedy, 13 % sampled
(24 % and 19 % after 2,000 steps). With the interval stated, the next guess is a function of
the five characters just before it, and the same base solves 35 % greedy, 25 % sampled.
Every message is 13 characters and every reply 2 plus EOS, so the interval always sits at
the same distance from the guess being written (the fixed-width trick of
`rlvr.tasks.arithmetic`). Seven guesses are exactly what bisection needs for 100 numbers
(2**7 - 1 = 127 >= 100), so a wasted guess early costs some secrets and not others.

Rows and the split: a row carries the secret (`secret`, `answer` its two digits); the
environment reads it from the row and ignores the seed, so the G episodes of a group (one
row) share the secret. `HELD_OUT_SIZE` of the 100 secrets, drawn first from a fixed seed, are
held out (the held-out rows, one per secret); training rows and the corpus use only the
other 70. The skill (bisection) is the same for every secret, so the held-out secrets test
play on games the model was never rewarded on, not a new skill.

Flawed corpus: (conversation so far, next guess) pairs from a noisy bisection player. It
keeps the interval lo..hi and usually guesses its middle, (lo + hi) // 2, but slips
(`slip_rate`: the chance grows with the turn, `flaw_prob` times `TURN_RATES[k]`):
  * "off": a guess off the middle by 1 to a quarter of the interval, still inside it (costs
    little or a guess: the halves become unequal);
  * "ignore": the last hint read the wrong way, the middle of the other side of the last
    guess (a wasted guess: the secret cannot be there).
"off" is the habit after `higher`, "ignore" after `lower` (`HABIT_SHARE` of the slips), the
rest drawn by `_SLIP_WEIGHTS`. At the lab's flaw_prob 0.65 this player wins 58 % of its
games; the base model, an imperfect copy, fewer. The corpus keeps every pair of a game from
turn 2 on and a share of the first two (`KEEP`: the first guesses are nearly always the same,
and the base's few steps are better spent on the later ones).

Measured (`rlvr lab --env guess_number`, defaults, 100 GRPO steps, 10 minutes on 2 shared
cores): held-out greedy 0.367 -> 0.233, sampled 0.221 -> 0.25 (30 secrets, 8 samples each),
training reward 0.27 -> 0.43 at the last step but about 0.3 on average: GRPO does not yet
raise held-out success; the base's failures are systematic (a wrong middle for small
intervals), which sampling rarely escapes.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rlvr.tasks.spec import REPLY_END, Row, TaskSpec, endless_shuffles

NAME = "guess_number"
LOW, HIGH = 0, 99
MAX_TURNS = 7
HINT_WORDS = ("higher", "lower", "invalid", "correct")
"""What the environment says of a guess; its message adds the interval the hints leave."""


def message(word: str, lo: int, hi: int) -> str:
    """The environment's message: the word padded to seven characters, the interval the hints
    so far leave, a newline (`higher 50-99\\n`): every message 13 characters."""
    return f"{word:<7}{lo:02d}-{hi:02d}\n"


OPENING = message("guess", LOW, HIGH)
HINT_CHARS = len(OPENING)
REPLY_CHARS = 2  # a guess as two digits
MAX_NEW_TOKENS = REPLY_CHARS + 2  # one character of slack, then EOS
EPISODE_TOKENS = MAX_TURNS * MAX_NEW_TOKENS + (MAX_TURNS - 1) * HINT_CHARS
HELD_OUT_SIZE = 30
HELD_OUT_SEED = 2468
TURN_RATES = (0.2, 0.35, 0.5, 0.65, 0.8, 0.8, 0.8)
"""Per turn (0-based): the slip chance is flaw_prob times this (capped at 1)."""
SLIPS = ("off", "ignore")
_SLIP_WEIGHTS = {"off": 0.6, "ignore": 0.4}
HABITS = {"higher": "off", "lower": "ignore"}
"""The habitual slip after each hint; the first guess has none (its slips are drawn)."""
HABIT_SHARE = 0.6
KEEP = (0.25, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0)
"""Per turn: the chance the corpus keeps its pair (the first guesses are nearly always the
same; the base's few steps are better spent on the later ones)."""
_GUESS = re.compile(r"\s*(\d{1,2})\s*")


def held_out_secrets() -> list[int]:
    """The `HELD_OUT_SIZE` held-out secrets, drawn from `HELD_OUT_SEED` (sorted)."""
    return sorted(random.Random(HELD_OUT_SEED).sample(range(LOW, HIGH + 1), HELD_OUT_SIZE))


def train_secrets() -> list[int]:
    """The secrets training may use: every one not held out."""
    held = set(held_out_secrets())
    return [s for s in range(LOW, HIGH + 1) if s not in held]


def row(secret: int) -> Row:
    """The row of a game with this secret."""
    return {"prompt": OPENING, "secret": secret, "answer": f"{secret:02d}"}


def parse_guess(reply: str) -> int | None:
    """The number a reply guesses (one or two digits, spaces around allowed), else None."""
    match = _GUESS.fullmatch(reply)
    return int(match.group(1)) if match else None


def hint(secret: int, reply: str) -> str:
    """The hint's word (`HINT_WORDS`) for this reply to this secret."""
    guess = parse_guess(reply)
    if guess is None:
        return "invalid"
    if guess == secret:
        return "correct"
    return "higher" if secret > guess else "lower"


def narrow(lo: int, hi: int, reply: str, word: str) -> tuple[int, int]:
    """The interval lo..hi after `reply` got `word` (unchanged by an invalid guess or one
    outside it)."""
    guess = parse_guess(reply)
    if guess is None or word == "invalid":
        return lo, hi
    if word == "correct":
        return guess, guess
    return (max(lo, guess + 1), hi) if word == "higher" else (lo, min(hi, guess - 1))


class GuessNumberEnv:
    """One game (`rlvr.rollout.episodes.Environment`): the secret from the row."""

    def __init__(self) -> None:
        self.secret: int | None = None
        self.guesses, self.lo, self.hi = 0, LOW, HIGH

    def reset(
        self, row: Mapping[str, Any], *, seed: int
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
        secret = int(row["secret"])
        if not LOW <= secret <= HIGH:
            raise ValueError(f"secret must be in {LOW}-{HIGH}, got {secret}")
        self.secret, self.guesses, self.lo, self.hi = secret, 0, LOW, HIGH
        return [{"role": "user", "content": OPENING}], [], {}

    def step(self, reply: str) -> tuple[list[dict[str, Any]], float, bool, dict[str, Any]]:
        if self.secret is None:
            raise RuntimeError("step before reset")
        self.guesses += 1
        word = hint(self.secret, reply)
        self.lo, self.hi = narrow(self.lo, self.hi, reply, word)
        done = word == "correct" or self.guesses >= MAX_TURNS
        reward = 1.0 if word == "correct" else 0.0
        content = message(word, self.lo, self.hi)
        return [{"role": "user", "content": content}], reward, done, {"hint": word}

    def close(self) -> None:
        pass


# --- the noisy player and its corpus -------------------------------------------------------


def slip_rate(turn: int, flaw_prob: float) -> float:
    """The chance that the player's guess at `turn` (0-based) slips."""
    return min(1.0, flaw_prob * TURN_RATES[turn])


def _slipped(kind: str, lo: int, hi: int, last: tuple[int, str] | None, rng: random.Random) -> int:
    """A slipped guess of `kind` in interval lo..hi after `last` (guess, hint)."""
    middle = (lo + hi) // 2
    if kind == "ignore" and last is not None:
        guess, said = last  # the other side of the last guess: outside lo..hi
        other = (LOW, guess - 1) if said == "higher" else (guess + 1, HIGH)
        if other[0] <= other[1]:
            return (other[0] + other[1]) // 2
    spread = max(1, (hi - lo) // 4)
    candidates = [g for g in range(middle - spread, middle + spread + 1) if lo <= g <= hi]
    candidates = [g for g in candidates if g != middle] or [middle]
    return rng.choice(candidates)


def player_guess(
    lo: int, hi: int, last: tuple[int, str] | None, turn: int, flaw_prob: float, rng: random.Random
) -> int:
    """The noisy bisection player's next guess (module docstring)."""
    if flaw_prob <= 0 or rng.random() >= slip_rate(turn, flaw_prob):
        return (lo + hi) // 2
    habit = HABITS.get(last[1]) if last is not None else None
    if habit is not None and rng.random() < HABIT_SHARE:
        kind = habit
    else:
        kind = rng.choices(SLIPS, weights=[_SLIP_WEIGHTS[k] for k in SLIPS])[0]
    return _slipped(kind, lo, hi, last, rng)


def play(secret: int, flaw_prob: float, rng: random.Random) -> list[int]:
    """The noisy player's guesses in one game, up to `MAX_TURNS` (the last is the secret if
    it won)."""
    lo, hi, last, guesses = LOW, HIGH, None, []
    for turn in range(MAX_TURNS):
        guess = player_guess(lo, hi, last, turn, flaw_prob, rng)
        guesses.append(guess)
        said = hint(secret, f"{guess:02d}")
        if said == "correct":
            break
        lo, hi = narrow(lo, hi, f"{guess:02d}", said)
        last = (guess, said)
    return guesses


def conversation(secret: int, guesses: Sequence[int]) -> list[tuple[str, str]]:
    """(the conversation before each guess as PlainTurns renders it, the guess) per turn."""
    pairs, text, lo, hi = [], OPENING, LOW, HIGH
    for guess in guesses:
        reply = f"{guess:02d}"
        pairs.append((text, reply))
        word = hint(secret, reply)
        lo, hi = narrow(lo, hi, reply, word)
        text += reply + REPLY_END + message(word, lo, hi)
    return pairs


def games(seed: int, flaw_prob: float) -> Iterator[tuple[int, list[int]]]:
    """Endless (secret, the noisy player's guesses) games on the training secrets, seeded."""
    if not 0.0 <= flaw_prob <= 1.0:
        raise ValueError(f"flaw_prob must be in [0, 1], got {flaw_prob}")
    rng = random.Random(f"guess-number-flaws/{seed}")
    for secret in endless_shuffles(train_secrets(), seed):
        yield secret, play(secret, flaw_prob, rng)


def corpus(seed: int, flaw_prob: float) -> Iterator[tuple[str, str]]:
    """Endless (conversation so far, next guess) pairs of `games`, turn k's kept with
    probability `KEEP[k]`."""
    keep = random.Random(f"guess-number-keep/{seed}")
    for secret, guesses in games(seed, flaw_prob):
        for turn, pair in enumerate(conversation(secret, guesses)):
            if keep.random() < KEEP[turn]:
                yield pair


def guess_reward(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any], **kwargs: Any
) -> list[float]:
    """TRL reward function (column `answer`): 1.0 when the final reply guesses the secret."""
    if len(completions) != len(answer):
        raise ValueError(f"{len(completions)} completions but {len(answer)} answers")
    return [score(c, {"answer": a}) for c, a in zip(completions, answer)]


def score(completion: Any, row: Mapping[str, Any]) -> float:
    """1.0 when `completion` (an episode's final reply) guesses the row's secret."""
    guess = parse_guess(str(completion))
    return float(guess is not None and guess == int(row["answer"]))


def task_spec() -> TaskSpec:
    """The guess-the-number environment as a `TaskSpec`."""
    held_out = [row(s) for s in held_out_secrets()]

    def train_rows(seed: int) -> Iterator[Row]:
        return (row(s) for s in endless_shuffles(train_secrets(), seed))

    return TaskSpec(
        name=NAME,
        held_out_rows=lambda: [dict(r) for r in held_out],
        train_rows=train_rows,
        corpus=corpus,
        reward_fn=guess_reward,
        score=score,
        max_new_tokens=MAX_NEW_TOKENS,
        describe="guess a number in 0-99 in 7 tries",
        min_new_tokens=REPLY_CHARS + 1,
        environment=GuessNumberEnv,
        max_turns=MAX_TURNS,
        episode_tokens=EPISODE_TOKENS,
    )
