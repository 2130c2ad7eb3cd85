"""What a trainable task provides: rows, a flawed corpus for a base model, and its verifier.

A task owns its verifier. The lab and `rlvr train --task NAME` need nothing else from it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

Row = dict[str, Any]  # "prompt" plus the columns its reward function reads (e.g. "answer")
P = TypeVar("P")


REPLY_END = "<|endoftext|>"
"""What ends a reply inside a multi-turn corpus's conversation text: the lab's tiny tokenizer's
EOS token (`rlvr.models.tiny.EOS_TOKEN`; tasks do not import models, and a test checks the
two are one), which the character tokenizer keeps whole, as the sampler's EOS id."""


@dataclass(frozen=True)
class TaskSpec:
    """A task, as plain callables and values."""

    name: str
    held_out_rows: Callable[[], list[Row]]
    """The fixed held-out rows (never trained on)."""
    train_rows: Callable[[int], Iterator[Row]]
    """seed -> an endless stream of training rows, none of them held out."""
    corpus: Callable[[int, float], Iterator[tuple[str, str]]]
    """(seed, flaw_prob) -> endless (prompt, completion) pairs for next-token "pretraining";
    a `flaw_prob` share of completions carry a realistic mistake, so the base model solves
    some problems and not others."""
    reward_fn: Callable[..., Sequence[float | None]]
    """The strict verifier in TRL's form: fn(prompts, completions, **columns)."""
    score: Callable[[str, Row], float]
    """The strict verifier on one completion and its row (held-out evaluation)."""
    max_new_tokens: int
    """A completion budget that fits the longest correct completion."""
    describe: str
    """A few words for plots and logs, e.g. "3-digit addition"."""
    min_new_tokens: int = 1
    """The longest correct completion plus EOS: a smaller budget is refused before training."""
    environment: Callable[[], Any] | None = None
    """A multi-turn task's environment factory: one new environment per episode, with
    `reset(row, *, seed)`, `step(reply)` and `close()` (`rlvr.rollout.episodes.Environment`).
    None for a one-turn task. With one, `max_new_tokens` is one reply's budget, the corpus's
    pairs are (the conversation so far as the model sees it, the next reply), the rewards are
    the environment's, and `reward_fn`/`score` grade an episode's final reply."""
    max_turns: int = 1
    """Replies an episode of the environment needs at most (the default `--env.max-turns`)."""
    episode_tokens: int = 0
    """Tokens after the opening prompt an episode needs at most, across its turns (the
    default `--env.max-tokens`; 0 for a one-turn task)."""


def distinct_draws(
    draw: Callable[[random.Random], P], key: Callable[[P], Hashable], count: int, seed: int | str
) -> list[P]:
    """`count` problems from `draw`, distinct by `key`, in draw order: a fixed held-out set."""
    rng = random.Random(seed)
    seen: dict[Hashable, P] = {}
    while len(seen) < count:
        problem = draw(rng)
        seen.setdefault(key(problem), problem)
    return list(seen.values())


def draws_excluding(
    draw: Callable[[random.Random], P],
    key: Callable[[P], Hashable],
    excluded: set[Hashable],
    seed: int | str,
) -> Iterator[P]:
    """An endless seeded stream from `draw`, skipping problems whose key is in `excluded`."""
    rng = random.Random(seed)
    while True:
        problem = draw(rng)
        if key(problem) not in excluded:
            yield problem


def endless_shuffles(rows: Sequence[Row], seed: int) -> Iterator[Row]:
    """Endless passes over `rows`, each pass in a fresh order drawn from one seeded stream."""
    order = random.Random(seed)
    while True:
        shuffled = list(rows)
        order.shuffle(shuffled)
        yield from shuffled
