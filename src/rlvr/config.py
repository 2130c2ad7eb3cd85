"""Typed configs: frozen dataclasses built from dicts, YAML files and `--set key=value` text.

Every value is checked against its field's annotation, so a mistake in a config file fails
when the file is read, naming the field, rather than deep inside a run. Supported annotations:
int, float, bool, str, `X | None` (and Optional, other unions), Literal, tuple[...] and list[...]
of those, dict[K, V], nested dataclasses and Any. A union of dataclasses that each have a str
`name` field (a tagged union, e.g. `GRPOConfig.surrogate`) takes a mapping with that `name`
(`{name: cispo, epsilon_high: 4.0}`) or the name alone (its defaults); a key of another member
is refused naming the member it belongs to. A class's `RENAMED` ClassVar (old field name ->
its new place) turns an old key into an error that names the new spelling. Other annotations
are checked with `isinstance` when they are classes and passed through unchecked otherwise.

Coercions, the only ones (each lossless, each what YAML or a command line produces):
- an int for a float field becomes a float; a bool is never a number (True is an int in Python);
- a str for a non-str field is read as text, on every path (PyYAML reads `lr: 5e-4` as the
  string '5e-4', and `--set key=value` passes strings): `int(text)` for int, `float(text)` for
  float, true/false/yes/no/1/0 (any case) for bool, none/null/'' (any case) for the None of an
  optional field, and a Literal option whose str() is the text;
- a list or tuple for a tuple[...] or list[...] field becomes that container.

Errors are `ConfigError`, one line: the field path, the type expected and the value given,
e.g. `stages[2].grpo.lr: expected float, got '5e-4x' (str, not a valid float)`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

T = TypeVar("T")

_NONE_TEXT = ("none", "null", "")
_BOOL_TEXT = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


class UserError(Exception):
    """A mistake in the user's input: the CLI prints its message on one line and exits 2."""


def warn(message: str) -> None:
    """A user-facing warning: one `[rlvr] warning:` line on stderr."""
    print(f"[rlvr] warning: {message}", file=sys.stderr, flush=True)


class RunExistsError(UserError, FileExistsError):
    """A run directory or output file that exists already, without `--overwrite`."""


class ConfigError(UserError, ValueError):
    """A config key or value that does not fit its dataclass; the message names the field path.

    A ValueError too, so callers that caught the untyped errors of earlier versions still do.
    """


@dataclasses.dataclass(frozen=True)
class RunPlace:
    """Where and how a run runs: its device and precision, CPU threads, seed, progress output
    and whether it may replace its output. The entry points nest it without a prefix
    (`--device`, `--seed`, `--no-progress`, `--overwrite`, ...); one that takes some of these
    elsewhere hides them (a subclass with those fields `tyro.conf.Suppress`ed)."""

    device: str = "auto"
    """Where the model runs: auto (CUDA when present, else the CPU), cpu, cuda or cuda:N."""
    dtype: str = "auto"
    """Compute precision: auto (bfloat16 autocast on CUDA, float32 on the CPU), float32 or
    bfloat16. Weights and optimizer state stay float32."""
    threads: int = 2
    """CPU threads (torch.set_num_threads; the CPU only)."""
    seed: int = 0
    """Seed of the run (sampling, data order)."""
    progress: bool = True
    """Show progress bars and the `[rlvr]` progress lines."""
    overwrite: bool = False
    """Replace an existing run directory or output file of the same name."""


MOVED_KEYS_ATTR = "MOVED_KEYS"
"""A dataclass may map keys of its older, flat layout to their dotted places in the nested one
(`{"seed": "place.seed"}`) in a class attribute of this name; `from_dict` moves them, so saved
configs of the older layout still load."""


def flat_layout_moves(place: tuple[str, ...], task: tuple[str, ...] = ()) -> dict[str, str]:
    """The `MOVED_KEYS` of an entry config that nests a `RunPlace` as `place` and a task part
    as `task`: each flat key of `place` -> `place.KEY`; with `task` fields, the flat `task` (the
    name) -> `task.name` and each of `task` -> `task.KEY`."""
    moves = {key: f"place.{key}" for key in place}
    if task:
        moves |= {"task": "task.name", **{key: f"task.{key}" for key in task}}
    return moves


UPGRADE_ATTR = "UPGRADE"
"""A dataclass whose older layout needs more than moving keys (a value that decides where the
others go) may hold, in a class attribute of this name, a function turning a mapping of that
layout into today's; `from_dict` calls it first (`GRPOConfig`'s flat surrogate clips)."""


# --- public functions ---------------------------------------------------------------------


def from_dict(cls: type[T], data: Mapping[str, Any], *, where: str = "") -> T:
    """Build the dataclass `cls` from `data`, checking every value against its annotation.

    Nested dataclass fields are built from nested mappings; fields missing from `data` keep
    their defaults. A mapping of an older layout is first upgraded by `cls.UPGRADE` when the
    class has one, and keys of an older flat layout that `cls.MOVED_KEYS` names are moved to
    their nested places (a key also a field of `cls` moves only when its value is no mapping).
    `where` is the path of `data` inside a larger document (e.g. `stages[2].grpo`) and prefixes
    every field path in errors. Raises ConfigError for an
    unknown key (naming the nearest valid one), a missing required key or a wrong type.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or cls.__name__}: {_mismatch_text(cls, data)}")
    fields = _init_fields(cls)
    upgrade = getattr(cls, UPGRADE_ATTR, None)
    if upgrade is not None:
        data = upgrade(data)
    data = _move_flat_keys(cls, data, fields)
    for key in data:
        _check_known(key, fields, where, renamed=getattr(cls, "RENAMED", None))
    missing = [name for name, f in fields.items() if name not in data and _required(f)]
    if missing:
        raise ConfigError(f"{_prefix(where)}missing required key(s): {', '.join(missing)}")
    hints = _type_hints(cls)
    values = {
        name: _convert(value, hints[name], _join(where, name)) for name, value in data.items()
    }
    return cls(**values)


def config_from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
    """Rebuild a (nested) dataclass config from its dict form, e.g. a run's config.yaml.

    The same as `from_dict(cls, data)`, kept for existing callers.
    """
    return from_dict(cls, data)


def apply_overrides(
    config: T, assignments: Mapping[str, Any] | Sequence[str], *, where: str = ""
) -> T:
    """A copy of the dataclass `config` with some fields replaced, each value type-checked.

    `assignments` is a mapping of key -> value or a list of `key=value` strings (the values
    then are text, read by the field's annotation as the module docstring says). Keys may use
    `-` for `_` and may be dotted (`grpo.lr`) to reach into nested dataclass fields; a mapping
    given for a nested dataclass field overrides only the keys it names. `where` prefixes the
    field paths in errors. Raises ConfigError for a malformed assignment, an unknown key
    (naming the nearest valid one and the valid keys) or a wrong type.
    """
    if isinstance(assignments, str):
        raise TypeError("assignments must be a mapping or a list of key=value strings")
    if not isinstance(assignments, Mapping):
        assignments = dict(_split(a) for a in assignments)
    fields, hints = _init_fields(type(config)), _type_hints(type(config))
    renamed = getattr(type(config), "RENAMED", None)
    changes: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in assignments.items():
        name, dot, rest = str(key).replace("-", "_").partition(".")
        _check_known(name, fields, where, shown=str(key).partition(".")[0], renamed=renamed)
        tags = _tagged_options(hints[name])
        if dot:
            nested.setdefault(name, {})[rest] = value
        elif isinstance(value, Mapping) and (
            _is_dataclass_type(hints[name]) or (tags is not None and "name" not in value)
        ):
            nested.setdefault(name, {}).update(value)
        else:
            changes[name] = _convert(value, hints[name], _join(where, name))
    for name, sub in nested.items():
        inner = changes.get(name, getattr(config, name))
        path = _join(where, name)
        tags = _tagged_options(hints[name])
        if tags is not None and "name" in sub:  # another member: its defaults, then `sub`
            changes[name] = _to_tagged(sub, tags, path)
            continue
        if not dataclasses.is_dataclass(inner) or isinstance(inner, type):
            raise ConfigError(f"{path}: {type(inner).__name__} has no fields to set")
        if tags is not None:
            _check_member_keys(sub, type(inner), tags, path)
        changes[name] = apply_overrides(inner, sub, where=path)
    return dataclasses.replace(config, **changes)


def to_dict(config: Any) -> dict[str, Any]:
    """The dataclass `config` as plain data (dicts, lists, scalars) for a config.yaml.

    The inverse of `from_dict`: `from_dict(type(c), to_dict(c)) == c`. Tuples become lists;
    fields with `init=False` are left out (from_dict could not set them).
    """
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"to_dict takes a dataclass instance, got {type(config).__name__}")
    return {f.name: _plain(getattr(config, f.name)) for f in dataclasses.fields(config) if f.init}


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """The data of the YAML file `path` (None for an empty file); an unreadable file or invalid
    YAML is a one-line ConfigError that starts with the file's path."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the file ({exc.strerror or exc})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML{_yaml_problem(exc)}") from None


def load_yaml_config(cls: type[T], path: str | os.PathLike[str], *, where: str = "") -> T:
    """Read the YAML file `path` into the dataclass `cls` with `from_dict`.

    An empty file gives the defaults. Every error (unreadable file, invalid YAML, unknown key,
    wrong type) is a one-line ConfigError that starts with the file's path.
    """
    path = Path(path)
    data = read_yaml(path)
    try:
        return from_dict(cls, {} if data is None else data, where=where)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


# --- checking one value against one annotation ----------------------------------------------


def _convert(value: Any, hint: Any, path: str) -> Any:
    """`value` as the annotation `hint` asks, or a ConfigError naming `path`."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if _is_dataclass_type(hint):
        return _to_dataclass(value, hint, path)
    if origin in (typing.Union, types.UnionType):
        return _to_union(value, hint, path)
    if origin is Literal:
        return _to_literal(value, hint, path)
    if origin in (tuple, list) or hint in (tuple, list):
        return _to_sequence(value, hint, path)
    if origin is dict or hint is dict:
        return _to_mapping(value, hint, path)
    if hint in (bool, int, float, str):
        return _to_scalar(value, hint, path)
    if isinstance(hint, type) and not isinstance(value, hint):
        raise _mismatch(path, hint, value)
    return value


def _to_scalar(value: Any, hint: type, path: str) -> Any:
    """A bool, int, float or str for `hint`: exact types, int -> float, text read by type."""
    if isinstance(value, str) and hint is not str:
        return _parse_text(value, hint, path)
    if isinstance(value, bool) != (hint is bool):  # True is an int, but never a number here
        raise _mismatch(path, hint, value)
    if hint is float and isinstance(value, int):
        return float(value)
    if isinstance(value, hint):
        return value
    raise _mismatch(path, hint, value)


def _parse_text(text: str, hint: type, path: str) -> Any:
    """The bool, int or float that `text` spells, or a ConfigError."""
    if hint is bool:
        parsed = _BOOL_TEXT.get(text.strip().lower())
        if parsed is not None:
            return parsed
    else:
        try:
            return hint(text)
        except ValueError:
            pass
    raise _mismatch(path, hint, text, note=f"not a valid {hint.__name__}")


def _to_union(value: Any, hint: Any, path: str) -> Any:
    """The first option of the union `hint` that takes `value` (exact types tried first)."""
    options = typing.get_args(hint)
    none_ok = type(None) in options
    if value is None and none_ok:
        return None
    if none_ok and isinstance(value, str) and value.strip().lower() in _NONE_TEXT:
        return None
    tags = _tagged_options(hint)
    if tags is not None:
        return _to_tagged(value, tags, path)
    others = [o for o in options if o is not type(None)]
    if len(others) == 1:  # `X | None`: X's own error is the precise one
        return _convert(value, others[0], path)
    exact = [o for o in others if type(value) is o]
    for option in exact + others:
        try:
            return _convert(value, option, path)
        except ConfigError:
            continue
    raise _mismatch(path, hint, value)


def _tagged_options(hint: Any) -> dict[str, type] | None:
    """{tag: class} when `hint` is a tagged union: a union (None aside) of dataclasses that
    each have a `name` field whose default is a str, the tag; otherwise None."""
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return None
    tags: dict[str, type] = {}
    for option in typing.get_args(hint):
        if option is type(None):
            continue
        tag = _init_fields(option).get("name") if _is_dataclass_type(option) else None
        if tag is None or not isinstance(tag.default, str):
            return None
        tags[tag.default] = option
    return tags


def _to_tagged(value: Any, tags: Mapping[str, type], path: str) -> Any:
    """A member of a tagged union: an instance as it is, a tag alone (text) as that member's
    defaults, or a mapping as the member its `name` picks, built from the other keys."""
    names = ", ".join(tags)
    if isinstance(value, tuple(tags.values())):
        return value
    if isinstance(value, str):
        if value.strip() not in tags:
            raise ConfigError(f"{path}: unknown {value!r}; choose one of: {names}")
        return tags[value.strip()]()
    if not isinstance(value, Mapping):
        raise _mismatch(path, " | ".join(tags), value)
    tag = value.get("name")
    if tag is None:
        first = next(iter(tags))
        raise ConfigError(
            f"{path}: say which one with name, one of: {names} (e.g. {{name: {first}, ...}})"
        )
    if tag not in tags:
        raise ConfigError(f"{_join(path, 'name')}: unknown {tag!r}; choose one of: {names}")
    _check_member_keys(value, tags[tag], tags, path)
    return from_dict(tags[tag], value, where=path)


def _check_member_keys(keys: Any, cls: type, tags: Mapping[str, type], path: str) -> None:
    """Refuse a key of another member of the tagged union `tags` given to member `cls`, naming
    the members it belongs to (an unknown key is `from_dict`'s to refuse)."""
    own = _init_fields(cls)
    for key in keys:
        key = str(key).replace("-", "_").partition(".")[0]
        owners = [tag for tag, option in tags.items() if key in _init_fields(option)]
        if key not in own and owners:
            mine = own["name"].default
            raise ConfigError(
                f"{_join(path, key)} belongs to {' / '.join(owners)}, not {mine}: set name: "
                f"{owners[0]} to use it, or leave it out"
            )


def _to_literal(value: Any, hint: Any, path: str) -> Any:
    """One of the Literal's options: equal and of the same type, or spelled by text."""
    options = typing.get_args(hint)
    for option in options:
        if type(value) is type(option) and value == option:
            return option
    if isinstance(value, str):
        for option in options:
            if str(option).lower() == value.strip().lower() and not isinstance(option, str):
                return option
    raise _mismatch(path, hint, value)


def _to_sequence(value: Any, hint: Any, path: str) -> Any:
    """A tuple or list (by `hint`) of checked items from a list or tuple `value`."""
    container = typing.get_origin(hint) or hint
    args = typing.get_args(hint)
    if not isinstance(value, (list, tuple)):
        raise _mismatch(path, hint, value)
    if not args:
        item_hints: list[Any] = [Any] * len(value)
    elif container is list or (len(args) == 2 and args[1] is Ellipsis):
        item_hints = [args[0]] * len(value)
    elif len(args) == len(value):
        item_hints = list(args)
    else:
        raise _mismatch(path, hint, value, note=f"{len(value)} items")
    items = [_convert(v, h, f"{path}[{i}]") for i, (v, h) in enumerate(zip(value, item_hints))]
    return container(items)


def _to_mapping(value: Any, hint: Any, path: str) -> dict[Any, Any]:
    """A dict of checked keys and values; a value's path is `path.key`."""
    if not isinstance(value, Mapping):
        raise _mismatch(path, hint, value)
    key_hint, value_hint = typing.get_args(hint) or (Any, Any)
    return {
        _convert(k, key_hint, f"{path}: key {k!r}"): _convert(v, value_hint, _join(path, str(k)))
        for k, v in value.items()
    }


def _to_dataclass(value: Any, cls: type, path: str) -> Any:
    """An instance of the dataclass `cls` as it is, or one built from a mapping."""
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return from_dict(cls, value, where=path)
    raise _mismatch(path, cls, value)


# --- helpers ------------------------------------------------------------------------------


def _move_flat_keys(
    cls: type, data: Mapping[str, Any], fields: Mapping[str, Any]
) -> Mapping[str, Any]:
    """`data` with the keys of `cls`'s older flat layout (`MOVED_KEYS`) moved to their dotted
    places (`seed` -> `place: {seed: ...}`); a value given in both places is refused."""
    moved: Mapping[str, str] = getattr(cls, MOVED_KEYS_ATTR, {})
    old = [k for k in data if k in moved and not (k in fields and isinstance(data[k], Mapping))]
    if not old:
        return data
    out = {k: v for k, v in data.items() if k not in old}
    for key in old:
        *parents, leaf = moved[key].split(".")
        node = out
        for part in parents:
            inner = node.get(part, {})
            if not isinstance(inner, Mapping):
                raise ConfigError(f"{part}: expected a mapping, got {inner!r}")
            node[part] = node = dict(inner)
        if leaf in node:
            raise ConfigError(f"{key} and {moved[key]} both given: keep one ({moved[key]})")
        node[leaf] = data[key]
    return out


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of `cls` (string annotations evaluated in its module)."""
    return typing.get_type_hints(cls)


def _init_fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    """The fields of the dataclass `cls` that its constructor takes, by name."""
    if not _is_dataclass_type(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _is_dataclass_type(hint: Any) -> bool:
    """Whether `hint` is a dataclass class (not an instance)."""
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _required(f: dataclasses.Field[Any]) -> bool:
    """Whether the field has no default."""
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _check_known(
    name: Any,
    fields: Mapping[str, Any],
    where: str,
    shown: Any = None,
    renamed: Mapping[str, str] | None = None,
) -> None:
    """Refuse a key that names no field, with the nearest valid key and all of them; `shown`
    is the key as the user wrote it (default: `name`). A key in `renamed` (a class's `RENAMED`:
    an old field name -> where it lives now) is refused naming its new place."""
    if name in fields:
        return
    shown = name if shown is None else shown
    if renamed and name in renamed:
        raise ConfigError(
            f"{_prefix(where)}{shown!r} was renamed: write {renamed[name]} (the settings of "
            "one component are grouped in its own config)"
        )
    nearest = difflib.get_close_matches(str(name), list(fields), n=1)
    hint = f" (did you mean {nearest[0]!r}?)" if nearest else ""
    valid = ", ".join(sorted(fields))
    raise ConfigError(f"{_prefix(where)}unknown key {shown!r}{hint}; valid keys: {valid}")


def _split(assignment: str) -> tuple[str, str]:
    """`key=value` as (key, value), both stripped."""
    key, sep, value = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"expected key=value, got {assignment!r}")
    return key.strip(), value.strip()


def _plain(value: Any) -> Any:
    """`value` with dataclasses as dicts and tuples as lists, recursively."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _join(where: str, name: str) -> str:
    """The path of field `name` inside `where`."""
    return f"{where}.{name}" if where else name


def _prefix(where: str) -> str:
    """`where: ` or nothing at the top level."""
    return f"{where}: " if where else ""


def _type_name(hint: Any) -> str:
    """A short readable name of an annotation: `float | None`, `tuple[str, ...]`, `'a' | 'b'`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else _type_name(a) for a in args)
        return f"{getattr(origin, '__name__', origin)}[{inner}]"
    if hint is type(None):
        return "None"
    return getattr(hint, "__name__", str(hint))


def _mismatch_text(hint: Any, value: Any, note: str = "") -> str:
    """`expected float, got '5e-4x' (str)`, the value's repr shortened to keep one line and
    `note` (why a value of the right kind was refused) added after its type."""
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    detail = f"{type(value).__name__}, {note}" if note else type(value).__name__
    return f"expected {_type_name(hint)}, got {shown} ({detail})"


def _mismatch(path: str, hint: Any, value: Any, note: str = "") -> ConfigError:
    """The ConfigError for `value` at `path` not fitting `hint`."""
    return ConfigError(f"{path}: {_mismatch_text(hint, value, note)}")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """` at line L, column C: problem` from a PyYAML error, on one line."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return f"{where}: {' '.join(str(problem).split())}"
