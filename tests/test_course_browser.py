"""The built course in a real browser: headless Chromium (Debian's `chromium`, driven by
Playwright) opens every page from ``file://``.

For each page: no console error and no uncaught exception, no request outside the build
folder, every Mermaid diagram rendered to an SVG, every image loaded. The deck: all fourteen
slides stepped through, none with content overflowing the slide, a PNG of each saved in the
build folder (``screenshots/``). CI installs chromium with apt (``.ci/run``); where it or
Playwright is missing the test says so and skips.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from rlvr.report.course import build

pytest.importorskip("playwright", reason="pip install playwright (in .[dev]) for the browser test")
from playwright.sync_api import sync_playwright  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH: apt-get install chromium (CI does)"
)
PAGES = ["index.html", "script.html", "lab.html"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("course") / "site"
    build(out)
    return out


@pytest.fixture(scope="module")
def browser() -> Any:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        yield browser
        browser.close()


def open_page(browser: Any, site: Path, name: str) -> tuple[Any, Any, list[str], list[str]]:
    """A page opened offline, with its console errors and its requests outside `site`."""
    context = browser.new_context(viewport={"width": 1280, "height": 720}, offline=True)
    page = context.new_page()
    errors: list[str] = []
    outside: list[str] = []
    root = site.resolve().as_uri()
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    def on_request(request: Any) -> None:
        url = request.url
        if not (url.startswith(root + "/") or url.startswith("data:") or url == "about:blank"):
            outside.append(url)

    page.on("request", on_request)
    page.goto(f"{root}/{name}")
    page.wait_for_selector("body[data-ready]", state="attached", timeout=60_000)
    return context, page, errors, outside


# a diagram laid out while hidden comes out as empty boxes: a viewBox of a few pixels (its
# nodes measured 0 wide) scaled up to the figure, or labels 0 wide
EMPTY_DIAGRAMS = """(els) => els.filter((svg) => {
    const box = svg.getBoundingClientRect();
    const view = svg.viewBox.baseVal;
    if (!view || view.width < 50 || view.height < 50) return true;
    const labels = Array.from(svg.querySelectorAll("text, foreignObject"))
        .filter((t) => t.textContent.trim());
    const drawn = labels.filter((t) => t.getBoundingClientRect().width > 0);
    return box.width < 50 || box.height < 50 || labels.length === 0
        || drawn.length < labels.length / 2;
}).map((svg) => svg.closest("figure").id)"""


def check_rendered(page: Any, name: str, scope: str = "") -> None:
    """Every diagram (within `scope`, a CSS selector) an SVG of real size with its labels
    laid out, and every image loaded."""
    diagrams = page.eval_on_selector_all(f"{scope} figure.diagram", "els => els.length")
    svgs = page.eval_on_selector_all(f"{scope} figure.diagram pre.mermaid svg", "els => els.length")
    assert svgs == diagrams, f"{name}: {diagrams - svgs} of {diagrams} diagrams not rendered"
    empty = page.eval_on_selector_all(f"{scope} figure.diagram pre.mermaid svg", EMPTY_DIAGRAMS)
    assert not empty, f"{name}: diagrams drawn without their labels: {empty}"
    broken = page.eval_on_selector_all(
        "img", "els => els.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)"
    )
    assert not broken, f"{name}: images not loaded: {broken}"


@pytest.mark.parametrize("name", PAGES)
def test_page_opens_offline(browser: Any, site: Path, name: str) -> None:
    context, page, errors, outside = open_page(browser, site, name)
    try:
        check_rendered(page, name)
        shots = site / "screenshots"
        shots.mkdir(exist_ok=True)
        page.screenshot(path=str(shots / name.replace(".html", ".png")))
    finally:
        context.close()
    assert not errors, f"{name}: console errors: {errors}"
    assert not outside, f"{name}: requests outside the build folder: {outside}"


def test_deck_steps_through_fourteen_slides(browser: Any, site: Path) -> None:
    context, page, errors, outside = open_page(browser, site, "slides.html")
    overflowing = []
    try:
        total = page.evaluate("Reveal.getTotalSlides()")
        assert total == 14
        shots = site / "screenshots"
        shots.mkdir(exist_ok=True)
        for index in range(total):
            page.evaluate(f"Reveal.slide({index})")
            page.wait_for_function(f"Reveal.getIndices().h === {index}")
            check_rendered(page, f"slide {index + 1}", "section.present")
            sizes = page.evaluate(
                """() => { const s = Reveal.getCurrentSlide();
                   return [s.scrollHeight, s.clientHeight, s.scrollWidth, s.clientWidth]; }"""
            )
            if sizes[0] > sizes[1] + 2 or sizes[2] > sizes[3] + 2:
                overflowing.append((index + 1, sizes))
            page.screenshot(path=str(shots / f"slide-{index + 1:02d}.png"))
    finally:
        context.close()
    assert not errors, f"slides.html: console errors: {errors}"
    assert not outside, f"slides.html: requests outside the build folder: {outside}"
    assert not overflowing, f"slides overflowing (number, [scrollH, H, scrollW, W]): {overflowing}"
