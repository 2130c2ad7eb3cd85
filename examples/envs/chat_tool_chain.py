"""`tool_chain` for a chat model: the same chains, tools, tool messages and reward, opened with
a system message that names the tools and the call format, and one worked episode.

    rlvr train grpo --model "$MODEL" --env examples/envs/chat_tool_chain.py:ENV ...

The built-in `tool_chain` opens with the bare problem ("increase 17 by 25, then multiply by
3"): the lab's character model learns the call format from its corpus. A chat model has never
seen that format, and a template without tool support (SmolLM2's) drops the tool schemas, so
this environment says it in words and shows it once. The rows are tool_chain's (its 200
held-out chains, and training chains never among them); the reward is 1 when the final reply
is `#### N` with N the chain's result, else 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rlvr.tasks import tool_chain
from rlvr.tasks.tool_env import tool_env

SYSTEM = (
    "You solve two-step arithmetic with a calculator. The tools are sum(a, b), sub(a, b) and "
    "mul(a, b). To use one, reply with only its call as JSON, for example "
    '{"arguments":{"a":5,"b":7},"name":"sum"}. The calculator replies with the result, '
    "like =012. Make the first step's call, then the second step's call with the first "
    "result, then reply with only #### and the last result."
)


def worked(chain: tool_chain.Chain) -> list[dict[str, Any]]:
    """One episode played right: the problem, both calls with their results, the answer."""
    return [
        {"role": "user", "content": chain.prompt.strip()},
        {"role": "assistant", "content": tool_chain.call(chain.op, chain.a, chain.b)},
        {"role": "tool", "content": tool_chain.tool_message(chain.op, str(chain.first))},
        {"role": "assistant", "content": tool_chain.call("mul", chain.first, chain.k)},
        {"role": "tool", "content": tool_chain.tool_message("mul", str(chain.answer))},
        {"role": "assistant", "content": tool_chain.answer_text(chain.answer)},
    ]


EXAMPLE = worked(tool_chain.Chain("sum", 23, 41, 2)) + worked(tool_chain.Chain("sub", 75, 18, 3))


def opening(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The system message, the worked episode, then this row's problem."""
    return [
        {"role": "system", "content": SYSTEM},
        *EXAMPLE,
        {"role": "user", "content": str(row["prompt"]).strip()},
    ]


ENV = tool_env(
    *tool_chain.FUNCTIONS.values(),
    reward=tool_chain.episode_reward,
    opening=opening,
    max_calls=tool_chain.MAX_TURNS - 1,
    tool_message=tool_chain.tool_message,
)


def held_out_rows() -> list[dict[str, Any]]:
    return [tool_chain.row(c) for c in tool_chain.held_out_chains()]


def train_rows(seed: int) -> Iterator[dict[str, Any]]:
    return (tool_chain.row(c) for c in tool_chain.train_chains(f"chat-tool-chain/{seed}"))
