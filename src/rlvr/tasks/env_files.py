"""The user's own environment: `--env FILE.py:NAME` or `--env package.module:NAME`.

NAME is one of three forms, told apart by what it is:

1. a `tool_env(...)` factory (`rlvr.tasks.tool_env.ToolEnvFactory`);
2. an rlvr environment: a class whose `reset` takes `(row, *, seed)` and returns
   `(messages, tools, info)`, instantiated with no arguments per episode, or a zero-argument
   function that returns such an instance (`rlvr.rollout.episodes.Environment`);
3. a TRL-style environment class used unchanged (TRL's `environment_factory`): `__init__(self)`
   without arguments, `reset(self, **row) -> str | None`, its other public methods the tools
   (typed, with docstrings), and an optional `get_reward(self) -> float` read when the episode
   ends. A string `reset` returns is appended to the row's last user message. The
   episode runs as a `tool_env` of the instance's bound methods.

A class is form 2 when its `reset` has a `seed` keyword and takes a positional row, form 3 when
its `reset` takes only keywords (`**row`) or nothing. Anything else is refused in one line.

Rows: `--task FILE` (any layout rlvr reads) gives them; without one, NAME's module must define
`held_out_rows()` and `train_rows(seed)` (or a list `ROWS`, whose first `HELD_OUT` rows, 10 %
by default, are held out). The episode budget: NAME's `max_turns` attribute (default 4) and
`max_tokens` (default 512).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from rlvr.config import UserError
from rlvr.tasks.spec import Row, TaskSpec, endless_shuffles
from rlvr.tasks.tool_env import ToolEnv, ToolEnvFactory, as_tools

DEFAULT_MAX_TURNS = 4
DEFAULT_MAX_TOKENS = 512
DEFAULT_REPLY_TOKENS = 256


class EnvFileError(UserError, ValueError):
    """`--env FILE.py:NAME` cannot be used; the message names the spec and what to change."""


def _module(spec: str, where: str) -> ModuleType:
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise EnvFileError(f"--env {spec}: no file {where}")
            name = f"rlvr_user_env_{path.stem}"
            loader = importlib.util.spec_from_file_location(name, path)
            assert loader is not None and loader.loader is not None
            module = importlib.util.module_from_spec(loader)
            sys.modules[name] = module  # pickling and dataclasses look the module up
            loader.loader.exec_module(module)
            return module
        return importlib.import_module(where)
    except EnvFileError:
        raise
    except Exception as exc:
        line = str(exc).splitlines()[0] if str(exc) else ""
        raise EnvFileError(
            f"--env {spec}: importing {where} failed: {type(exc).__name__}: {line}"
        ) from exc


def _candidates(module: ModuleType) -> list[str]:
    """Names in `module` that look like environments (tool_envs, classes with a reset)."""
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (
            isinstance(value, ToolEnvFactory)
            or (
                inspect.isclass(value)
                and hasattr(value, "reset")
                and value.__module__ == module.__name__
            )
        )
    )


def _split(spec: str) -> tuple[str, str]:
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise EnvFileError(f"--env {spec}: expected FILE.py:NAME or package.module:NAME")
    return where, name


def _reset_kind(cls: type) -> str:
    """ "rlvr" (reset(row, *, seed)), "trl" (reset(**row) or reset()) or "" (neither)."""
    try:
        parameters = list(inspect.signature(cls.reset).parameters.values())[1:]  # past self
    except (TypeError, ValueError):
        return ""
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = {p.name for p in parameters}
    if positional and "seed" in names:
        return "rlvr"
    if not positional:
        return "trl"
    return ""


def _trl_tools(cls: type) -> list[str]:
    return [
        name
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") and name not in ("reset", "get_reward", "step", "close")
    ]


class TRLEnvironment:
    """A TRL-style environment class run as an rlvr environment (module docstring, form 3):
    one instance of the class per episode, its public methods the tools of a `ToolEnv`."""

    def __init__(self, cls: type, max_calls: int, tool_timeout_s: float) -> None:
        self.instance = cls()
        methods = [getattr(self.instance, name) for name in _trl_tools(cls)]
        tools, schemas = as_tools(methods)
        reward = getattr(self.instance, "get_reward", None)
        self.env = ToolEnv(
            tools,
            schemas,
            reward=(lambda env: float(reward())) if reward is not None else None,
            opening=self._opening,
            max_calls=max_calls,
            tool_timeout_s=tool_timeout_s,
        )

    def _opening(self, row: Mapping[str, Any]) -> list[dict[str, Any]]:
        observation = self.instance.reset(**row)
        prompt = row.get("prompt", "")
        messages = (
            [dict(m) for m in prompt]
            if isinstance(prompt, list)
            else [{"role": "user", "content": str(prompt)}]
        )
        if observation:
            messages[-1]["content"] = f"{messages[-1]['content']}{observation}"
        return messages

    def reset(self, row: Mapping[str, Any], *, seed: int):
        return self.env.reset(row, seed=seed)

    def step(self, reply: str):
        return self.env.step(reply)

    def close(self) -> None:
        close = getattr(self.instance, "close", None)
        if callable(close):
            close()


class _TRLFactory:
    def __init__(self, cls: type, max_calls: int = 8, tool_timeout_s: float = 5.0) -> None:
        self.cls, self.max_calls, self.tool_timeout_s = cls, max_calls, tool_timeout_s
        self.max_turns = getattr(cls, "max_turns", DEFAULT_MAX_TURNS)

    def __call__(self) -> TRLEnvironment:
        return TRLEnvironment(self.cls, self.max_calls, self.tool_timeout_s)


def load_environment(spec: str) -> Callable[[], Any]:
    """The environment factory `spec` names (module docstring); a one-line `EnvFileError`
    before training for a missing file, a failing import, a missing or unusable NAME."""
    where, name = _split(spec)
    module = _module(spec, where)
    if not hasattr(module, name):
        found = _candidates(module)
        hint = f"; environments there: {', '.join(found)}" if found else ""
        raise EnvFileError(f"--env {spec}: {where} has no {name}{hint}")
    value = getattr(module, name)
    if isinstance(value, ToolEnvFactory):
        return value
    if inspect.isclass(value):
        kind = _reset_kind(value) if hasattr(value, "reset") else ""
        if kind == "rlvr":
            for method in ("step", "close"):
                if not callable(getattr(value, method, None)):
                    raise EnvFileError(
                        f"--env {spec}: {name} has reset(row, *, seed) but no {method}()"
                    )
            return value
        if kind == "trl":
            if not _trl_tools(value):
                raise EnvFileError(
                    f"--env {spec}: {name} looks like a TRL environment (reset(**row)) but has "
                    "no public methods to offer as tools"
                )
            return _TRLFactory(value)
        raise EnvFileError(
            f"--env {spec}: {name} is a class but not an environment: it needs reset(row, *, "
            "seed) with step(reply) and close() (rlvr's), or reset(**row) and tool methods "
            "(TRL's)"
        )
    if callable(value):
        try:
            parameters = inspect.signature(value).parameters
        except (TypeError, ValueError):
            parameters = {}
        if any(
            p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            for p in parameters.values()
        ):
            raise EnvFileError(
                f"--env {spec}: {name} is a function with required arguments; an environment "
                "factory takes none"
            )
        return value
    raise EnvFileError(
        f"--env {spec}: {name} is a {type(value).__name__}, not an environment (a class, a "
        "factory function or a tool_env)"
    )


def _module_rows(spec: str) -> tuple[Callable[[], list[Row]], Callable[[int], Iterator[Row]]]:
    where, _ = _split(spec)
    module = _module(spec, where)
    held_out = getattr(module, "held_out_rows", None)
    train = getattr(module, "train_rows", None)
    if callable(held_out) and callable(train):
        return held_out, train
    rows = getattr(module, "ROWS", None)
    if isinstance(rows, list) and len(rows) >= 2 and all(isinstance(r, dict) for r in rows):
        cut = int(getattr(module, "HELD_OUT", max(1, len(rows) // 10)))
        if not 0 < cut < len(rows):
            raise EnvFileError(f"--env {spec}: HELD_OUT must be in 1..{len(rows) - 1}, got {cut}")
        return (lambda: [dict(r) for r in rows[:cut]]), (
            lambda seed: endless_shuffles(rows[cut:], seed)
        )
    raise EnvFileError(
        f"--env {spec}: no rows: pass --task FILE, or define held_out_rows() and "
        f"train_rows(seed), or a list ROWS, in {where}"
    )


def _no_corpus(seed: int, flaw_prob: float) -> Iterator[tuple[str, str]]:
    raise EnvFileError(
        "an environment of your own has no corpus to pretrain a base on; pass --model DIR"
    )


def _no_grade(*args: Any, **kwargs: Any) -> Any:
    raise EnvFileError(
        "--env.reward verifier|both grades the final reply with the task's verifier: pass "
        "--task FILE (whose rows name an answer), or keep --env.reward env"
    )


def user_env_task(spec: str, rows: TaskSpec | None) -> TaskSpec:
    """The TaskSpec of `--env spec`: its environment, on the rows of `rows` (the task of
    `--task FILE`, with its verifier and budget) or of the environment's module."""
    factory = load_environment(spec)
    max_turns = int(getattr(factory, "max_turns", DEFAULT_MAX_TURNS))
    max_tokens = int(getattr(factory, "max_tokens", DEFAULT_MAX_TOKENS))
    if rows is not None:
        held_out, train = rows.held_out_rows, rows.train_rows
        reward_fn, score, budget = rows.reward_fn, rows.score, rows.max_new_tokens
    else:
        held_out, train = _module_rows(spec)
        reward_fn, score, budget = _no_grade, _no_grade, DEFAULT_REPLY_TOKENS
    return TaskSpec(
        name=spec,
        held_out_rows=held_out,
        train_rows=train,
        corpus=_no_corpus,
        reward_fn=reward_fn,
        score=score,
        max_new_tokens=budget,
        describe=f"the environment {spec}",
        environment=factory,
        max_turns=max_turns,
        episode_tokens=max_tokens,
    )
