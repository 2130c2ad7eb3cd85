"""An environment from typed Python functions: the model calls tools, reads their results, and
answers (`rlvr.rollout.episodes.Environment`, one instance per episode).

    def multiply(a: int, b: int) -> int:
        '''Multiply two integers.

        Args:
            a: the first factor
            b: the second factor
        '''
        return a * b

    calculator = tool_env(multiply, reward=lambda env: float(env.final_reply == "42"))

Each function's signature and Google-style docstring become its JSON schema
(`transformers.utils.get_json_schema`, what TRL's `tools=` and the chat templates read); the
schemas go to the chat template with the opening messages. After each reply:

- a reply that holds tool calls (Hermes `<tool_call>{...}</tool_call>` tags, or the whole reply
  one bare JSON object: `rlvr.verifiers.tool.extract_tool_calls`, the tool verifier's parsing)
  runs them in order: each call's arguments are checked against its tool's schema as the tool
  verifier checks them, the tool runs under `tool_timeout_s`, and its result (JSON for anything
  but a string) or its error (`error: ...`: an unknown tool, arguments that break the schema,
  an exception, a malformed call) is the next message, role "tool". Errors go back to the model
  and are counted (`tool_errors`); they end nothing.
- a tool that does not return within `tool_timeout_s` ends the episode with status "timeout"
  (its thread is a daemon left behind; counted in `tool_timeouts`).
- a reply with no call ends the episode: its reward is `reward(env)` (default 0), read from the
  environment's state: `row`, `seed`, `replies`, `final_reply` and `calls` (each call's name,
  arguments, and result or error).
- `max_calls` calls end the episode too, scored the same way.

`tool_message(name, text)` renders a tool's message content (default: the text itself); a plain
format for a model without a chat template puts its own framing there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlvr.config import UserError
from rlvr.verifiers.tool import Tool, extract_tool_calls
from rlvr.workers import call_with_timeout

Message = dict[str, Any]


class ToolSchemaError(UserError, ValueError):
    """A function that cannot be a tool (no type hints, no docstring for its arguments)."""


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI-style schema `{"type": "function", "function": {...}}` of `fn`, from its
    signature and docstring; a one-line `ToolSchemaError` naming what to add otherwise."""
    from transformers.utils import get_json_schema

    name = getattr(fn, "__name__", repr(fn))
    try:
        return get_json_schema(fn)
    except Exception as exc:  # transformers' own exception types differ across versions
        raise ToolSchemaError(
            f"tool {name}: {exc} (a tool needs type hints on every argument and a docstring "
            "whose Args: section describes each one)"
        ) from exc


def as_tools(functions: Sequence[Callable[..., Any]]) -> tuple[list[Tool], list[dict[str, Any]]]:
    """(the verifier's `Tool`s, their schemas) of `functions`; two of one name are refused."""
    tools, schemas = [], []
    for fn in functions:
        schema = tool_schema(fn)
        function = schema["function"]
        if any(t.name == function["name"] for t in tools):
            raise ToolSchemaError(f"two tools are named {function['name']}; rename one")
        tools.append(Tool(function["name"], function.get("parameters", {}), fn))
        schemas.append(schema)
    return tools, schemas


def _json(result: Any) -> str:
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result)
    except (TypeError, ValueError):
        return str(result)


class ToolEnv:
    """One episode with tools (module docstring)."""

    def __init__(
        self,
        tools: Sequence[Tool],
        schemas: Sequence[dict[str, Any]],
        *,
        reward: Callable[[ToolEnv], float] | None = None,
        opening: Callable[[Mapping[str, Any]], list[Message]] | None = None,
        max_calls: int = 8,
        tool_timeout_s: float = 5.0,
        tool_message: Callable[[str, str], str] | None = None,
    ) -> None:
        self.tools = {t.name: t for t in tools}
        self.schemas = list(schemas)
        self.reward_fn, self.opening_fn = reward, opening
        self.max_calls, self.tool_timeout_s = max_calls, tool_timeout_s
        self.tool_message = tool_message or (lambda name, text: text)
        self.row: Mapping[str, Any] = {}
        self.seed = 0
        self.replies: list[str] = []
        self.calls: list[dict[str, Any]] = []

    @property
    def final_reply(self) -> str:
        return self.replies[-1] if self.replies else ""

    def reset(
        self, row: Mapping[str, Any], *, seed: int
    ) -> tuple[list[Message], list[dict[str, Any]], dict[str, Any]]:
        self.row, self.seed, self.replies, self.calls = row, seed, [], []
        if self.opening_fn is not None:
            messages = self.opening_fn(row)
        elif isinstance(row.get("prompt"), list):  # conversational rows: their messages
            messages = [dict(m) for m in row["prompt"]]
        else:
            messages = [{"role": "user", "content": str(row.get("prompt", ""))}]
        return messages, self.schemas, {}

    def step(self, reply: str) -> tuple[list[Message], float | None, bool, dict[str, Any]]:
        self.replies.append(reply)
        calls, status = extract_tool_calls(reply)
        if status == "no_call" or status == "unclosed_think":
            return [], self._reward(), True, {}
        info: dict[str, Any] = {"tool_calls": 0, "tool_errors": 0, "tool_seconds": 0.0}
        if status != "ok":
            info["tool_calls"], info["tool_errors"] = 1, 1
            text = 'error: a malformed tool call (expected {"name": ..., "arguments": {...}})'
            return [self._message("?", text)], None, False, info
        messages = []
        for name, arguments in calls:
            info["tool_calls"] += 1
            outcome, text, seconds = self._run(name, arguments)
            info["tool_seconds"] += seconds
            self.calls.append({"name": name, "arguments": arguments, outcome: text})
            if outcome == "timeout":
                info |= {"tool_timeouts": 1, "status": "timeout"}
                return [], 0.0, True, info
            info["tool_errors"] += outcome == "error"
            messages.append(self._message(name, text))
        if len(self.calls) >= self.max_calls:
            return [], self._reward(), True, info
        return messages, None, False, info

    def _run(self, name: str, arguments: dict[str, Any]) -> tuple[str, str, float]:
        """("result" | "error" | "timeout", the message text, seconds) of one call."""
        tool = self.tools.get(name)
        if tool is None:
            return "error", f"error: unknown tool {name!r}; tools: {', '.join(self.tools)}", 0.0
        problem = tool.schema_error(arguments)
        if problem is not None:
            return "error", f"error: arguments of {name}: {problem}", 0.0
        start = time.perf_counter()
        status, value = call_with_timeout(lambda: tool.fn(**arguments), self.tool_timeout_s)
        seconds = time.perf_counter() - start
        if status == "timeout":
            return "timeout", f"error: {name} did not answer in {self.tool_timeout_s:g} s", seconds
        if status == "error":
            return "error", f"error: {type(value).__name__}: {value}", seconds
        return "result", _json(value), seconds

    def _message(self, name: str, text: str) -> Message:
        return {"role": "tool", "name": name, "content": self.tool_message(name, text)}

    def _reward(self) -> float:
        return float(self.reward_fn(self)) if self.reward_fn is not None else 0.0

    def close(self) -> None:
        pass


class ToolEnvFactory:
    """A zero-argument factory of `ToolEnv`s over fixed tools (`tool_env`): `.tools` and
    `.schemas` say what the model is offered."""

    def __init__(self, functions: Sequence[Callable[..., Any]], **options: Any) -> None:
        self.tools, self.schemas = as_tools(functions)
        self.options = options
        self.max_turns = options.get("max_calls", 8) + 1  # the calls, then the answer

    def __call__(self) -> ToolEnv:
        return ToolEnv(self.tools, self.schemas, **self.options)


def tool_env(
    *functions: Callable[..., Any],
    reward: Callable[[ToolEnv], float] | None = None,
    opening: Callable[[Mapping[str, Any]], list[Message]] | None = None,
    max_calls: int = 8,
    tool_timeout_s: float = 5.0,
    tool_message: Callable[[str, str], str] | None = None,
) -> ToolEnvFactory:
    """An environment factory from typed functions (module docstring); its schemas are built
    (and a function that cannot be a tool refused) here, once."""
    if not functions:
        raise ToolSchemaError("tool_env needs at least one function")
    return ToolEnvFactory(
        functions,
        reward=reward,
        opening=opening,
        max_calls=max_calls,
        tool_timeout_s=tool_timeout_s,
        tool_message=tool_message,
    )
