"""An environment served over HTTP: a small standard-library client (`urllib`), one session per
episode, speaking two shapes of the reset/step protocol.

rlvr's shape (a server written for rlvr):

    POST /reset {"row": {...}, "seed": 7}
         -> {"messages": [...], "tools": [...], "info": {...}, "episode_id": "..."}
    POST /step  {"reply": "...", "episode_id": "..."}
         -> {"messages": [...], "reward": 0.0 | null, "done": false, "info": {...}}
    POST /close {"episode_id": "..."}                  (errors ignored)

OpenEnv's shape (meta-pytorch/OpenEnv's HTTP servers), chosen with `openenv=True`:

    POST /reset {"seed": 7, ...row}               -> {"observation": {...}, "reward", "done"}
    POST /step  {"action": {ACTION_FIELD: reply}} -> {"observation": {...}, "reward", "done"}

where the observation becomes one user message: its `observation_field` when given, else the
observation itself when it is a string, else its JSON. (OpenEnv's servers keep one episode per
server or per connection; run one server per concurrent episode, or a server that keys
sessions by `episode_id`.)

A refused connection, an HTTP error, a timeout or a body that is not JSON raises
`HTTPEnvError` naming the URL: the episode loop scores that episode 0 with status "error" (or
"timeout" past `--env.step-timeout-s`) and the batch goes on.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

Message = dict[str, Any]


class HTTPEnvError(RuntimeError):
    """The environment server did not answer as the protocol says."""


class HTTPEnv:
    """One episode of an environment behind `base_url` (module docstring)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 10.0,
        openenv: bool = False,
        action_field: str = "message",
        observation_field: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s, self.openenv = timeout_s, openenv
        self.action_field, self.observation_field = action_field, observation_field
        self.episode_id: Any = None

    def _post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}{path}"
        request = urllib.request.Request(
            url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            raise HTTPEnvError(f"POST {url}: HTTP {exc.code} {exc.reason}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise HTTPEnvError(f"POST {url}: {reason}") from exc
        try:
            answer = json.loads(text)
        except json.JSONDecodeError as exc:
            raise HTTPEnvError(f"POST {url}: the answer is not JSON ({text[:60]!r})") from exc
        if not isinstance(answer, dict):
            raise HTTPEnvError(f"POST {url}: expected a JSON object, got {type(answer).__name__}")
        return answer

    def _observation(self, answer: Mapping[str, Any]) -> list[Message]:
        observation = answer.get("observation")
        if self.observation_field is not None and isinstance(observation, dict):
            observation = observation.get(self.observation_field, "")
        if observation is None or observation == "":
            return []
        text = observation if isinstance(observation, str) else json.dumps(observation)
        return [{"role": "user", "content": text}]

    def reset(
        self, row: Mapping[str, Any], *, seed: int
    ) -> tuple[list[Message], list[dict[str, Any]], dict[str, Any]]:
        if self.openenv:
            answer = self._post("/reset", {**row, "seed": seed})
            return self._observation(answer), [], {}
        answer = self._post("/reset", {"row": dict(row), "seed": seed})
        self.episode_id = answer.get("episode_id")
        return answer.get("messages"), answer.get("tools") or [], answer.get("info") or {}

    def step(self, reply: str) -> tuple[list[Message], float | None, bool, dict[str, Any]]:
        if self.openenv:
            answer = self._post("/step", {"action": {self.action_field: reply}})
            messages = [] if answer.get("done") else self._observation(answer)
        else:
            answer = self._post("/step", {"reply": reply, "episode_id": self.episode_id})
            messages = answer.get("messages")
        reward = answer.get("reward")
        return messages, reward, bool(answer.get("done")), answer.get("info") or {}

    def close(self) -> None:
        if self.openenv:
            return
        try:
            self._post("/close", {"episode_id": self.episode_id})
        except HTTPEnvError:
            pass


class HTTPEnvFactory:
    """A zero-argument factory of `HTTPEnv`s on one server (`http_env`)."""

    def __init__(self, base_url: str, **options: Any) -> None:
        self.base_url, self.options = base_url, options

    def __call__(self) -> HTTPEnv:
        return HTTPEnv(self.base_url, **self.options)


def http_env(base_url: str, **options: Any) -> HTTPEnvFactory:
    """An environment factory for the server at `base_url`; `options` as `HTTPEnv`'s
    (`timeout_s`, `openenv`, `action_field`, `observation_field`)."""
    return HTTPEnvFactory(base_url, **options)
