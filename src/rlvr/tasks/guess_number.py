"""Guess the number: a multi-turn episode, the secret in an interval of 0-99, at most seven
guesses.

The episode as the lab's character model sees it (`rlvr.rollout.episodes.PlainTurns`: each
turn's message contents concatenated, every reply ended by the EOS token):

    guess  17-98\\n  57<EOS>higher 58-98\\n  78<EOS>lower  58-77\\n  67<EOS>correct67-67\\n

The opening states the game's interval (`message("guess", lo, hi)`, 40 to 100 numbers wide;
`OPENING` is the whole 00-99); a reply is the guess (the model writes two digits, `07`; the
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

Rows and the split: a row carries the opening interval (`lo`, `hi`) and the secret inside it
(`secret`, `answer` its two digits); the environment reads them from the row and ignores the
seed, so the G episodes of a group (one row) play one game. `HELD_OUT_SIZE` (100) games,
distinct (interval, secret) triples drawn first from a fixed seed, are held out; training
rows and the corpus draw other games, on every secret. An earlier split held out 30 of the
100 secrets with every game opened on 00-99: GRPO then raised the training reward (0.19 ->
0.30 over 150 steps) while held-out success fell (greedy 0.33 -> 0.17), because a number that
training never rewards is one the policy learns not to guess. Held out by game, every number
pays in training, and the held-out games test bisection from openings never played.

Flawed corpus: (conversation so far, next guess) pairs from a noisy bisection player. It
keeps the interval lo..hi and usually guesses its middle, (lo + hi) // 2, but slips
(`slip_rate`: the chance grows with the turn, `flaw_prob` times `TURN_RATES[k]`):
  * "off": a guess off the middle by 1 to a quarter of the interval, still inside it (costs
    little or a guess: the halves become unequal);
  * "ignore": the last hint read the wrong way, the middle of the other side of the last
    guess (a wasted guess: the secret cannot be there).
"off" is the habit after `higher`, "ignore" after `lower` (`HABIT_SHARE` of the slips), the
rest drawn by `_SLIP_WEIGHTS`. At the lab's flaw_prob 0.65 this player wins 71 % of the
held-out games (58 % of those opened on 00-99); the base model, an imperfect copy, fewer. The
corpus keeps every pair of a game from turn 1 on and half of the first (`KEEP`: a first guess
is the opening's middle, the easiest).

Measured (`rlvr lab --env guess_number --base.steps 1600 --grpo.lr 3e-4 --env.turn-discount
0.9 --grpo.steps 150`, 11 minutes on 2 shared cores): held-out greedy 0.150 -> 0.110, sampled
0.229 -> 0.212 (100 games), training reward flat at about 0.18: GRPO does not raise success
here. The base bisects its opening interval but computes the middles of later, arbitrary
intervals badly (two-digit halving is arithmetic the 1.2 M-parameter model learnt only
roughly), and a win is then mostly a lucky guess, which gives the update little to follow.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from rlvr.tasks.spec import REPLY_END, Row, TaskSpec, distinct_draws, draws_excluding

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
HELD_OUT_SIZE = 100
HELD_OUT_SEED = 2468
MIN_WIDTH = 40
"""An opening interval holds MIN_WIDTH to 100 numbers (seven guesses bisect up to 127)."""
TURN_RATES = (0.2, 0.35, 0.5, 0.65, 0.8, 0.8, 0.8)
"""Per turn (0-based): the slip chance is flaw_prob times this (capped at 1)."""
SLIPS = ("off", "ignore")
_SLIP_WEIGHTS = {"off": 0.6, "ignore": 0.4}
HABITS = {"higher": "off", "lower": "ignore"}
"""The habitual slip after each hint; the first guess has none (its slips are drawn)."""
HABIT_SHARE = 0.6
KEEP = (0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
"""Per turn: the chance the corpus keeps its pair (a first guess is the opening's middle, the
easiest; the base's few steps are better spent on the later ones)."""
_GUESS = re.compile(r"\s*(\d{1,2})\s*")


@dataclass(frozen=True)
class Game:
    """A game's opening interval lo..hi and its secret, inside it."""

    lo: int
    hi: int
    secret: int


def _draw(rng: random.Random) -> Game:
    width = rng.randint(MIN_WIDTH, HIGH - LOW + 1)
    lo = rng.randint(LOW, HIGH + 1 - width)
    return Game(lo, lo + width - 1, rng.randint(lo, lo + width - 1))


def held_out_games() -> list[Game]:
    """The `HELD_OUT_SIZE` held-out games (distinct openings and secrets), from
    `HELD_OUT_SEED`."""
    return distinct_draws(_draw, attrgetter("lo", "hi", "secret"), HELD_OUT_SIZE, HELD_OUT_SEED)


def train_games(seed: int | str) -> Iterator[Game]:
    """An endless seeded stream of games, none of them a held-out one."""
    excluded = {(g.lo, g.hi, g.secret) for g in held_out_games()}
    return draws_excluding(_draw, attrgetter("lo", "hi", "secret"), excluded, seed)


def row(secret: int, lo: int = LOW, hi: int = HIGH) -> Row:
    """The row of a game with this secret, opened on lo..hi."""
    return {
        "prompt": message("guess", lo, hi),
        "secret": secret,
        "lo": lo,
        "hi": hi,
        "answer": f"{secret:02d}",
    }


def game_row(game: Game) -> Row:
    return row(game.secret, game.lo, game.hi)


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
        secret, lo, hi = int(row["secret"]), int(row.get("lo", LOW)), int(row.get("hi", HIGH))
        if not LOW <= lo <= secret <= hi <= HIGH:
            raise ValueError(
                f"a game needs {LOW} <= lo <= secret <= hi <= {HIGH}, got lo {lo}, "
                f"secret {secret}, hi {hi}"
            )
        self.secret, self.guesses, self.lo, self.hi = secret, 0, lo, hi
        return [{"role": "user", "content": message("guess", lo, hi)}], [], {}

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


def _slipped(
    kind: str,
    lo: int,
    hi: int,
    last: tuple[int, str] | None,
    rng: random.Random,
    bounds: tuple[int, int] = (LOW, HIGH),
) -> int:
    """A slipped guess of `kind` in interval lo..hi after `last` (guess, hint), in a game
    opened on `bounds`."""
    middle = (lo + hi) // 2
    if kind == "ignore" and last is not None:
        guess, said = last  # the other side of the last guess: outside lo..hi
        other = (bounds[0], guess - 1) if said == "higher" else (guess + 1, bounds[1])
        if other[0] <= other[1]:
            return (other[0] + other[1]) // 2
    spread = max(1, (hi - lo) // 4)
    candidates = [g for g in range(middle - spread, middle + spread + 1) if lo <= g <= hi]
    candidates = [g for g in candidates if g != middle] or [middle]
    return rng.choice(candidates)


def player_guess(
    lo: int,
    hi: int,
    last: tuple[int, str] | None,
    turn: int,
    flaw_prob: float,
    rng: random.Random,
    bounds: tuple[int, int] = (LOW, HIGH),
) -> int:
    """The noisy bisection player's next guess (module docstring) in a game opened on
    `bounds`."""
    if flaw_prob <= 0 or rng.random() >= slip_rate(turn, flaw_prob):
        return (lo + hi) // 2
    habit = HABITS.get(last[1]) if last is not None else None
    if habit is not None and rng.random() < HABIT_SHARE:
        kind = habit
    else:
        kind = rng.choices(SLIPS, weights=[_SLIP_WEIGHTS[k] for k in SLIPS])[0]
    return _slipped(kind, lo, hi, last, rng, bounds)


def play(
    secret: int, flaw_prob: float, rng: random.Random, lo: int = LOW, hi: int = HIGH
) -> list[int]:
    """The noisy player's guesses in one game opened on lo..hi, up to `MAX_TURNS` (the last
    is the secret if it won)."""
    bounds, last, guesses = (lo, hi), None, []
    for turn in range(MAX_TURNS):
        guess = player_guess(lo, hi, last, turn, flaw_prob, rng, bounds)
        guesses.append(guess)
        said = hint(secret, f"{guess:02d}")
        if said == "correct":
            break
        lo, hi = narrow(lo, hi, f"{guess:02d}", said)
        last = (guess, said)
    return guesses


def conversation(
    secret: int, guesses: Sequence[int], lo: int = LOW, hi: int = HIGH
) -> list[tuple[str, str]]:
    """(the conversation before each guess as PlainTurns renders it, the guess) per turn of a
    game opened on lo..hi."""
    pairs, text = [], message("guess", lo, hi)
    for guess in guesses:
        reply = f"{guess:02d}"
        pairs.append((text, reply))
        word = hint(secret, reply)
        lo, hi = narrow(lo, hi, reply, word)
        text += reply + REPLY_END + message(word, lo, hi)
    return pairs


def games(seed: int, flaw_prob: float) -> Iterator[tuple[Game, list[int]]]:
    """Endless (game, the noisy player's guesses) on training games, seeded."""
    if not 0.0 <= flaw_prob <= 1.0:
        raise ValueError(f"flaw_prob must be in [0, 1], got {flaw_prob}")
    rng = random.Random(f"guess-number-flaws/{seed}")
    for game in train_games(f"guess-number-corpus/{seed}"):
        yield game, play(game.secret, flaw_prob, rng, game.lo, game.hi)


def corpus(seed: int, flaw_prob: float) -> Iterator[tuple[str, str]]:
    """Endless (conversation so far, next guess) pairs of `games`, turn k's kept with
    probability `KEEP[k]`."""
    keep = random.Random(f"guess-number-keep/{seed}")
    for game, guesses in games(seed, flaw_prob):
        for turn, pair in enumerate(conversation(game.secret, guesses, game.lo, game.hi)):
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
    held_out = [game_row(g) for g in held_out_games()]

    def train_rows(seed: int) -> Iterator[Row]:
        return (game_row(g) for g in train_games(f"guess-number-train/{seed}"))

    return TaskSpec(
        name=NAME,
        held_out_rows=lambda: [dict(r) for r in held_out],
        train_rows=train_rows,
        corpus=corpus,
        reward_fn=guess_reward,
        score=score,
        max_new_tokens=MAX_NEW_TOKENS,
        describe="guess a number in an interval of 0-99 in 7 tries",
        min_new_tokens=REPLY_CHARS + 1,
        environment=GuessNumberEnv,
        max_turns=MAX_TURNS,
        episode_tokens=EPISODE_TOKENS,
    )
