"""The guess_number environment: hints, rewards, the split, the noisy player's corpus, and the
corpus's prompts against what the episode loop renders."""

from __future__ import annotations

import itertools
import random

import pytest

from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer
from rlvr.pipelines.base_model import check_shape
from rlvr.rollout.episodes import EpisodeLimits, PlainTurns, run_episodes
from rlvr.tasks import guess_number as gn

TOKENIZER = build_char_tokenizer()


class ScriptedEngine:
    """Replays fixed replies (one script per episode, in order) and records its prompts."""

    def __init__(self, scripts: list[list[str]]) -> None:
        self.scripts = [list(s) for s in scripts]
        self.prompts: list[list[list[int]]] = [[] for _ in scripts]
        self.calls = 0

    def generate_tokens(self, prompts, max_new_tokens, temperature, generator=None, **_):
        out = []
        running = [i for i, s in enumerate(self.scripts) if s]
        assert len(running) == len(prompts)
        for i, prompt in zip(running, prompts):
            self.prompts[i].append(list(prompt))
            reply = self.scripts[i].pop(0)
            ids = TOKENIZER(reply, add_special_tokens=False)["input_ids"]
            ids = ids + [TOKENIZER.eos_token_id]
            out.append((ids, [0.0] * len(ids)))
        self.calls += 1
        return out


def run(scripts: list[list[str]], rows, group_size: int = 1, factory=gn.GuessNumberEnv):
    engine = ScriptedEngine(scripts)
    limits = EpisodeLimits(
        max_turns=gn.MAX_TURNS,
        max_tokens=gn.EPISODE_TOKENS,
        max_reply_tokens=gn.MAX_NEW_TOKENS,
    )
    episodes = run_episodes(
        engine,
        PlainTurns(TOKENIZER),
        factory,
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


def test_hints_and_reward_by_hand():
    env = gn.GuessNumberEnv()
    messages, tools, _ = env.reset(gn.row(37), seed=5)
    assert messages == [{"role": "user", "content": "guess  00-99\n"}] and tools == []
    lower = [{"role": "user", "content": "lower  00-48\n"}]
    assert env.step("49") == (lower, 0.0, False, {"hint": "lower"})
    assert env.step("20")[0][0]["content"] == "higher 21-48\n"
    assert env.step("60")[0][0]["content"] == "lower  21-48\n"  # outside: nothing learnt
    assert env.step("x7")[:3] == ([{"role": "user", "content": "invalid21-48\n"}], 0.0, False)
    assert env.step("123")[0][0]["content"] == "invalid21-48\n"  # three digits: not 0-99
    assert env.step(" 37 ")[1:3] == (1.0, True)
    assert {len(gn.message(w, 3, 45)) for w in gn.HINT_WORDS} == {len(gn.OPENING)} == {13}


def test_seven_guesses_end_the_game_unsolved():
    env = gn.GuessNumberEnv()
    env.reset(gn.row(0), seed=0)
    results = [env.step(f"{g:02d}") for g in (50, 40, 30, 20, 10, 5)]
    assert all(not done and reward == 0.0 for _, reward, done, _ in results)
    _, reward, done, info = env.step("01")
    assert (reward, done, info["hint"]) == (0.0, True, "lower")
    env.reset(gn.row(0), seed=0)  # a reset starts a new game
    assert env.step("00")[1:3] == (1.0, True)


def test_max_turns_through_the_loop():
    episodes, _ = run([["50"] * 9], [gn.row(3)])
    (e,) = episodes
    assert len(e.replies) == 7 and e.status == "done" and e.episode_return(1.0) == 0.0


def test_bad_secret_is_an_error_episode():
    episodes, _ = run([["50"]], [{"prompt": gn.OPENING, "secret": 100, "answer": "100"}])
    assert episodes[0].status == "error" and "lo <= secret <= hi" in episodes[0].info["error"]
    outside = [{**gn.row(30, 40, 80), "secret": 20}]  # a secret outside its opening
    episodes, _ = run([["50"]], outside)
    assert episodes[0].status == "error" and "secret 20" in episodes[0].info["error"]


def test_a_game_opens_on_its_interval_and_narrows_within_it():
    env = gn.GuessNumberEnv()
    messages, _, _ = env.reset(gn.row(57, 40, 80), seed=0)
    assert messages[0]["content"] == "guess  40-80\n"
    assert env.step("60")[0][0]["content"] == "lower  40-59\n"
    assert env.step("50")[0][0]["content"] == "higher 51-59\n"
    assert gn.play(57, 0.0, random.Random(0), 40, 80) == [60, 49, 54, 57]


def test_perfect_bisection_by_hand_and_always_within_seven():
    assert gn.play(37, 0.0, random.Random(0)) == [49, 24, 36, 42, 39, 37]
    for secret in range(100):
        guesses = gn.play(secret, 0.0, random.Random(0))
        assert guesses[-1] == secret and len(guesses) <= 7


def test_narrow_by_hand():
    assert gn.narrow(0, 99, "49", "higher") == (50, 99)
    assert gn.narrow(50, 99, "74", "lower") == (50, 73)
    assert gn.narrow(50, 73, "20", "higher") == (50, 73)  # a wasted guess
    assert gn.narrow(50, 73, "ab", "invalid") == (50, 73)
    assert gn.narrow(50, 73, "61", "correct") == (61, 61)


def test_slips_by_hand():
    rng = random.Random(0)
    assert gn._slipped("ignore", 50, 99, (49, "higher"), rng) == 24  # the middle of 0..48
    assert gn._slipped("ignore", 0, 48, (49, "lower"), rng) == 74  # the middle of 50..99
    offs = {gn._slipped("off", 0, 99, None, rng) for _ in range(300)}
    assert 49 not in offs and min(offs) >= 25 and max(offs) <= 73
    assert gn.slip_rate(0, 0.65) == pytest.approx(0.13) and gn.slip_rate(6, 1.0) == 0.8


def test_noisy_player_wins_some_games():
    rng = random.Random(1)
    wins = [gn.play(s, 0.65, rng)[-1] == s for s in range(100) for _ in range(10)]
    assert 0.3 < sum(wins) / len(wins) < 0.7
    games = gn.held_out_games()  # narrower openings: more wins, still not all
    wins = [gn.play(g.secret, 0.65, rng, g.lo, g.hi)[-1] == g.secret for g in games]
    assert 0.5 < sum(wins) / len(wins) < 0.9
    assert all(gn.play(g.secret, 0.0, rng, g.lo, g.hi)[-1] == g.secret for g in games)


def test_split_is_disjoint_and_fixed():
    """Held out by game (opening interval and secret), not by secret: every secret is
    trained on, so no number is one training never rewards (a split by secret taught the
    policy to avoid the held-out numbers)."""
    held = gn.held_out_games()
    assert len(held) == gn.HELD_OUT_SIZE == len({(g.lo, g.hi, g.secret) for g in held})
    for g in held:
        assert 0 <= g.lo <= g.secret <= g.hi <= 99 and g.hi - g.lo + 1 >= gn.MIN_WIDTH
    spec = gn.task_spec()
    assert [r["secret"] for r in spec.held_out_rows()] == [g.secret for g in held]
    rows = list(itertools.islice(spec.train_rows(3), 2000))
    keys = {(g.lo, g.hi, g.secret) for g in held}
    assert not {(r["lo"], r["hi"], r["secret"]) for r in rows} & keys
    assert len({r["secret"] for r in rows}) >= 98  # every number is trained on (edges rarer)
    assert rows == list(itertools.islice(spec.train_rows(3), 2000))
    assert rows != list(itertools.islice(spec.train_rows(4), 2000))


def test_games_and_corpus_seeded_on_training_games():
    games = list(itertools.islice(gn.games(7, 0.65), 150))
    assert games == list(itertools.islice(gn.games(7, 0.65), 150))
    assert games != list(itertools.islice(gn.games(8, 0.65), 150))
    held = {(g.lo, g.hi, g.secret) for g in gn.held_out_games()}
    for game, guesses in games:
        assert (game.lo, game.hi, game.secret) not in held
        assert guesses[-1] == game.secret or len(guesses) == 7
        assert game.secret not in guesses[:-1] and all(0 <= g <= 99 for g in guesses)
    # the corpus: the games' pairs in order, a share of the first turn left out
    everything = [
        pair for g, guesses in games for pair in gn.conversation(g.secret, guesses, g.lo, g.hi)
    ]
    pairs = list(itertools.islice(gn.corpus(7, 0.65), 300))
    assert pairs == list(itertools.islice(gn.corpus(7, 0.65), 300))
    rest = iter(everything)
    assert all(any(pair == other for other in rest) for pair in pairs)  # a subsequence
    openings = sum(prompt.count("\n") == 1 for prompt, _ in pairs)
    assert 0.2 * 70 < openings < 0.8 * 70  # KEEP[0] = 0.5 of the ~70 games these pairs span
    assert all(len(r) == 2 and r.isdigit() for _, r in pairs)
    with pytest.raises(ValueError, match="flaw_prob"):
        next(gn.corpus(0, 1.5))


def test_corpus_prompts_are_what_the_loop_renders():
    games = list(itertools.islice(gn.games(0, 0.65), 40))
    conversations = [gn.conversation(g.secret, guesses, g.lo, g.hi) for g, guesses in games]
    rows = [gn.game_row(g) for g, _ in games]
    episodes, engine = run([[r for _, r in c] for c in conversations], rows)
    assert any(len(c) >= 6 for c in conversations)
    for pairs, seen, episode, row in zip(conversations, engine.prompts, episodes, rows):
        assert seen == [TOKENIZER(prompt)["input_ids"] for prompt, _ in pairs]
        assert episode.replies == [r for _, r in pairs]
        assert episode.episode_return(1.0) == float(int(pairs[-1][1]) == row["secret"])


def test_a_group_shares_the_secret():
    made = []

    def factory():
        made.append(gn.GuessNumberEnv())
        return made[-1]

    scripts = [["49", "24", "36", "42", "39", "37"], ["37"], ["50", "37"], ["12"] * 7]
    episodes, _ = run(scripts, [gn.row(37)], group_size=4, factory=factory)
    assert [env.secret for env in made] == [37] * 4
    assert [len(e.replies) for e in episodes] == [6, 1, 2, 7]
    assert [e.episode_return(1.0) for e in episodes] == [1.0, 1.0, 1.0, 0.0]
    assert episodes[0].episode_return(0.9) == pytest.approx(0.9**5)


def test_score_and_reward_fn():
    spec = gn.task_spec()
    assert spec.score("37", {"answer": "37"}) == 1.0
    assert spec.score("07", {"answer": "07"}) == spec.score("7", {"answer": "07"}) == 1.0
    assert spec.score("38", {"answer": "37"}) == spec.score("", {"answer": "37"}) == 0.0
    assert spec.reward_fn(["p", "p"], ["05", "50"], answer=["05", "05"]) == [1.0, 0.0]


def test_budgets_fit_the_tiny_model():
    spec = gn.task_spec()
    assert spec.max_turns == 7 and spec.environment is gn.GuessNumberEnv
    assert spec.episode_tokens == 7 * 4 + 6 * 13
    check_shape(spec, TinyModelConfig(), spec.episode_tokens)
