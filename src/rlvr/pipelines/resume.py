"""`--resume RUN` for the trainers whose config is one flat dataclass (`rlvr sft`, `rlvr dpo`):
the run's saved config.yaml, and a one-line refusal of any other setting.

The lab's `resume_config` (`rlvr.pipelines.lab`) is the same rule for `LabConfig`, with its
rollout placement kept unless given; this one is the smaller version: the fields in `free` come
from the call (where the run writes, how it shows progress, the device), every other field must
be its default or equal the saved value.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypeVar

from rlvr.config import ConfigError, UserError, from_dict, read_yaml, to_dict

T = TypeVar("T")


def resumed_config(given: T, run_dir: str | Path, free: tuple[str, ...], command: str) -> T:
    """The saved config of the run in `run_dir` (its config.yaml, as `type(given)`), with the
    `free` fields taken from `given`. Any other field of `given` that is neither its default
    nor the saved value would be ignored, so it is refused (`ConfigError` naming the fields);
    a directory without config.yaml is a `UserError` ("nothing to resume"). `command` names
    the command in the messages (e.g. "rlvr sft")."""
    run_dir = Path(run_dir)
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        raise UserError(f"{command} --resume {run_dir}: it has no config.yaml, nothing to resume")
    data = read_yaml(saved_path) or {}
    for key in free:
        data.pop(key, None)
    cls = type(given)
    saved = from_dict(cls, data, where=str(saved_path))
    top = {f.name for f in dataclasses.fields(cls)}
    given_flat, default, kept = (_flat(to_dict(c)) for c in (given, cls(), saved))
    differ = [
        key
        for key, value in given_flat.items()
        if key.split(".")[0] not in free
        and key.split(".")[0] in top
        and value != default.get(key)
        and value != kept.get(key)
    ]
    if differ:
        raise ConfigError(
            f"{command} --resume continues {run_dir} with its saved config.yaml; these settings "
            f"differ from it and would be ignored, so they are refused: {', '.join(differ)}"
        )
    return dataclasses.replace(saved, **{key: getattr(given, key) for key in free})


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict as {dotted.key: leaf value}."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
