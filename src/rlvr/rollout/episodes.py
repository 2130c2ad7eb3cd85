"""Episodes over several turns: an environment at the message level, a token loop the trainer owns.

An environment (`Environment`) is one episode's state, built fresh for each episode by a
factory. It speaks messages, never token ids:

    reset(row, *, seed) -> (messages, tools, info)     the opening messages, tool schemas
    step(reply)         -> (messages, reward | None, done, info)
    close()

The G episodes of a group get the same row and the same seed, so they start from one state.

The loop (`run_episodes`) owns the tokens (token in, token out):
- the ids the engine sampled are appended verbatim, never decoded and re-encoded;
- the environment's messages become ids through a `TurnRenderer`: the chat template's
  rendering of the new turn alone (a fixed-base difference, with the template's glue after the
  reply's EOS), or, for a tokenizer without a template, the messages' text;
- every token is marked: 1 in the action mask where the policy sampled it, 0 where the
  environment, a tool or the template put it. Behaviour log-probs are NaN on the 0s.

Budgets: `max_turns` replies, `max_tokens` after the opening prompt across all turns (sampled
and environment tokens alike: an environment message that would overflow is cut, and the
episode ends truncated), `max_reply_tokens` per reply, `step_timeout_s` for one `step` call and
`episode_timeout_s` for the whole episode. A `reset` or `step` that raises ends its episode
with status "error" and reward 0 (counted); one that does not answer in time ends it with
status "timeout" (its thread is left behind: Python cannot stop a thread, and it is a daemon,
so it never holds up the process). Neither stalls the other episodes.

Statuses: "done" (the environment said so), "max_turns", "truncated" (a reply without EOS
within its budget, or the token budget spent), "timeout", "error".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from rlvr.config import UserError
from rlvr.rollout.kv_cache import EpisodeKV
from rlvr.rollout.sampler import RolloutBatch
from rlvr.workers import calls_in_parallel

Message = dict[str, Any]  # {"role": ..., "content": ...}


class Environment(Protocol):
    """One episode's environment. Messages in and out; tools are JSON schemas (for the chat
    template) of the functions the environment runs itself when a reply calls them."""

    def reset(
        self, row: Mapping[str, Any], *, seed: int
    ) -> tuple[list[Message], list[dict[str, Any]], dict[str, Any]]: ...

    def step(self, reply: str) -> tuple[list[Message], float | None, bool, dict[str, Any]]: ...

    def close(self) -> None: ...


EnvFactory = Callable[[], Environment]

STATUSES = ("done", "max_turns", "truncated", "timeout", "error")


class TokenEngine(Protocol):
    """An engine's token-level call: prompts as ids in, sampled ids and log-probs out. `keys`
    name each prompt's episode (the same on each of its turns) and `kept` is the run's store
    of episodes' keys and values: an engine that can keeps them between turns and prefills
    only the new tokens; one that cannot ignores both."""

    def generate_tokens(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        temperature: float,
        generator: torch.Generator | None = None,
        keys: Sequence[int] | None = None,
        kept: EpisodeKV | None = None,
    ) -> list[tuple[list[int], list[float]]]: ...


class TemplateError(UserError, ValueError):
    """The tokenizer's chat template cannot render turns one at a time; the message says why."""


# --- turns as tokens ---------------------------------------------------------------------------


class PlainTurns:
    """A tokenizer without a chat template (the tiny character model): a turn's messages are
    their contents concatenated, the opening ones with the tokenizer's special tokens, later
    ones without (the reply before them ended with its EOS)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def opening(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> list[int]:
        return list(self.tokenizer(_text(messages))["input_ids"])

    def after_reply(self, messages: Sequence[Message]) -> list[int]:
        return list(self.tokenizer(_text(messages), add_special_tokens=False)["input_ids"])


_BASE: list[Message] = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]


class ChatTemplateTurns:
    """Turns through the tokenizer's chat template, one at a time (no re-rendering of the
    conversation, so the ids already sampled never change).

    The opening messages render with the generation prompt. The messages after a reply render
    as a fixed-base difference: `template(BASE + messages, generation prompt)` minus the text of
    `template(BASE)` up to and including the assistant turn's EOS, which leaves the template's
    glue after that EOS (ChatML's newline after `<|im_end|>`), the new turn and the next
    generation prompt. Built once per run; `check` refuses a template that does not preserve
    prefixes when a turn is appended (one that rewrites earlier turns, as Qwen3's drops their
    thinking), or whose assistant turn does not end with the EOS token the sampler stops at."""

    def __init__(self, tokenizer, tools: Sequence[dict[str, Any]] = ()) -> None:
        self.tokenizer = tokenizer
        self.tools = list(tools) or None
        self.eos_text = tokenizer.decode([tokenizer.eos_token_id])
        base = self._render(_BASE, generation_prompt=False)
        cut = base.rfind(self.eos_text)
        if cut < 0 or cut < base.rfind("y"):
            raise TemplateError(
                f"the chat template does not end an assistant turn with the EOS token "
                f"{self.eos_text!r} the sampler stops at; episodes need one (set the tokenizer's "
                "eos_token to the template's end-of-turn token)"
            )
        self.base_prefix = base[: cut + len(self.eos_text)]
        self.check()

    def _render(
        self,
        messages: Sequence[Message],
        generation_prompt: bool,
        tools: Sequence[dict[str, Any]] = (),
    ) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) or self.tools,
            tokenize=False,
            add_generation_prompt=generation_prompt,
        )

    def check(self) -> None:
        """Refuse a template that rewrites earlier turns when one is appended."""
        think = {"role": "assistant", "content": "<think>a</think>b"}
        user = {"role": "user", "content": "z"}
        conversation = [user, think, {"role": "tool", "content": "1"}, user, think]
        for k in range(1, len(conversation)):
            before = self._render(conversation[:k], generation_prompt=False)
            after = self._render(conversation[: k + 1], generation_prompt=False)
            if not after.startswith(before):
                raise TemplateError(
                    "the chat template is not prefix-preserving: appending a "
                    f"{conversation[k]['role']} turn changes the text of the turns before it "
                    "(it rewrites history, as templates that drop earlier thinking do), so "
                    "episodes cannot be rendered one turn at a time; use a template that keeps "
                    "earlier turns as they are"
                )

    def opening(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> list[int]:
        text = self._render(messages, generation_prompt=True, tools=tools)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def after_reply(self, messages: Sequence[Message]) -> list[int]:
        full = self._render([*_BASE, *messages], generation_prompt=True)
        if not full.startswith(self.base_prefix):
            raise TemplateError(
                "the chat template renders a conversation's first turns differently once "
                "more turns follow; episodes cannot be rendered one turn at a time"
            )
        delta = full[len(self.base_prefix) :]
        return list(self.tokenizer(delta, add_special_tokens=False)["input_ids"])


TurnRenderer = PlainTurns | ChatTemplateTurns


def turn_renderer(tokenizer, chat_template: bool, tools: Sequence[dict[str, Any]] = ()):
    """The renderer for this tokenizer: its chat template (checked) when it has one and
    `chat_template` is on, else the messages' text."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        return ChatTemplateTurns(tokenizer, tools)
    return PlainTurns(tokenizer)


def _text(messages: Sequence[Message]) -> str:
    return "".join(str(m.get("content", "")) for m in messages)


# --- episodes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpisodeLimits:
    """Budgets of one episode; every one of them ends it, none can hang it."""

    max_turns: int = 4
    """Replies the policy writes at most."""
    max_tokens: int = 256
    """Tokens after the opening prompt, across all turns (sampled and environment tokens)."""
    max_reply_tokens: int = 64
    """Tokens of one reply at most (its EOS included)."""
    step_timeout_s: float = 10.0
    """Seconds one `reset` or `step` call may take (its tools included)."""
    episode_timeout_s: float = 120.0
    """Seconds the environment's calls of one episode may take in all."""
    turn_discount: float = 1.0
    """The reward of turn k (0-based) is weighted by turn_discount**k in the episode's return."""


@dataclass
class Episode:
    """One episode as tokens: the opening prompt, then every later token, each marked."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)  # after the prompt: replies and env turns
    action: list[int] = field(default_factory=list)  # 1 where the policy sampled the token
    logprobs: list[float] = field(default_factory=list)  # sampling log-probs, NaN on env tokens
    turn_ends: list[int] = field(default_factory=list)  # index in `ids` of each reply's last token
    turn_rewards: list[float] = field(default_factory=list)  # the env's reward after each reply
    replies: list[str] = field(default_factory=list)
    status: str = ""
    info: dict[str, Any] = field(default_factory=dict)  # the env's last info
    env_seconds: float = 0.0
    counts: dict[str, float] = field(default_factory=dict)  # tool_calls, tool_errors, ... (info)

    @property
    def done(self) -> bool:
        return bool(self.status)

    @property
    def final_reply(self) -> str:
        return self.replies[-1] if self.replies else ""

    def episode_return(self, discount: float) -> float:
        """sum_k discount**k * reward_k over the turns' rewards (0 for an error)."""
        if self.status == "error":
            return 0.0
        return sum(discount**k * r for k, r in enumerate(self.turn_rewards))


COUNTED_INFO = ("tool_calls", "tool_errors", "tool_timeouts", "tool_seconds")
"""Numbers an environment may put in a step's info; the loop sums them per episode."""


def _check_messages(messages: Any, where: str) -> list[Message]:
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and "content" in m for m in messages
    ):
        raise TypeError(
            f"{where} must return a list of messages ({{'role': ..., 'content': ...}} dicts), "
            f"got {type(messages).__name__}"
        )
    return messages


def run_episodes(
    engine: TokenEngine,
    renderer: TurnRenderer,
    factory: EnvFactory,
    rows: Sequence[Mapping[str, Any]],
    seeds: Sequence[int],
    group_size: int,
    limits: EpisodeLimits,
    temperature: float,
    generator: torch.Generator | None,
    decode: Callable[[list[int]], str],
    eos_id: int,
    keep_kv: bool = True,
) -> list[Episode]:
    """`group_size` episodes for each row (group-major, the group's episodes on one seed),
    run turn by turn: one engine call per turn for every running episode, then every running
    episode's `step` side by side. Returns the episodes, every one ended with a status.
    `keep_kv` lets the engine keep each episode's keys and values between its turns (off: every
    turn runs the whole conversation again; the benchmark compares the two)."""
    envs = [factory() for _ in rows for _ in range(group_size)]
    clocks = [0.0] * len(envs)  # seconds each episode's environment calls took so far
    episodes = _open(envs, rows, seeds, group_size, renderer, limits, clocks)
    kept = EpisodeKV() if keep_kv else None
    for turn in range(limits.max_turns):
        last = turn == limits.max_turns - 1  # no turn follows: nothing worth keeping
        replied = _sample_turn(
            episodes, engine, limits, temperature, generator, decode, eos_id, None if last else kept
        )
        if not replied:
            break
        _step_turn(episodes, envs, replied, renderer, limits, clocks)
    for e in episodes:
        if not e.done:
            e.status = "max_turns"
    # side by side: a close that hangs costs one timeout, not one per episode
    calls_in_parallel([env.close for env in envs], [limits.step_timeout_s] * len(envs))
    return episodes


def _open(
    envs: list[Environment],
    rows: Sequence[Mapping[str, Any]],
    seeds: Sequence[int],
    group_size: int,
    renderer: TurnRenderer,
    limits: EpisodeLimits,
    clocks: list[float],
) -> list[Episode]:
    """Every environment's `reset` side by side; its opening messages as prompt ids."""
    opened = calls_in_parallel(
        [
            (lambda env=env, i=i: env.reset(rows[i // group_size], seed=seeds[i // group_size]))
            for i, env in enumerate(envs)
        ],
        [min(limits.step_timeout_s, limits.episode_timeout_s)] * len(envs),
    )
    episodes = []
    for i, (status, result, seconds) in enumerate(opened):
        clocks[i] += seconds
        episode = Episode(prompt_ids=[], env_seconds=seconds)
        if status == "ok":
            try:
                messages, tools, info = result
                episode.prompt_ids = renderer.opening(_check_messages(messages, "reset"), tools)
                episode.info = dict(info or {})
            except (TypeError, ValueError) as exc:
                status, result = "error", exc
        if status != "ok":
            episode.status, episode.info = status, {"error": _describe(status, result, "reset")}
        episodes.append(episode)
    return episodes


def _sample_turn(
    episodes: list[Episode],
    engine: TokenEngine,
    limits: EpisodeLimits,
    temperature: float,
    generator: torch.Generator | None,
    decode: Callable[[list[int]], str],
    eos_id: int,
    kept: EpisodeKV | None,
) -> list[int]:
    """One reply for every running episode (one engine call), each cut to its budget; returns
    the episodes whose reply ended with EOS (the others end truncated)."""
    budgets = {
        i: min(limits.max_reply_tokens, limits.max_tokens - len(e.ids))
        for i, e in enumerate(episodes)
        if not e.done
    }
    for i, budget in budgets.items():
        if budget <= 0:
            episodes[i].status = "truncated"
    running = [i for i, budget in budgets.items() if budget > 0]
    if not running:
        return []
    sampled = engine.generate_tokens(
        [episodes[i].prompt_ids + episodes[i].ids for i in running],
        max(budgets[i] for i in running),
        temperature,
        generator,
        keys=running,
        kept=kept,
    )
    replied = []
    for i, (ids, logprobs) in zip(running, sampled):
        e, ids, logprobs = episodes[i], ids[: budgets[i]], logprobs[: budgets[i]]
        e.ids += ids
        e.action += [1] * len(ids)
        e.logprobs += logprobs
        e.turn_ends.append(len(e.ids) - 1)
        finished = bool(ids) and ids[-1] == eos_id
        e.replies.append(decode(ids[:-1] if finished else ids))
        if finished:
            replied.append(i)
        else:
            e.status = "truncated"
            e.turn_rewards.append(0.0)
    return replied


def _step_turn(
    episodes: list[Episode],
    envs: list[Environment],
    replied: list[int],
    renderer: TurnRenderer,
    limits: EpisodeLimits,
    clocks: list[float],
) -> None:
    """Every replied episode's `step` side by side: its reward, its end, or its next turn's
    environment tokens."""
    results = calls_in_parallel(
        [(lambda env=envs[i], reply=episodes[i].final_reply: env.step(reply)) for i in replied],
        [
            max(0.0, min(limits.step_timeout_s, limits.episode_timeout_s - clocks[i]))
            for i in replied
        ],
    )
    for i, (status, result, seconds) in zip(replied, results):
        e = episodes[i]
        clocks[i] += seconds
        e.env_seconds += seconds
        if status == "ok":
            try:
                messages, reward, done, info = result
                messages = _check_messages(messages, "step")
            except (TypeError, ValueError) as exc:
                status, result = "error", exc
        if status != "ok":
            e.status, e.info = status, {"error": _describe(status, result, "step")}
            e.turn_rewards.append(0.0)
            continue
        e.info = dict(info or {})
        for key in COUNTED_INFO:
            e.counts[key] = e.counts.get(key, 0.0) + float(e.info.get(key, 0.0))
        e.turn_rewards.append(float(reward or 0.0))
        if done:  # an environment may end an episode as timed out or failed (a hung tool)
            e.status = e.info["status"] if e.info.get("status") in STATUSES else "done"
        elif len(e.replies) >= limits.max_turns:
            e.status = "max_turns"
        elif messages:
            _append_env_turn(e, renderer.after_reply(messages), limits.max_tokens)


def _append_env_turn(e: Episode, ids: list[int], max_tokens: int) -> None:
    """The environment's tokens after a reply, cut where they would leave no room for a next
    reply token (the episode then ends truncated)."""
    room = max_tokens - len(e.ids) - 1
    if len(ids) > room:
        ids, e.status = ids[: max(room, 0)], "truncated"
    e.ids += ids
    e.action += [0] * len(ids)
    e.logprobs += [math.nan] * len(ids)


def _describe(status: str, result: Any, call: str) -> str:
    if status == "timeout":
        return f"{call} did not answer in time"
    return f"{call} raised {type(result).__name__}: {result}"


def episode_batch(episodes: Sequence[Episode], group_size: int, pad_id: int) -> RolloutBatch:
    """The episodes as one `RolloutBatch`: the opening prompt left-padded, every later token in
    the completion (right-padded), `completion_mask` 1 on all of them (attention),
    `action_mask` 1 on the sampled ones, log-probs NaN on the environment's and 0 on padding;
    `truncated` where the status is "truncated"; `completions` the final replies."""
    n = len(episodes)
    openings = _group_openings(episodes, group_size)
    p = max(1, max(len(o) for o in openings))
    t = max(1, max(len(e.ids) for e in episodes))
    prompt_ids = torch.full((n, p), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, p), dtype=torch.long)
    completion_ids = torch.full((n, t), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((n, t))
    action_mask = torch.zeros((n, t))
    logprobs = torch.zeros((n, t))
    for i, (e, opening) in enumerate(zip(episodes, openings)):
        if opening:
            prompt_ids[i, p - len(opening) :] = torch.tensor(opening)
            prompt_mask[i, p - len(opening) :] = 1
        k = len(e.ids)
        if k:
            completion_ids[i, :k] = torch.tensor(e.ids)
            completion_mask[i, :k] = 1.0
            action_mask[i, :k] = torch.tensor(e.action, dtype=torch.float)
            logprobs[i, :k] = torch.tensor(e.logprobs)
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        logprobs=logprobs,
        truncated=torch.tensor([e.status == "truncated" for e in episodes]),
        group_ids=torch.arange(n // group_size).repeat_interleave(group_size),
        completions=[e.final_reply for e in episodes],
        action_mask=action_mask,
    )


class EpisodeError(UserError, ValueError):
    """An environment broke a rule of the loop (the message says which and what to change)."""


def _group_openings(episodes: Sequence[Episode], group_size: int) -> list[list[int]]:
    """Each episode's opening prompt ids, one per group: the update may run a group's prompt
    once for all its rows. An episode whose `reset` failed (no opening) takes its group's; a
    group whose episodes opened differently is refused."""
    openings = []
    for start in range(0, len(episodes), group_size):
        group = [e.prompt_ids for e in episodes[start : start + group_size]]
        opened = [ids for ids in group if ids]
        if any(ids != opened[0] for ids in opened):
            raise EpisodeError(
                "the environment's reset gave the episodes of one group different opening "
                "messages; a group's episodes get the same row and seed and must start from one "
                "state: make reset depend on its row and seed only"
            )
        openings += [opened[0] if opened else []] * len(group)
    return openings


def turn_reward_tokens(episodes: Sequence[Episode], width: int) -> torch.Tensor:
    """[N, width] each turn's reward on its reply's last sampled token, 0 elsewhere."""
    out = torch.zeros((len(episodes), width))
    for i, e in enumerate(episodes):
        for end, reward in zip(e.turn_ends, e.turn_rewards):
            out[i, end] += reward
    return out


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Turns, statuses, tool counts, env-token share and seconds in the environment
    (docs/metrics.md `env/*`)."""
    n = max(len(episodes), 1)
    env_tokens = sum(len(e.action) - sum(e.action) for e in episodes)
    all_tokens = max(sum(len(e.action) for e in episodes), 1)
    metrics = {
        "env/turns_mean": sum(len(e.replies) for e in episodes) / n,
        "env/env_token_frac": env_tokens / all_tokens,
        "env/seconds": sum(e.env_seconds for e in episodes),
    }
    for status in STATUSES:
        metrics[f"env/{status}_frac"] = sum(e.status == status for e in episodes) / n
    for key in COUNTED_INFO[:3]:
        metrics[f"env/{key}"] = sum(e.counts.get(key, 0.0) for e in episodes)
    metrics["env/tool_seconds"] = sum(e.counts.get("tool_seconds", 0.0) for e in episodes)
    return metrics


@dataclass(frozen=True)
class EpisodeSpec:
    """What a multi-turn run samples with: the environment factory, the budgets, the renderer
    (built once for the run's tokenizer), and which rewards count: the environment's return
    (`env_reward`), the task's verifiers on the final reply (`verify`; `score` grades one reply
    in held-out evaluation), or both summed."""

    factory: EnvFactory
    limits: EpisodeLimits
    renderer: TurnRenderer
    verify: bool = False
    env_reward: bool = True
    score: Callable[[str, Mapping[str, Any]], float] | None = None


def to_device(batch: RolloutBatch, device: torch.device | str) -> RolloutBatch:
    """The batch with its tensors on `device` (episodes are assembled on the host)."""
    moved = {
        name: value.to(device) if isinstance(value, torch.Tensor) else value
        for name, value in vars(batch).items()
    }
    return RolloutBatch(**moved)
