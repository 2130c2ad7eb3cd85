"""Every `rlvr` command that the README and docs/ show parses: its subcommand exists and each
flag it names is one of that subcommand's (tyro parses the line without running it).

Commands are read from fenced code blocks (``` ... ```) of README.md, docs/*.md and the
course's Markdown: each line that starts with `rlvr ` (after a `$ ` prompt, or after `&&`),
with `\\` continuations joined and `# comments` dropped. A placeholder in capitals (DIR, FILE,
RUN) parses as the string it is; a line with shell substitution (`$(...)`) is checked up to it.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from rlvr.cli import COMMANDS, LabConfig, RecipesConfig, parse_args, parse_lab

ROOT = Path(__file__).resolve().parents[1]
FILES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "course").glob("*.md")),
]


def commands(path: Path) -> list[tuple[int, str]]:
    """(line number, command) for each rlvr command in the fenced blocks of `path` (a block
    opened as ```text is a picture, not commands)."""
    found: list[tuple[int, str]] = []
    block: str | None = None  # None outside a fence, else the fence's info string
    pending, start = "", 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            block = line.strip()[3:] if block is None else None
            pending, start = "", 0
            continue
        if block is None or block == "text":
            continue
        text = pending + line.strip()
        if text.endswith("\\"):
            pending, start = text[:-1] + " ", start or number
            continue
        first, pending, start = start or number, "", 0
        for part in re.split(r"&&|;|\|", text):
            part = part.strip().removeprefix("$ ").strip()
            if part.startswith("rlvr "):
                found.append((first, part))
    return found


CASES = [
    pytest.param(command, id=f"{path.relative_to(ROOT)}:{number}")
    for path in FILES
    for number, command in commands(path)
]


def test_the_docs_show_commands() -> None:
    assert len(CASES) >= 40


@pytest.mark.parametrize("command", CASES)
def test_command_parses(command: str) -> None:
    command = command.split("$(")[0]
    try:
        argv = shlex.split(command, comments=True)[1:]
    except ValueError:
        pytest.fail(f"not a shell line: {command}")
    if argv and argv[0] == "--debug":
        argv = argv[1:]
    assert argv and argv[0] in COMMANDS, f"no subcommand {argv[:1]} in `{command}`"
    name, args = argv[0], argv[1:]
    _, config_type, _ = COMMANDS[name]
    if config_type is RecipesConfig and args and not args[0].startswith("-"):
        return  # positional: rlvr recipes show NAME
    if config_type is LabConfig:
        parse_lab(args, f"rlvr {name}")
    else:
        parse_args(config_type, args, f"rlvr {name}")
