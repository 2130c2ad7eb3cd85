"""`--resume RUN` for the trainers `rlvr sft` and `rlvr dpo`: the run's saved config.yaml, and a
one-line refusal of any other setting.

The lab's `resume_config` (`rlvr.pipelines.lab`) is the same rule for `LabConfig`, with its
rollout placement kept unless given; this one is the smaller version: the fields in `free`
(dotted paths: `place.device`) come from the call (where the run writes, how it shows
progress, the device), every other field must be its default or equal the saved value.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypeVar

from rlvr.config import ConfigError, UserError, from_dict, read_yaml, to_dict
from rlvr.pipelines.common import field_at

T = TypeVar("T")

UNPREFIXED = ("place", "task")
"""The parts whose flags have no prefix: `place.threads` is `--threads`, `task.name` `--task`."""


def resumed_config(given: T, run_dir: str | Path, free: tuple[str, ...], command: str) -> T:
    """The saved config of the run in `run_dir` (its config.yaml, as `type(given)`, of the
    nested layout or the older flat one), with the `free` fields (dotted paths; a part's name
    frees all of it) taken from `given`. Any other field of `given` that is neither its
    default nor the saved value would be ignored, so it is refused (`ConfigError` naming the
    fields as their flags spell them); a directory without config.yaml is a `UserError`
    ("nothing to resume"). `command` names the command in the messages (e.g. "rlvr sft")."""
    run_dir = Path(run_dir)
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        raise UserError(f"{command} --resume {run_dir}: it has no config.yaml, nothing to resume")
    saved = from_dict(type(given), read_yaml(saved_path) or {}, where=str(saved_path))
    differ = differing_settings(given, saved, free)
    if differ:
        raise ConfigError(
            f"{command} --resume continues {run_dir} with its saved config.yaml; these settings "
            f"differ from it and would be ignored, so they are refused: {', '.join(differ)}"
        )
    for path in free:
        saved = _replaced(saved, path.split("."), field_at(given, path))
    return saved


def differing_settings(given: T, saved: T, free: tuple[str, ...]) -> list[str]:
    """The settings of `given` outside `free` (dotted paths; a part's name frees all of it)
    that are neither their default (`type(given)()`) nor `saved`'s value, as their flags spell
    them: what a resume would ignore, so refuses."""
    given_flat, default, kept = (_flat(to_dict(c)) for c in (given, type(given)(), saved))
    return [
        flag_name(key)
        for key, value in given_flat.items()
        if not _is_free(key, free) and value != default.get(key) and value != kept.get(key)
    ]


def flag_name(key: str) -> str:
    """A dotted field path as its flag spells it, without `--`: `place.threads` -> `threads`,
    `task.name` -> `task`, `task.arithmetic.digits` -> `arithmetic.digits`."""
    part, _, rest = key.partition(".")
    if part not in UNPREFIXED or not rest:
        return key
    return "task" if key == "task.name" else rest


def _is_free(key: str, free: tuple[str, ...]) -> bool:
    """Whether the dotted `key` is one of `free` or inside one."""
    return any(key == path or key.startswith(f"{path}.") for path in free)


def _replaced(obj: T, parts: list[str], value: Any) -> T:
    """The dataclass `obj` with the field at the path `parts` set to `value`."""
    head, *rest = parts
    inner = _replaced(getattr(obj, head), rest, value) if rest else value
    return dataclasses.replace(obj, **{head: inner})


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict as {dotted.key: leaf value}."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
