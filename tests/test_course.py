"""`rlvr course build`: numbers come from result files, bad sources fail in one line, the
same sources give the same bytes, and the module's course has what the seed lists.

The builder's rules are tested on a small course written here; the module's own course
(the checkout's course/) is then checked against the seed: fourteen slides in its order, six
diagrams, a teaching document of 3,500-4,300 words, every number equal to its source.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlvr.report.course import CourseError, build, default_source

COURSE = default_source()
SLIDES = [
    "GRPO and verifiable rewards",
    "DPO or GRPO: the decision",
    "Why DPO is wrong for reasoning",
    "GRPO drops the critic",
    "GRPO is RLOO, nearly",
    "The GRPO++ landscape",
    "The DeepSeek-R1 pipeline",
    "The Qwen3 pipeline",
    "The reward-verification loop",
    "Tooling: TRL, verl, OpenRLHF",
    "A verifiable reward function",
    "Anti-patterns",
    "The lab",
    "Objectives",
]
DIAGRAMS = {
    "grpo_vs_ppo",
    "r1_pipeline",
    "qwen3_pipeline",
    "dpo_or_grpo",
    "grpo_plus_plus",
    "verification_loop",
}


# --- the builder, on a small course -------------------------------------------------------


@pytest.fixture
def mini(tmp_path: Path) -> Path:
    """A two-slide course with one JSON result, one PNG result and one cited number."""
    root = tmp_path / "course"
    (root / "results").mkdir(parents=True)
    (root / "diagrams").mkdir()
    shutil.copytree(COURSE / "theme", root / "theme")
    shutil.copytree(COURSE / "vendor", root / "vendor")
    (root / "results" / "run.json").write_text(
        json.dumps({"acc": 0.98765, "runs": [{"seed": 3}], "name": "grpo"})
    )
    png = b"\x89PNG\r\n\x1a\n" + bytes(64)
    (root / "results" / "curve.png").write_bytes(png)
    (root / "results.yaml").write_text(
        yaml.safe_dump(
            {
                "run": {"file": "results/run.json", "command": "rlvr lab", "about": "a run"},
                "curve": {"file": "results/curve.png", "command": "rlvr lab", "about": "a curve"},
            }
        )
    )
    (root / "cited.yaml").write_text(
        yaml.safe_dump({"aime": {"value": "71.0%", "source": "arXiv:2501.12948"}})
    )
    (root / "diagrams" / "loop.mmd").write_text("flowchart LR\n  A --> B\n")
    (root / "document.md").write_text(
        "# Doc\n\nAccuracy {{ run.acc :.3f }}, seed {{ run.runs.0.seed }}, recipe "
        "{{ run.name }}, best seed {{ run.runs.*.seed |max }}, R1-Zero {{ cited.aime }} "
        "({{ command run }}; arXiv:2501.12948, "
        "Qwen2.5-7B, [link](https://example.invalid/v1.5)).\n\n{{ diagram loop }}\n\n"
        "{{ figure curve }}\n\n```\nlr = 0.001\n```\n"
    )
    (root / "slides.md").write_text(
        "# Title\n\nHello.\n\n---\n\n## Second\n\nAcc {{ run.acc :.2f }}\n"
    )
    (root / "script.md").write_text(
        "# Script\n\n## 1. Title (2 min)\n\nHello.\n\n## 2. Second (3 min)\n\nSay it.\n"
    )
    (root / "lab.md").write_text("# Lab\n\nRun `rlvr lab`.\n")
    return root


def test_placeholders_are_filled_from_their_sources(mini: Path, tmp_path: Path) -> None:
    out = tmp_path / "site"
    manifest = build(out, mini)
    page = (out / "index.html").read_text()
    assert '<span class="measured" title="rlvr lab">0.988</span>' in page
    assert ">3</span>" in page and ">grpo</span>" in page
    assert '<span class="cited" title="arXiv:2501.12948">71.0%</span>' in page
    assert "<code>rlvr lab</code>" in page
    assert '<pre class="mermaid">flowchart LR\n  A --&gt; B</pre>' in page
    assert (out / "figures" / "curve.png").read_bytes() == (mini / "results/curve.png").read_bytes()
    assert "0.001" in page  # code blocks may hold numbers
    texts = [(n.get("result"), n.get("key"), n["text"]) for n in manifest["numbers"]]
    assert ("run", "acc", "0.988") in texts and ("run", "acc", "0.99") in texts
    assert ("run", "runs.*.seed", "3") in texts
    assert manifest["slides"] == ["Title", "Second"]
    slides = (out / "slides.html").read_text()
    assert slides.count("<section") == 2 and '<aside class="notes"><p>Say it.</p>' in slides


def test_the_same_sources_give_the_same_bytes(mini: Path, tmp_path: Path) -> None:
    def digest(out: Path) -> dict[str, str]:
        return {
            str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*"))
            if p.is_file()
        }

    build(tmp_path / "a", mini)
    build(tmp_path / "b", mini)
    first = digest(tmp_path / "a")
    assert first == digest(tmp_path / "b")
    build(tmp_path / "a", mini)  # a directory it wrote is rebuilt in place
    assert digest(tmp_path / "a") == first


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ("document.md", "Typed 0.95 here."),
            r"document\.md:\d+: the number '0\.95' names no source",
        ),
        (("document.md", "About 40% of it."), r"document\.md:\d+: the number '40%'"),
        (("document.md", "It ran 1.4x faster."), r"the number '1\.4x'"),
        (("document.md", "We used 4,096 rows."), r"the number '4,096'"),
        (("document.md", "{{ nothing.acc }}"), r"document\.md:\d+: .*names no result"),
        (("document.md", "{{ run.missing }}"), r"document\.md:\d+: .*no key 'missing'"),
        (("document.md", "{{ run.name :.3f }}"), r"format '\.3f' does not fit 'grpo'"),
        (("document.md", "{{ run.runs.*.seed }}"), r"a '\*' in the path takes one of \|min"),
        (("document.md", "{{ run.acc |min }}"), r"a '\*' in the path takes one of"),
        (("document.md", "{{ cited.nope }}"), r"no number 'cited\.nope' in course/cited\.yaml"),
        (("document.md", "{{ diagram nope }}"), r"document\.md:\d+: no diagram .*nope\.mmd"),
        (("document.md", "{{ figure run }}"), r"no PNG result named 'run'"),
        (("slides.md", "# A\n\n---\n\n## B\n\n---\n\n## C"), r"script\.md: 2 sections .* 3 slides"),
        (
            ("script.md", "## 1. Title (1 min)\n\n## 2. Other (1 min)\n"),
            r"script\.md:\d+: .*'Second'",
        ),
    ],
)
def test_a_bad_source_fails_naming_file_and_line(
    mini: Path, tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    name, text = edit
    path = mini / name
    path.write_text(path.read_text() + "\n" + text + "\n" if name == "document.md" else text)
    with pytest.raises(CourseError, match=message):
        build(tmp_path / "site", mini)
    assert not (tmp_path / "site").exists()  # nothing written


def test_a_missing_result_names_the_command_that_writes_it(mini: Path, tmp_path: Path) -> None:
    (mini / "results" / "run.json").unlink()
    with pytest.raises(CourseError, match=r"run\.json: missing; it is written by `rlvr lab`"):
        build(tmp_path / "site", mini)


def test_a_directory_it_did_not_write_is_refused(mini: Path, tmp_path: Path) -> None:
    out = tmp_path / "site"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(CourseError, match="not empty and not written by `rlvr course build`"):
        build(out, mini)
    assert (out / "notes.txt").read_text() == "mine"


def course_build(out: Path, source: Path) -> subprocess.CompletedProcess:
    """`rlvr course build OUT --source SOURCE` in a process of its own."""
    command = [sys.executable, "-m", "rlvr", "course", "build", str(out), "--source", str(source)]
    return subprocess.run(command, capture_output=True, text=True)


def test_the_command_line_says_one_line(mini: Path, tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    run = course_build(tmp_path / "taken", mini)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("rlvr: error: ")
    ok = course_build(tmp_path / "s", mini)
    assert ok.returncode == 0, ok.stderr
    assert "2 slides" in ok.stdout and (tmp_path / "s" / "index.html").is_file()


# --- the module's course -------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("course") / "site"
    return out, build(out)


def test_fourteen_slides_in_the_seeds_order(site: tuple[Path, dict]) -> None:
    assert site[1]["slides"] == SLIDES


def test_six_diagrams_all_shown(site: tuple[Path, dict]) -> None:
    assert {p.stem for p in (COURSE / "diagrams").glob("*.mmd")} == DIAGRAMS
    document = (site[0] / "index.html").read_text()
    for name in DIAGRAMS:
        assert f'id="diagram-{name}"' in document, f"{name} is not in the teaching document"


def test_the_teaching_document_is_the_seeds_length(site: tuple[Path, dict]) -> None:
    assert 3_500 <= site[1]["words"]["document.md"] <= 4_300


def _at(data, path: list[str]):
    """The value at a dotted key path, a `*` mapping the rest over a list."""
    for index, key in enumerate(path):
        if key == "*":
            return [_at(item, path[index + 1 :]) for item in data]
        data = data[int(key)] if isinstance(data, list) else data[key]
    return data


def test_every_number_equals_its_source(site: tuple[Path, dict]) -> None:
    """Each filled-in number, read again from its result file and formatted again; and each
    appears in its page. A number typed into prose fails the build itself."""
    out, manifest = site
    results = yaml.safe_load((COURSE / "results.yaml").read_text())
    assert manifest["numbers"], "the course states no measured number"
    measured = 0
    for number in manifest["numbers"]:
        page = (out / number["page"]).read_text()
        assert f">{number['text']}</span>" in page
        if "result" not in number:
            continue
        measured += 1
        data = json.loads((COURSE / results[number["result"]]["file"]).read_text())
        value = _at(data, number["key"].split("."))
        if number["reduce"]:
            value = {"min": min, "max": max, "count": len}.get(
                number["reduce"], lambda v: sum(v) / len(v)
            )(value)
        assert format(value, number["format"]) == number["text"]
    assert measured >= 20, f"only {measured} measured numbers in the course"


def test_every_result_is_used_and_every_command_is_rlvrs(site: tuple[Path, dict]) -> None:
    manifest = site[1]
    for entry in manifest["results"].values():
        assert re.match(r"(rlvr |python benchmarks/|python -c \"from rlvr\.)", entry["command"]), (
            entry
        )
    unused = sorted(set(manifest["results"]) - set(manifest["used"]))
    assert not unused, f"results no page shows or names: {unused}"
