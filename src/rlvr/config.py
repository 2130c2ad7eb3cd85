"""`--set key=value` overrides of a dataclass config, with errors that name the valid keys."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def apply_overrides(config: T, assignments: dict[str, Any] | list[str]) -> T:
    """A copy of the dataclass `config` with fields replaced.

    `assignments` is a dict of field -> value, or `key=value` strings whose values are parsed by
    the field's type (bool accepts true/false/1/0; `none` gives None for optional fields). An
    unknown key raises ValueError naming the valid keys and the nearest match.
    """
    if isinstance(assignments, list):
        assignments = dict(_split(a) for a in assignments)
    fields = {f.name: f for f in dataclasses.fields(config)}
    hints = typing.get_type_hints(type(config))
    changes = {}
    for key, value in assignments.items():
        name = key.replace("-", "_")
        if name not in fields:
            nearest = difflib.get_close_matches(name, fields, n=1)
            hint = f" (did you mean {nearest[0]!r}?)" if nearest else ""
            raise ValueError(f"unknown key {key!r}{hint}; valid keys: {', '.join(sorted(fields))}")
        changes[name] = _coerce(value, hints[name], key) if isinstance(value, str) else value
    return dataclasses.replace(config, **changes)


def _split(assignment: str) -> tuple[str, str]:
    key, sep, value = assignment.partition("=")
    if not sep or not key:
        raise ValueError(f"expected key=value, got {assignment!r}")
    return key.strip(), value.strip()


def _coerce(text: str, annotation: Any, key: str) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if type(None) in options and text.lower() in ("none", "null", ""):
            return None
        annotation = next(a for a in options if a is not type(None))
    try:
        if annotation is bool:
            lowered = text.lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(text)
            return lowered in ("true", "1", "yes")
        if annotation in (int, float, str):
            return annotation(text)
    except ValueError:
        raise ValueError(f"{key}={text!r} is not a valid {annotation.__name__}") from None
    raise ValueError(f"{key} has type {annotation} which --set cannot parse")


def config_from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Rebuild a (nested) dataclass config from its `dataclasses.asdict` form, e.g. a run's
    config.yaml. Unknown keys are refused, naming the valid ones."""
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - fields
    if unknown:
        raise ValueError(
            f"unknown key(s) {sorted(unknown)} for {cls.__name__}; valid keys: {sorted(fields)}"
        )
    values = {}
    for name, value in data.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = config_from_dict(hint, value)
        elif typing.get_origin(hint) is tuple and isinstance(value, list):
            value = tuple(value)
        values[name] = value
    return cls(**values)
