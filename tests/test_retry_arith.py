"""The retry_arith environment: rewards GAMMA**try, the retry message, the split, the corpus
of attempts, and the corpus's prompts against what the episode loop renders."""

from __future__ import annotations

import itertools
import random

import pytest

from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer
from rlvr.pipelines.base_model import check_shape
from rlvr.rollout.episodes import EpisodeLimits, PlainTurns, run_episodes
from rlvr.tasks import arithmetic
from rlvr.tasks import retry_arith as ra
from rlvr.tasks.arithmetic import Problem

TOKENIZER = build_char_tokenizer()
ROW = {"prompt": "357+468=", "answer": "825"}
RIGHT = "7+8+0=15 5+6+1=12 3+4+1=08 #### 825"
WRONG = "7+8+0=15 5+6+0=11 3+4+1=08 #### 815"  # the middle carry dropped


class ScriptedEngine:
    """Replays fixed replies (one script per episode, in order) and records its prompts."""

    def __init__(self, scripts: list[list[str]]) -> None:
        self.scripts = [list(s) for s in scripts]
        self.prompts: list[list[list[int]]] = [[] for _ in scripts]

    def generate_tokens(self, prompts, max_new_tokens, temperature, generator=None, **_):
        out = []
        running = [i for i, s in enumerate(self.scripts) if s]
        assert len(running) == len(prompts)
        for i, prompt in zip(running, prompts):
            self.prompts[i].append(list(prompt))
            ids = TOKENIZER(self.scripts[i].pop(0), add_special_tokens=False)["input_ids"]
            ids = ids + [TOKENIZER.eos_token_id]
            out.append((ids, [0.0] * len(ids)))
        return out


def run(scripts: list[list[str]], rows, group_size: int = 1):
    engine = ScriptedEngine(scripts)
    limits = EpisodeLimits(
        max_turns=ra.MAX_TRIES, max_tokens=ra.EPISODE_TOKENS, max_reply_tokens=ra.MAX_NEW_TOKENS
    )
    episodes = run_episodes(
        engine,
        PlainTurns(TOKENIZER),
        ra.RetryArithEnv,
        rows,
        list(range(len(rows))),
        group_size,
        limits,
        1.0,
        None,
        TOKENIZER.decode,
        TOKENIZER.eos_token_id,
    )
    return episodes, engine


def test_env_by_hand():
    env = ra.RetryArithEnv()
    assert env.reset(ROW, seed=3) == ([{"role": "user", "content": "357+468="}], [], {})
    retry = [{"role": "user", "content": "wrong, try again\n"}]
    assert env.step(WRONG) == (retry, 0.0, False, {"tries": 1})
    assert env.step(RIGHT) == ([], 0.5, True, {"tries": 2})
    env.reset(ROW, seed=3)
    assert env.step(RIGHT)[1:3] == (1.0, True)
    env.reset(ROW, seed=3)
    assert [env.step(WRONG)[1:3] for _ in range(3)] == [(0.0, False), (0.0, False), (0.0, True)]
    env.reset(ROW, seed=3)
    env.step("#### 825 or 815")  # a hedge: the strict verifier says no
    env.step("825")  # no marker: no
    assert env.step(RIGHT)[1:3] == (0.25, True)


def test_returns_through_the_loop():
    scripts = [[RIGHT], [WRONG, RIGHT], [WRONG, WRONG, RIGHT], [WRONG] * 3]
    episodes, _ = run(scripts, [ROW], group_size=4)
    assert [e.episode_return(1.0) for e in episodes] == [1.0, 0.5, 0.25, 0.0]
    assert [len(e.replies) for e in episodes] == [1, 2, 3, 3]
    assert [e.status for e in episodes] == ["done"] * 4
    assert ra.GAMMA == 0.5


def test_attempts_by_hand():
    problem = Problem(357, 468, "+")
    assert ra.attempts(problem, 0.0, random.Random(0)) == [RIGHT]
    # every carry dropped at the first try; a retry drops each with probability 1 * 0.5
    tries = ra.attempts(problem, 1.0, random.Random(0))
    assert tries[0] == "7+8+0=15 5+6+0=11 3+4+0=07 #### 715"
    assert 1 <= len(tries) <= 3 and (tries[-1].endswith(" 825") or len(tries) == 3)
    assert all(not t.endswith(" 825") for t in tries[:-1])  # attempts stop at the first right one


def test_retries_fix_more_often_than_first_tries():
    rng = random.Random(0)
    problems = list(itertools.islice(arithmetic.train_problems(ra.CONFIG, 0), 400))
    runs = [ra.attempts(p, 0.65, rng) for p in problems]
    first = sum(len(r) == 1 for r in runs) / len(runs)
    solved = sum(r[-1].endswith(f" {p.answer}") for p, r in zip(problems, runs)) / len(runs)
    assert 0.2 < first < 0.8 and first + 0.1 < solved < 1.0


def test_corpus_seeded_disjoint_and_rendered_as_the_loop_renders():
    pairs = list(itertools.islice(ra.corpus(5, 0.65), 120))
    assert pairs == list(itertools.islice(ra.corpus(5, 0.65), 120))
    assert pairs != list(itertools.islice(ra.corpus(6, 0.65), 120))
    held = {r["prompt"] for r in ra.task_spec().held_out_rows()}
    episodes_pairs, start = [], 0
    for i in range(1, len(pairs) + 1):  # an episode starts where the prompt is a bare problem
        if i == len(pairs) or pairs[i][0].endswith("="):
            episodes_pairs.append(pairs[start:i])
            start = i
    assert any(len(e) == 3 for e in episodes_pairs) and any(len(e) == 1 for e in episodes_pairs)
    problems = [e[0][0] for e in episodes_pairs]
    assert held.isdisjoint(problems)
    rows = [{"prompt": p, "answer": str(sum(map(int, p[:-1].split("+"))))} for p in problems]
    episodes, engine = run([[reply for _, reply in e] for e in episodes_pairs], rows)
    for pairs_of_one, seen, episode, row in zip(episodes_pairs, engine.prompts, episodes, rows):
        assert [ids for ids in seen] == [TOKENIZER(p)["input_ids"] for p, _ in pairs_of_one]
        right = ra.is_correct(pairs_of_one[-1][1], row)
        assert episode.episode_return(1.0) == (ra.GAMMA ** (len(pairs_of_one) - 1) if right else 0)
    with pytest.raises(ValueError, match="flaw_prob"):
        next(ra.corpus(0, -0.1))


def test_split_and_rows_are_arithmetics():
    spec = ra.task_spec()
    held = spec.held_out_rows()
    assert held == arithmetic.rows(arithmetic.held_out_problems(ra.CONFIG))
    prompts = {r["prompt"] for r in held}
    train = list(itertools.islice(spec.train_rows(1), 300))
    assert prompts.isdisjoint(r["prompt"] for r in train)
    assert train == list(itertools.islice(spec.train_rows(1), 300))


def test_score_and_reward_fn_are_the_strict_verifier():
    spec = ra.task_spec()
    assert spec.score(RIGHT, ROW) == 1.0 and spec.score(WRONG, ROW) == 0.0
    assert spec.score("#### 825 or 815", ROW) == 0.0
    assert spec.reward_fn([ROW["prompt"]] * 2, [RIGHT, WRONG], answer=["825", "825"]) == [1, 0]


def test_budgets_fit_the_tiny_model():
    spec = ra.task_spec()
    assert spec.max_new_tokens == 48 and spec.min_new_tokens == 37
    assert spec.episode_tokens == 3 * 48 + 2 * 17
    check_shape(spec, TinyModelConfig(), spec.episode_tokens)  # 8 + 178 + 2 <= 256
