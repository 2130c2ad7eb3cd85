"""`tool_chain`: two chained calculator calls, then the answer; the corpus is what the loop
renders, flawed episodes score 0, the split is disjoint."""

from __future__ import annotations

import itertools
import random

import torch

from rlvr.models.tiny import build_char_tokenizer
from rlvr.rollout.episodes import EpisodeLimits, PlainTurns, run_episodes
from rlvr.tasks import tool_chain
from rlvr.tasks.tool_chain import Chain
from tests.helpers import ScriptedEngine

TOKENIZER = build_char_tokenizer()


def play(chain: Chain, replies: list[str]):
    spec = tool_chain.task_spec()
    engine = ScriptedEngine(TOKENIZER, replies)
    (episode,) = run_episodes(
        engine,
        PlainTurns(TOKENIZER),
        spec.environment,
        [tool_chain.row(chain)],
        [0],
        1,
        EpisodeLimits(spec.max_turns, spec.episode_tokens, spec.max_new_tokens),
        1.0,
        torch.Generator().manual_seed(0),
        TOKENIZER.decode,
        TOKENIZER.eos_token_id,
    )
    return episode, engine


def test_a_correct_episode_scores_one():
    chain = Chain("sum", 17, 25, 3)
    assert chain.prompt == "increase 17 by 25, then multiply by 3\n" and chain.answer == 126
    replies = [tool_chain.call("sum", 17, 25), tool_chain.call("mul", 42, 3), "#### 126"]
    e, _ = play(chain, replies)
    assert e.status == "done" and e.episode_return(1.0) == 1.0 and e.counts["tool_calls"] == 2
    text = TOKENIZER.decode(e.ids)
    assert (
        text
        == f"{replies[0]}<|endoftext|>=042\n{replies[1]}<|endoftext|>=126\n#### 126<|endoftext|>"
    )
    assert len(e.ids) <= tool_chain.EPISODE_TOKENS


def test_the_corpus_is_what_the_loop_renders():
    """Each corpus prompt equals the ids the engine is prompted with when the loop replays the
    corpus's replies (flawed ones included: the tools return what the flawed call computes)."""
    pairs = tool_chain.corpus(3, 0.65)
    for _ in range(30):
        episode_pairs = list(itertools.islice(pairs, 3))
        prompt = episode_pairs[0][0]
        op = "sum" if prompt.startswith("increase") else "sub"
        a, b, k = (int(w.strip(",\n")) for w in prompt.split() if w.strip(",\n").isdigit())
        chain = Chain(op, a, b, k)
        e, engine = play(chain, [reply for _, reply in episode_pairs])
        for (seen, _), ids in zip(episode_pairs, engine.prompts, strict=True):
            assert ids == [TOKENIZER(seen)["input_ids"]]
        final = episode_pairs[-1][1]
        assert e.episode_return(1.0) == tool_chain.score(final, tool_chain.row(chain))


def test_flawed_episodes_score_zero_and_most_succeed():
    rng, wins, total = random.Random(0), 0, 1000
    for chain in itertools.islice(tool_chain.train_chains(0), total):
        replies, _ = tool_chain.episode_replies(chain, rng, 0.65)
        clean, _ = tool_chain.episode_replies(chain, random.Random(1), 0.0)
        won = tool_chain.score(replies[-1], tool_chain.row(chain))
        assert won == float(replies == clean)  # a slip anywhere makes the answer wrong
        wins += won
    assert 0.5 < wins / total < 0.7  # (1 - 0.65 / 4) ** 3 = 0.59


def test_split_is_disjoint_and_seeded():
    held = {(c.op, c.a, c.b, c.k) for c in tool_chain.held_out_chains()}
    assert len(held) == tool_chain.HELD_OUT_SIZE
    train = list(itertools.islice(tool_chain.train_chains(5), 2000))
    assert not held & {(c.op, c.a, c.b, c.k) for c in train}
    assert train[:50] == list(itertools.islice(tool_chain.train_chains(5), 50))
    assert all(10 <= c.first <= 99 for c in train)


def test_the_verifier_grades_the_final_reply():
    row = {"answer": "126"}
    assert tool_chain.score("#### 126", row) == 1.0
    assert tool_chain.score("#### 125", row) == 0.0
    assert tool_chain.score("126", row) == 0.0
    assert tool_chain.reward_fn(["p", "p"], ["#### 126", "#### 1"], ["126", "126"]) == [1.0, 0.0]
