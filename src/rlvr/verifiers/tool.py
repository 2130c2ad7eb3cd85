"""Tool-call verifier: parse one JSON tool call, validate it, run the tool, compare its result.

Policy
------
What counts as the call (reasoning in ``<think>...</think>`` is removed first, as everywhere):
  * Tagged (Hermes/Qwen style): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
    Text around the tag is allowed. A ``<tool_call>`` without its closing tag (a truncated
    generation) is ``malformed``.
  * Bare: when there is no tag, the whole answer (whitespace and one Markdown code fence
    aside) must be one JSON object. JSON is never searched for inside prose: "I would call
    {...}" is ``no_call``.
  * Conversational completions whose last message carries OpenAI-style ``tool_calls``
    (``[{"type": "function", "function": {"name", "arguments"}}]``) use those.
  * Exactly one call; two or more score 0 (``multiple_calls``): one answer, as in math.
The call object: ``{"name": str, "arguments": object}``. ``arguments`` may also be a JSON string
holding an object (OpenAI's wire format) or be called ``parameters`` (Llama's); a missing
``arguments`` means ``{}``; an OpenAI wrapper ``{"type": "function", "function": {...}}`` is
unwrapped. Duplicate keys, ``NaN``/``Infinity`` literals, a non-string name or non-object
arguments are ``malformed``: what the tool receives must be what the JSON plainly says.

Checking and running:
  * The name must be registered (``unknown_tool``); the arguments must validate against the
    tool's JSON schema (``schema_violation``, with jsonschema's best message in ``detail``;
    the schema's own ``$schema`` picks the draft, 2020-12 by default; ``format`` is checked).
  * The tool runs as ``fn(**arguments)`` in this process; an exception is ``tool_error``. Tools
    are trusted code that must bound their own work: there is no time limit here.
  * The result is compared with the reference (the dataset's ``answer``): JSON-like deep
    equality, lists and tuples alike, ints and floats by value (floats to a relative 1e-9),
    ``True`` never equal to ``1``. A string reference is read as JSON when the result is not a
    string (``"[1, 2]"`` matches ``[1, 2]``). Equal is ``correct`` (1.0), else ``wrong``.

Registry: `register_tool(name, schema, fn)` adds a tool to this process's registry. Worker
processes (TRL's or verl's) get their own copy only if the module that registers the tools is
imported there; or pass ``tools=`` explicitly (a `Tool` pickles as its name, schema and
function, so the function must be importable).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from numbers import Real
from typing import Any

from rlvr.verifiers.format import answer_text

__all__ = [
    "Tool",
    "extract_tool_calls",
    "register_tool",
    "registered_tools",
    "score",
    "tool_reward",
    "unregister_tool",
    "verify",
]

REASONS = (
    "correct",
    "wrong",
    "no_call",
    "malformed",
    "multiple_calls",
    "unknown_tool",
    "schema_violation",
    "tool_error",
    "unclosed_think",
    "error",
)

_OPEN_TAG, _CLOSE_TAG = "<tool_call>", "</tool_call>"
_FENCE = "```"
_FENCE_LABEL = re.compile(r"[A-Za-z]*")  # "```json"
_MAX_DETAIL_CHARS = 300


class Tool:
    """A callable tool with the JSON schema of its arguments object."""

    __slots__ = ("name", "schema", "fn", "_validator")

    def __init__(self, name: str, schema: Mapping[str, Any], fn: Callable[..., Any]) -> None:
        from jsonschema.validators import validator_for

        if not isinstance(name, str) or not name:
            raise ValueError("a tool needs a non-empty string name")
        if not callable(fn):
            raise TypeError(f"tool {name!r}: fn must be callable")
        validator_class = validator_for(schema)
        validator_class.check_schema(schema)  # a broken schema fails here, not at grading
        self.name, self.schema, self.fn = name, schema, fn
        self._validator = validator_class(schema, format_checker=validator_class.FORMAT_CHECKER)

    def __reduce__(self) -> tuple:
        return Tool, (self.name, self.schema, self.fn)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"

    def schema_error(self, arguments: Any) -> str | None:
        """jsonschema's most relevant message, or None when the arguments are valid."""
        from jsonschema.exceptions import best_match

        error = best_match(self._validator.iter_errors(arguments))
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path)
        return f"{where}: {error.message}" if where else error.message


_TOOLS: dict[str, Tool] = {}


def register_tool(
    name: str, schema: Mapping[str, Any], fn: Callable[..., Any], *, replace: bool = False
) -> Tool:
    """Register ``fn`` as tool ``name``; ``schema`` is the JSON schema of its arguments.

    Raises ValueError for a name already taken (unless ``replace``) and jsonschema's
    SchemaError for an invalid schema.
    """
    if name in _TOOLS and not replace:
        raise ValueError(f"tool {name!r} is already registered (pass replace=True)")
    tool = Tool(name, schema, fn)
    _TOOLS[name] = tool
    return tool


def unregister_tool(name: str) -> None:
    _TOOLS.pop(name, None)


def registered_tools() -> dict[str, Tool]:
    """A copy of this process's registry (name -> Tool)."""
    return dict(_TOOLS)


class _Malformed(ValueError):
    pass


def _reject_constant(token: str) -> Any:
    raise _Malformed(f"{token} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _Malformed(f"duplicate key {key!r}")
        result[key] = value
    return result


def _loads(text: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_reject_constant)
    except _Malformed:
        raise
    except (ValueError, RecursionError) as exc:
        raise _Malformed(f"invalid JSON: {exc}") from None


def _normalize_call(call: Any) -> tuple[str, dict[str, Any]]:
    """(name, arguments) of one call object; raises _Malformed."""
    if isinstance(call, str):
        call = _loads(call)
    if isinstance(call, dict) and call.get("type") == "function" and "function" in call:
        call = call["function"]
    if not isinstance(call, dict):
        raise _Malformed("a tool call must be a JSON object")
    name = call.get("name")
    if not isinstance(name, str) or not name:
        raise _Malformed('a tool call needs a string "name"')
    if "arguments" in call and "parameters" in call:
        raise _Malformed('both "arguments" and "parameters"')
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = _loads(arguments)
    if not isinstance(arguments, dict):
        raise _Malformed('"arguments" must be a JSON object')
    return name, arguments


def _tagged_bodies(text: str) -> list[str]:
    """The text of each ``<tool_call>...</tool_call>``, in order: each opening tag with the
    first closing tag after it (what ``<tool_call>(.*?)</tool_call>`` finds, in one pass: that
    regex rescans the rest of the text from every opening tag that is never closed)."""
    bodies: list[str] = []
    pos = 0
    while (opened := text.find(_OPEN_TAG, pos)) != -1:
        closed = text.find(_CLOSE_TAG, opened + len(_OPEN_TAG))
        if closed == -1:
            break  # no closing tag after this one, so none after any later opening tag
        bodies.append(text[opened + len(_OPEN_TAG) : closed])
        pos = closed + len(_CLOSE_TAG)
    return bodies


def _unfenced(bare: str) -> str:
    """A stripped answer without the one Markdown code fence around it (```` ```json ... ``` ````),
    stripped again; the answer itself when it is not fenced.

    What ``^```[A-Za-z]*\\s*\\n?(.*?)\\n?\\s*```$`` matched (its group, stripped), without its
    backtracking, which took seconds on two thousand spaces after an opening fence."""
    if len(bare) < 2 * len(_FENCE) or not (bare.startswith(_FENCE) and bare.endswith(_FENCE)):
        return bare
    label_end = _FENCE_LABEL.match(bare, len(_FENCE)).end()  # type: ignore[union-attr]
    return bare[label_end : -len(_FENCE)].strip()


def extract_tool_calls(completion: Any) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """The completion's tool calls as (name, arguments) pairs, and a status.

    The status is "ok", "no_call", "malformed" or "unclosed_think" (module docstring).
    """
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        message = completion[-1]
        if message.get("tool_calls"):
            try:
                return [_normalize_call(call) for call in message["tool_calls"]], "ok"
            except _Malformed:
                return [], "malformed"
        completion = message.get("content")
        if isinstance(completion, list):  # multimodal content parts
            completion = "".join(p.get("text", "") for p in completion if isinstance(p, dict))
    if not isinstance(completion, str):
        return [], "no_call"
    text = answer_text(completion)
    if text is None:
        return [], "unclosed_think"
    tagged = _tagged_bodies(text)
    if text.count(_OPEN_TAG) != len(tagged) or text.count(_CLOSE_TAG) != len(tagged):
        return [], "malformed"  # an unclosed (truncated) or stray tag
    bodies = tagged
    if not bodies:
        bare = _unfenced(text.strip())
        if not bare.startswith("{"):
            return [], "no_call"
        bodies = [bare]
    try:
        return [_normalize_call(_loads(body.strip())) for body in bodies], "ok"
    except _Malformed:
        return [], "malformed"


def _same(result: Any, expected: Any) -> bool:
    """JSON-like deep equality (module docstring, "The result is compared")."""
    if isinstance(result, bool) or isinstance(expected, bool):
        return isinstance(result, bool) and isinstance(expected, bool) and result == expected
    if isinstance(result, Real) and isinstance(expected, Real):
        if isinstance(result, int) and isinstance(expected, int):
            return result == expected
        a, b = float(result), float(expected)
        return math.isfinite(a) and math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    if isinstance(result, str) or isinstance(expected, str):
        return isinstance(result, str) and isinstance(expected, str) and result == expected
    if isinstance(result, Mapping) and isinstance(expected, Mapping):
        return result.keys() == expected.keys() and all(
            _same(result[k], expected[k]) for k in result
        )
    if isinstance(result, (list, tuple)) and isinstance(expected, (list, tuple)):
        return len(result) == len(expected) and all(map(_same, result, expected))
    return result is None and expected is None


def _tool_table(tools: Mapping[str, Tool] | Iterable[Tool] | None) -> Mapping[str, Tool]:
    if tools is None:
        return _TOOLS
    if isinstance(tools, Mapping):
        return tools
    return {tool.name: tool for tool in tools}


def _short(text: str) -> str:
    return text if len(text) <= _MAX_DETAIL_CHARS else text[: _MAX_DETAIL_CHARS - 3] + "..."


def verify(
    completion: Any,
    expected: Any,
    *,
    tools: Mapping[str, Tool] | Iterable[Tool] | None = None,
) -> tuple[float, dict[str, Any]]:
    """(1.0 or 0.0, ``{"reason", "tool", "detail"}``); never raises.

    ``reason`` is one of `REASONS`; ``tool`` the called tool's name when one was parsed;
    ``detail`` says what went wrong (the schema message, the tool's exception) or is None.
    ``tools`` defaults to the registry (`register_tool`).
    """
    parts: dict[str, Any] = {"reason": "error", "tool": None, "detail": None}
    try:
        calls, status = extract_tool_calls(completion)
        if status != "ok":
            parts["reason"] = status
            return 0.0, parts
        if len(calls) != 1:
            parts["reason"] = "multiple_calls"
            return 0.0, parts
        name, arguments = calls[0]
        parts["tool"] = name
        tool = _tool_table(tools).get(name)
        if tool is None:
            parts["reason"] = "unknown_tool"
            return 0.0, parts
        if (problem := tool.schema_error(arguments)) is not None:
            parts["reason"], parts["detail"] = "schema_violation", _short(problem)
            return 0.0, parts
        try:
            result = tool.fn(**arguments)
        except Exception as exc:
            parts["reason"], parts["detail"] = "tool_error", _short(f"{type(exc).__name__}: {exc}")
            return 0.0, parts
        if isinstance(expected, str) and not isinstance(result, str):
            try:
                expected = _loads(expected)
            except _Malformed:
                pass
        correct = _same(result, expected)
        parts["reason"] = "correct" if correct else "wrong"
        return (1.0 if correct else 0.0), parts
    except Exception as exc:
        parts["reason"], parts["detail"] = "error", _short(f"{type(exc).__name__}: {exc}")
        return 0.0, parts


def score(
    completion: Any,
    expected: Any,
    *,
    tools: Mapping[str, Tool] | Iterable[Tool] | None = None,
) -> float:
    """1.0 when the completion's one tool call validates, runs and returns ``expected``."""
    return verify(completion, expected, tools=tools)[0]


def tool_reward(
    prompts: list[Any],
    completions: list[Any],
    answer: list[Any],
    **kwargs: Any,
) -> list[float]:
    """TRL reward function (``fn(prompts, completions, **columns)``): column ``answer`` holds
    each row's expected tool result; tools come from the registry."""
    if len(completions) != len(answer):
        raise ValueError(f"{len(completions)} completions but {len(answer)} answers")
    return [score(completion, expected) for completion, expected in zip(completions, answer)]
