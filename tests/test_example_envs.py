"""The example environments for chat models (`examples/envs/`): loaded as `--env FILE.py:NAME`
is, their openings, rows and rewards, through a ChatML-like template."""

from __future__ import annotations

from pathlib import Path

import torch

from rlvr.models.tiny import build_char_tokenizer
from rlvr.rollout.episodes import ChatTemplateTurns, EpisodeLimits, run_episodes
from rlvr.tasks import tool_chain
from rlvr.tasks.env_files import load_environment, user_env_task
from tests.helpers import ScriptedEngine

EXAMPLES = Path(__file__).parents[1] / "examples" / "envs"
CHATML = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|endoftext|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def chat_episode(spec: str, replies: list[str], row: dict) -> tuple:
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = CHATML
    engine = ScriptedEngine(tokenizer, replies)
    (episode,) = run_episodes(
        engine,
        ChatTemplateTurns(tokenizer),
        load_environment(spec),
        [row],
        [0],
        1,
        EpisodeLimits(max_turns=3, max_tokens=400, max_reply_tokens=60),
        1.0,
        torch.Generator().manual_seed(0),
        tokenizer.decode,
        tokenizer.eos_token_id,
    )
    return episode, tokenizer.decode(engine.prompts[0][0])


def test_chat_retry_arith_opens_with_two_solved_problems_and_discounts_a_retry():
    spec = f"{EXAMPLES / 'chat_retry_arith.py'}:ENV"
    task = user_env_task(spec, None)
    held_out = task.held_out_rows()
    assert len(held_out) == 200 and held_out[0]["prompt"].startswith("What is ")
    train = [row for row, _ in zip(task.train_rows(0), range(50))]
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}
    assert task.max_turns == 3
    row = {"prompt": "What is 83+48?", "answer": "131"}
    episode, opening = chat_episode(spec, ["83+48 = 121\n#### 121", "83+48 = 131\n#### 131"], row)
    assert opening.count("<|user|>") == 3 and opening.count("<|assistant|>") == 3
    assert "27+58 = 85\n#### 85" in opening and opening.endswith(
        "What is 83+48?<|endoftext|>\n<|assistant|>"
    )
    assert episode.status == "done" and episode.replies[-1].endswith("131")
    assert episode.episode_return(1.0) == 0.5  # right at the second try


def test_chat_tool_chain_shows_the_format_and_grades_the_chain():
    spec = f"{EXAMPLES / 'chat_tool_chain.py'}:ENV"
    chain = tool_chain.held_out_chains()[0]
    replies = [
        tool_chain.call(chain.op, chain.a, chain.b),
        tool_chain.call("mul", chain.first, chain.k),
        tool_chain.answer_text(chain.answer),
    ]
    episode, opening = chat_episode(spec, replies, tool_chain.row(chain))
    assert opening.startswith("<|system|>You solve two-step arithmetic") and "=128" in opening
    assert episode.status == "done" and episode.episode_return(1.0) == 1.0
    assert episode.counts["tool_calls"] == 2
    assert user_env_task(spec, None).held_out_rows()[0] == tool_chain.row(chain)
