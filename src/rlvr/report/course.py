"""`rlvr course build OUT`: the module's course as a static site, every number from a run.

The sources live in the checkout's ``course/`` (its README has the format): Markdown pages,
Mermaid diagrams, result files that rlvr's own commands wrote (``course/results.yaml`` names
each with its command) and numbers quoted from papers (``course/cited.yaml``). The build
fills every ``{{ ... }}`` placeholder from those files, refuses a typed decimal, percentage or
ratio that names no source, and writes four pages that open from ``file://`` with nothing
fetched: ``index.html`` (the teaching document), ``slides.html`` (reveal.js, speaker notes from
the script), ``script.html`` and ``lab.html``, plus ``numbers.json`` (every number filled in,
with its source) for the tests. The same sources give byte-identical output.
"""

from __future__ import annotations

import html
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlvr.config import UserError

MARKER = ".rlvr-course"  # written into OUT: a later build may replace what it finds there
PAGES = {  # source -> (output, title in the navigation bar)
    "document.md": ("index.html", "Teaching document"),
    "slides.md": ("slides.html", "Slides"),
    "script.md": ("script.html", "Teaching script"),
    "lab.md": ("lab.html", "Lab handout"),
}
REVEAL = "vendor/reveal.js-6.0.2"
MERMAID = "vendor/mermaid-12.3.0"
THEME = ("course.css", "course.js")

_PLACEHOLDER = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_BLOCK = re.compile(r"^\s*\{\{\s*(diagram|figure|code)\s+(\S+)\s*\}\}\s*$")
_NAME = re.compile(r"[a-z][a-z0-9_]*$")
# what may not be typed in prose: a decimal, a percentage, a ratio (1.4x, 3/4), 4,096
_TYPED_NUMBER = re.compile(
    r"(?<![\w.])(\d+(?:\.\d+)?\s?%|\d+(?:\.\d+)?x\b|\d{1,3}(?:,\d{3})+|\d+/\d+|\d+\.\d+)"
)
# what a number may sit inside without being a claim: code, a link's address, an arXiv id,
# a DOI-like id, a version or a model name (Qwen2.5-7B), a heading's number
_EXEMPT = re.compile(
    r"`[^`]*`|\]\([^)]*\)|arXiv:\d{4}\.\d{4,5}|s\d{5}-\d{3}-\d{5}-\w|[A-Za-z][\w-]*\d\.\d[\w.-]*"
    r"|v\d+(?:\.\d+)+"
)


class CourseError(UserError):
    """A course source that does not build: the message names the file and line."""


@dataclass(frozen=True)
class Result:
    """One result file that a command of rlvr wrote (an entry of course/results.yaml)."""

    name: str
    file: Path
    command: str
    about: str

    def data(self) -> Any:
        if not self.file.is_file():
            raise CourseError(
                f"{self.file}: missing; it is written by `{self.command}` (course/results.yaml "
                f"names it as {self.name})"
            )
        if self.file.suffix == ".json":
            return json.loads(self.file.read_text())
        if self.file.suffix == ".jsonl":
            return [json.loads(line) for line in self.file.read_text().splitlines() if line]
        return None


@dataclass(frozen=True)
class Cited:
    """A number quoted from a paper (an entry of course/cited.yaml)."""

    name: str
    value: str
    source: str


@dataclass
class Sources:
    root: Path
    results: dict[str, Result]
    cited: dict[str, Cited]
    numbers: list[dict[str, Any]] = field(default_factory=list)  # filled in, for numbers.json
    cache: dict[str, Any] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)  # every result a page names

    def value(self, name: str) -> Any:
        self.used.add(name)
        if name not in self.cache:
            self.cache[name] = self.results[name].data()
        return self.cache[name]


def default_source() -> Path:
    """The checkout's course/ (rlvr installed from its checkout, as the README installs it)."""
    return Path(__file__).resolve().parents[3] / "course"


def load_sources(root: Path) -> Sources:
    """Read results.yaml and cited.yaml under `root`; a malformed entry is a CourseError."""
    if not (root / "document.md").is_file():
        raise CourseError(
            f"{root}: no course sources here (document.md is missing); pass --source DIR, the "
            "checkout's course/ directory"
        )
    results: dict[str, Result] = {}
    for name, entry in _yaml_mapping(root / "results.yaml").items():
        where = f"{root / 'results.yaml'}: {name}"
        if not _NAME.match(str(name)) or name == "cited":
            raise CourseError(f"{where}: a result's name is lowercase letters, digits and _")
        if not isinstance(entry, dict) or not {"file", "command"} <= entry.keys():
            raise CourseError(f"{where}: needs file: and command: (and about:)")
        results[name] = Result(
            name, root / str(entry["file"]), str(entry["command"]), str(entry.get("about", ""))
        )
    cited: dict[str, Cited] = {}
    for path in sorted(root.glob("cited*.yaml")):  # cited.yaml, cited-slides.yaml, ...
        for name, entry in _yaml_mapping(path).items():
            if not isinstance(entry, dict) or not {"value", "source"} <= entry.keys():
                raise CourseError(f"{path}: {name}: needs value: and source:")
            if name in cited:
                raise CourseError(f"{path}: {name}: named twice among the cited*.yaml files")
            cited[name] = Cited(name, str(entry["value"]), str(entry["source"]))
    return Sources(root, results, cited)


def _yaml_mapping(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise CourseError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict):
        raise CourseError(f"{path}: must be a mapping of names to entries")
    return data


# --- placeholders -------------------------------------------------------------------------


REDUCERS = {
    "min": min,
    "max": max,
    "mean": lambda values: sum(values) / len(values),
    "count": len,
}
"""What `|NAME` does to the values a `*` in a key path collects (`runs.*.acc |min`)."""


def _lookup(data: Any, path: list[str], where: str) -> Any:
    for index, key in enumerate(path):
        if key == "*":  # every item of a list: the rest of the path looked up in each
            if not isinstance(data, list) or not data:
                raise CourseError(f"{where}: '*' needs a non-empty list there")
            return [_lookup(item, path[index + 1 :], where) for item in data]
        if isinstance(data, list) and key.isdigit() and int(key) < len(data):
            data = data[int(key)]
        elif isinstance(data, dict) and key in data:
            data = data[key]
        else:
            raise CourseError(f"{where}: no key {key!r} there")
    return data


def fill(expr: str, sources: Sources, page: str, where: str) -> str:
    """The HTML for one inline placeholder: ``NAME.key.path[ :format]``, ``cited.NAME`` or
    ``command NAME``."""
    if expr.startswith("command "):
        name = expr.split(None, 1)[1]
        if name not in sources.results:
            raise CourseError(f"{where}: no result named {name!r} in course/results.yaml")
        sources.used.add(name)
        return f"<code>{html.escape(sources.results[name].command)}</code>"
    ref, _, spec = (part.strip() for part in expr.partition(" :"))
    ref, _, reducer = (part.strip() for part in ref.partition("|"))
    name, *path = ref.split(".")
    if name == "cited":
        if len(path) != 1 or path[0] not in sources.cited:
            raise CourseError(f"{where}: no number {ref!r} in course/cited.yaml")
        cited = sources.cited[path[0]]
        sources.numbers.append({"page": page, "cited": path[0], "text": cited.value})
        return f'<span class="cited" title="{html.escape(cited.source)}">{cited.value}</span>'
    if name not in sources.results:
        raise CourseError(f"{where}: {{{{ {expr} }}}} names no result (course/results.yaml)")
    value = _lookup(sources.value(name), path, f"{where}: {{{{ {expr} }}}}")
    if ("*" in path) != bool(reducer) or (reducer and reducer not in REDUCERS):
        raise CourseError(
            f"{where}: {{{{ {expr} }}}}: a '*' in the path takes one of |"
            f"{' |'.join(REDUCERS)} after it, and only then"
        )
    if reducer:
        value = REDUCERS[reducer](value)
    if isinstance(value, (dict, list)) or value is None:
        raise CourseError(f"{where}: {{{{ {expr} }}}} is not a number or a word")
    try:
        text = format(value, spec) if spec else str(value)
    except (TypeError, ValueError):
        raise CourseError(f"{where}: format {spec!r} does not fit {value!r}") from None
    sources.numbers.append(
        {
            "page": page,
            "result": name,
            "key": ".".join(path),
            "reduce": reducer,
            "format": spec,
            "text": text,
        }
    )
    command = html.escape(sources.results[name].command)
    return f'<span class="measured" title="{command}">{html.escape(text)}</span>'


def check_typed_numbers(line: str, where: str) -> None:
    """Refuse a decimal, percentage, ratio or 4,096 typed into prose: it names no source."""
    prose = _EXEMPT.sub(" ", _PLACEHOLDER.sub(" ", line))
    if match := _TYPED_NUMBER.search(prose):
        raise CourseError(
            f"{where}: the number {match.group(1)!r} names no source; write "
            "{{ RESULT.key }} (course/results.yaml) or {{ cited.NAME }} (course/cited.yaml)"
        )


def expand(text: str, path: Path, sources: Sources, page: str) -> tuple[str, dict[str, str]]:
    """Markdown with every placeholder filled; block directives become tokens, returned
    with their HTML (so Markdown leaves the diagrams and figures alone)."""
    out: list[str] = []
    blocks: dict[str, str] = {}
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{path}:{number}"
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append(line)
            continue
        if fenced:
            out.append(line)
            continue
        if block := _BLOCK.match(line):
            token = f"RLVRBLOCK{len(blocks)}X"
            blocks[token] = _block(block.group(1), block.group(2), sources, where)
            out.extend(["", token, ""])
            continue
        check_typed_numbers(line, where)
        out.append(
            _PLACEHOLDER.sub(lambda m, where=where: fill(m.group(1), sources, page, where), line)
        )
    return "\n".join(out), blocks


def _block(kind: str, name: str, sources: Sources, where: str) -> str:
    if kind == "diagram":
        source = sources.root / "diagrams" / f"{name}.mmd"
        if not source.is_file():
            raise CourseError(f"{where}: no diagram {source}")
        return (
            f'<figure class="diagram" id="diagram-{name}"><pre class="mermaid">'
            f"{html.escape(source.read_text().strip())}</pre></figure>"
        )
    if kind == "figure":
        if name not in sources.results or sources.results[name].file.suffix != ".png":
            raise CourseError(f"{where}: no PNG result named {name!r} in course/results.yaml")
        result = sources.results[name]
        sources.value(name)  # a missing file: the command that writes it
        about = html.escape(result.about)
        return (
            f'<figure class="figure"><img src="figures/{name}.png" alt="{about}">'
            f"<figcaption>{about} (<code>{html.escape(result.command)}"
            "</code>)</figcaption></figure>"
        )
    file, _, lines = name.partition(":")  # code: a file of the checkout, optionally :A-B
    source = sources.root.parent / file
    if not source.is_file():
        raise CourseError(f"{where}: no file {source} to show")
    text = source.read_text().splitlines()
    if lines:
        first, _, last = lines.partition("-")
        text = text[int(first) - 1 : int(last or first)]
    return (
        f'<figure class="code"><pre><code class="language-python">'
        f"{html.escape(chr(10).join(text))}</code></pre><figcaption><code>{html.escape(file)}"
        "</code></figcaption></figure>"
    )


def to_html(text: str, path: Path, sources: Sources, page: str) -> str:
    """One Markdown source as HTML, placeholders filled."""
    import markdown

    expanded, blocks = expand(text, path, sources, page)
    body = markdown.markdown(expanded, extensions=["tables", "fenced_code", "sane_lists"])
    for token, block in blocks.items():
        body = body.replace(f"<p>{token}</p>", block)
    return body


# --- pages --------------------------------------------------------------------------------


def _head(title: str, extra: str = "") -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n{extra}"
        '<link rel="stylesheet" href="course.css">\n'
        f'<script src="{MERMAID}/mermaid.min.js"></script>\n'
        '<script src="course.js"></script>\n</head>\n'
    )


def _nav(current: str) -> str:
    links = " ".join(
        f'<a href="{out}"{" class=current" if out == current else ""}>{title}</a>'
        for out, title in PAGES.values()
    )
    return f'<nav class="course-nav"><span class="brand">FT14 · rlvr</span> {links}</nav>\n'


def page_html(source: str, body: str) -> str:
    out, title = PAGES[source]
    return (
        _head(f"GRPO and verifiable rewards: {title}")
        + f'<body class="page">\n{_nav(out)}<main>\n{body}\n</main>\n'
        "<script>rlvrCourse.page();</script>\n</body>\n</html>\n"
    )


def split_sections(text: str, level: str = "## ") -> list[tuple[str, str, int]]:
    """(title, body, line) for each section of `text` that starts with `level`."""
    sections: list[tuple[str, list[str], int]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith(level):
            sections.append((line[len(level) :].strip(), [], number))
        elif sections:
            sections[-1][1].append(line)
    return [(title, "\n".join(body), number) for title, body, number in sections]


def slides_html(sources: Sources) -> tuple[str, list[str]]:
    """The reveal.js deck: slides.md split on lines `---`, each slide's speaker notes the
    script's section of the same number. Returns the page and the slide titles."""
    path = sources.root / "slides.md"
    script = sources.root / "script.md"
    slides = _read(path).split("\n---\n")
    notes = split_sections(_read(script))
    if len(notes) != len(slides):
        raise CourseError(
            f"{script}: {len(notes)} sections (## ...) for {len(slides)} slides in {path}; "
            "write one section per slide, in order"
        )
    sections, titles = [], []
    offset = 0
    for index, (slide, (note_title, note, note_line)) in enumerate(zip(slides, notes), 1):
        heading = re.search(r"^#{1,2} (.+)$", slide, re.M)
        if heading is None:
            raise CourseError(f"{path}: slide {index} has no # or ## title")
        title = heading.group(1).strip()
        if not note_title.split(". ", 1)[-1].startswith(_plain(title)):
            raise CourseError(
                f"{script}:{note_line}: section {index} is {note_title!r}, but slide {index} "
                f"is {title!r}; title each section 'N. <the slide's title> (M min)'"
            )
        titles.append(title)
        body = to_html(_shift(slide, offset), path, sources, "slides.html")
        aside = to_html(_shift(note, note_line), script, sources, "slides.html")
        sections.append(
            f'<section data-slide="{index}">\n{body}\n<aside class="notes">{aside}'
            "</aside>\n</section>"
        )
        offset += slide.count("\n") + 2
    head = _head(
        "GRPO and verifiable rewards: slides",
        f'<link rel="stylesheet" href="{REVEAL}/reset.css">\n'
        f'<link rel="stylesheet" href="{REVEAL}/reveal.css">\n'
        f'<script src="{REVEAL}/reveal.js"></script>\n'
        f'<script src="{REVEAL}/plugin/notes.js"></script>\n',
    )
    deck = "\n".join(sections)
    page = (
        head + '<body class="deck">\n<div class="reveal"><div class="slides">\n'
        f"{deck}\n</div></div>\n<script>rlvrCourse.deck();</script>\n</body>\n</html>\n"
    )
    return page, titles


def _plain(title: str) -> str:
    return re.sub(r"<[^>]+>|\{\{.*?\}\}|[*`]", "", title).strip()


def _shift(text: str, lines: int) -> str:
    """`text` with `lines` blank lines before it, so errors name the line in its file."""
    return "\n" * lines + text


def _read(path: Path) -> str:
    if not path.is_file():
        raise CourseError(f"{path}: missing (a course source)")
    return path.read_text()


# --- the build ----------------------------------------------------------------------------


def check_out(out: Path) -> None:
    """Refuse an OUT that is a file, or a non-empty directory an earlier build did not write."""
    if out.exists() and not out.is_dir():
        raise CourseError(f"{out}: exists and is not a directory; choose another OUT")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise CourseError(
            f"{out}: not empty and not written by `rlvr course build`; choose an empty or new "
            "directory"
        )


def prepare_out(out: Path) -> None:
    """An empty OUT: new, or emptied when an earlier build wrote it (`check_out` first)."""
    check_out(out)
    if out.is_dir() and any(out.iterdir()):
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def build(out: Path, source: Path | None = None) -> dict[str, Any]:
    """Build the site into `out` from `source` (default: the checkout's course/); returns
    what numbers.json holds. Everything is checked before anything is written."""
    check_out(out)
    root = (source or default_source()).resolve()
    sources = load_sources(root)
    texts = {name: _read(root / name) for name in ("document.md", "script.md", "lab.md")}
    pages = {
        PAGES[name][0]: page_html(name, to_html(text, root / name, sources, PAGES[name][0]))
        for name, text in texts.items()
    }
    pages["slides.html"], titles = slides_html(sources)
    figures = [n for n in sorted(sources.used) if sources.results[n].file.suffix == ".png"]
    manifest = {
        "slides": titles,
        "numbers": sources.numbers,
        "results": {
            n: {"file": str(r.file.relative_to(root)), "command": r.command}
            for n, r in sorted(sources.results.items())
        },
        "words": {"document.md": count_words(texts["document.md"])},
        "used": sorted(sources.used),
    }
    prepare_out(out)
    (out / MARKER).write_text("written by rlvr course build; the next build replaces it\n")
    for name, text in sorted(pages.items()):
        (out / name).write_text(text)
    (out / "figures").mkdir()
    for name in figures:
        shutil.copyfile(sources.results[name].file, out / "figures" / f"{name}.png")
    for name in THEME:
        shutil.copyfile(root / "theme" / name, out / name)
    shutil.copytree(root / "vendor", out / "vendor")
    (out / "numbers.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def count_words(markdown_text: str) -> int:
    """Words of prose: code blocks, placeholders' syntax and Markdown marks not counted
    (a placeholder counts as one word, the number it becomes)."""
    text = re.sub(r"```.*?```", " ", markdown_text, flags=re.S)
    text = re.sub(_BLOCK.pattern, " ", text, flags=re.M)
    text = _PLACEHOLDER.sub(" N ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return len(re.findall(r"[A-Za-z0-9][\w'’.-]*", text))
