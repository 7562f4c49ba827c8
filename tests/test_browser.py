"""The built site in a real browser: Debian's headless Chromium, driven by Playwright.

For every page of the table of contents: it loads with no console error, no JavaScript
error and no failed request; it is not blank; every image has loaded; every table fits the
text column at 1280 px; every internal link
and anchor resolves; the download links serve their files. The search page finds
"roofline". A full-page screenshot of every page, and one of every figure in the dark colour
mode, is saved in _build/screenshots/ for a human to look at.

The site is served from localhost and must work offline: a request to another host fails the
page. Every formula is typeset, by the MathJax the site serves itself.
Needs `pip install playwright` (the Python package, not `playwright install`) and
`apt-get install chromium`; skipped without them.
"""

from __future__ import annotations

import functools
import gzip
import http.server
import io
import json
import re
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import pytest

from gpuinfer.publish.book import BookError, toc_files

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]
SCREENSHOTS = ROOT / "_build" / "screenshots"
try:
    PAGES = toc_files(ROOT)  # docnames, e.g. 'book/01_roofline'
except BookError:  # test_recordings fails with the reason
    PAGES = []
ALLOWED_OFFLINE = ()  # MathJax is served with the site (sphinx-mathjax-offline)
MIN_TEXT = 200  # characters of visible text in the article: below that, a page is blank

pytestmark = pytest.mark.slow


# --- fixtures: the server and the browser ---------------------------------------------------

class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site(built_book):
    """The built site served on localhost: (base URL, html folder)."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(built_book)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/", built_book
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser(built_book):
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="pip install playwright (the Python package)")
    if not CHROMIUM.exists():
        pytest.skip(f"no {CHROMIUM}: apt-get install -y chromium")
    # The whole book's PDF, which every page links, is printed from the site first, as the
    # publishing workflow does after the build (tests/test_pdf.py checks what it holds).
    from gpuinfer.publish.pdf import PDF_NAME, build_pdf

    if not (built_book / PDF_NAME).is_file():
        build_pdf(ROOT, CHROMIUM, html=built_book)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for old in SCREENSHOTS.glob("*.png"):
        old.unlink()
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Problems(list):
    """What went wrong while a page was open, in words."""

    def __init__(self, page, base: str):
        super().__init__()
        self.blocked: list[str] = []
        page.on("console", self.console)
        page.on("pageerror", lambda exc: self.append(f"JavaScript error: {exc}"))
        page.on("requestfailed", lambda r: r.url.startswith(base) and self.append(
            f"request failed: {r.url} ({r.failure})"))
        page.on("response", lambda r: r.url.startswith(base) and r.status >= 400 and
                self.append(f"HTTP {r.status} for {r.url}"))
        page.route("**/*", functools.partial(self.route, base))

    def route(self, base, route):
        url = route.request.url
        if url.startswith(base) or url.startswith("data:"):
            route.continue_()
            return
        self.blocked.append(url)
        if not any(allowed in url for allowed in ALLOWED_OFFLINE):
            self.append(f"needs the network: {url}")
        route.abort()

    def console(self, msg):
        if msg.type != "error":
            return
        source = (msg.location or {}).get("url", "")
        if source in self.blocked or "net::ERR_FAILED" in msg.text and self.blocked:
            return  # the failure of a request blocked above, already judged there
        self.append(f"console error: {msg.text} ({source})")


@pytest.fixture
def tab(browser, site):
    """A fresh browser tab on the site: (page, problems, base URL, html folder)."""
    base, html = site
    context = browser.new_context(viewport={"width": 1280, "height": 900},
                                  service_workers="block")
    page = context.new_page()
    problems = Problems(page, base)
    yield page, problems, base, html
    context.close()


# --- helpers --------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def fetch(url: str) -> tuple[int, bytes]:
    """(HTTP status, body) of a URL on the local server."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, b""


@functools.lru_cache(maxsize=None)
def ids_in(url: str) -> frozenset[str]:
    status, body = fetch(url)
    return frozenset(re.findall(r'\bid="([^"]+)"', body.decode("utf8", "replace")))


def screenshot_name(docname: str, suffix: str = "") -> Path:
    return SCREENSHOTS / (docname.replace("/", "__") + suffix + ".png")


def is_blank(png: bytes) -> bool:
    """True when a screenshot is (nearly) one colour."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        small = im.convert("RGB").resize((64, 45))
        return len(small.getcolors(maxcolors=64 * 45)) < 8


# Every code block of the article at its widest: a code cell's input, each of a cell's
# outputs, and every other block of code (`pre`: literal blocks, literalinclude, the
# commands of a page). Closed dropdowns and hidden inputs are opened while they are measured
# (a reader opens them), and restored. Tables are left to the table check; a block that
# overflows is reported once, by the most it overflows anywhere inside it.
CODE_OVERFLOW_JS = """(tolerance) => {
    const article = document.querySelector('article');
    if (!article) return [];
    const closed = Array.from(article.querySelectorAll('details:not([open])'));
    closed.forEach(d => { d.open = true; });
    const roots = Array.from(article.querySelectorAll(
        '.cell_input, .cell_output > *, pre')).filter(el =>
        !(el.tagName === 'PRE' && el.parentElement.closest('.cell_input, .cell_output')) &&
        !el.closest('table, .pst-scrollable-table-container'));
    const kind = el => el.closest('.cell_input') ? 'code cell'
        : el.closest('.cell_output') ? 'output' : 'code block';
    const found = [];
    for (const root of roots) {
        if (root.offsetParent === null) continue;  // not laid out (display: none)
        let over = 0, scroll = 0, client = 0;
        for (const el of [root, ...root.querySelectorAll('*')]) {
            if (el.clientWidth === 0 || el.closest('table')) continue;  // inline
            if (el.scrollWidth - el.clientWidth > over) {
                over = el.scrollWidth - el.clientWidth;
                [scroll, client] = [el.scrollWidth, el.clientWidth];
            }
        }
        if (over > tolerance) {
            const line = ((root.innerText || '').split('\\n').find(l => l.trim()) || '')
                .trim().slice(0, 50);
            found.push(`${kind(root)} "${line}" overflows by ${over} px ` +
                       `(${scroll} px of text in ${client} px)`);
        }
    }
    closed.forEach(d => { d.open = false; });
    return found;
}"""
OVERFLOW_TOLERANCE_PX = 2  # sub-pixel widths round either way


def overflowing_code(page) -> list[str]:
    """The article's code blocks and outputs that scroll sideways, in words."""
    return page.evaluate(CODE_OVERFLOW_JS, OVERFLOW_TOLERANCE_PX)


def check_links(page, base: str, url: str, problems: Problems) -> int:
    """Every internal link's target and anchor exists; returns how many links were checked."""
    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(a => a.href)")
    own_ids = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
    checked = 0
    for href in set(hrefs):
        if not href.startswith(base):
            continue  # external (the browser did not follow it), mailto:, javascript:
        target, fragment = urldefrag(href)
        checked += 1
        if target == urldefrag(url)[0]:
            if fragment and unquote(fragment) not in own_ids:
                problems.append(f"broken anchor on the page: #{fragment}")
            continue
        status, _ = fetch(target)
        if status != 200:
            problems.append(f"broken link: {href} (HTTP {status})")
        elif fragment and target.endswith(".html") and unquote(fragment) not in ids_in(target):
            problems.append(f"broken anchor: {href}")
    return checked


def check_downloads(page, base: str, html: Path, problems: Problems) -> int:
    """The page's download links (the theme's menu and {download} links) serve their files,
    byte for byte; a notebook is valid JSON, a .gz file valid gzip."""
    hrefs = page.eval_on_selector_all(
        ".dropdown-download-buttons a[href], a.download[href], a[download]",
        "els => els.map(a => a.href)")
    for href in set(hrefs):
        status, body = fetch(href)
        path = html / unquote(urlsplit(href).path).removeprefix(urlsplit(base).path)
        if status != 200:
            problems.append(f"download {href}: HTTP {status}")
        elif not path.is_file() or body != path.read_bytes() or not body:
            problems.append(f"download {href} does not serve the file {path}")
        elif href.endswith(".ipynb") and "cells" not in json.loads(body):
            problems.append(f"download {href} is not a notebook")
        elif href.endswith(".gz"):
            gzip.decompress(body)
    return len(set(hrefs))


# --- the tests ------------------------------------------------------------------------------

def test_the_toc_has_pages():
    assert "book/01_roofline" in PAGES and len(PAGES) >= 3, PAGES


@pytest.mark.parametrize("docname", PAGES)
def test_page_works_in_a_browser(tab, docname):
    page, problems, base, html = tab
    url = f"{base}{docname}.html"
    start = time.perf_counter()
    response = page.goto(url, wait_until="load")
    assert response is not None and response.status == 200, f"{url}: {response}"

    # Every image loaded (an <img> that failed has naturalWidth 0).
    broken = page.evaluate("""async () => {
        const imgs = Array.from(document.images);
        imgs.forEach(img => { img.loading = "eager"; });
        await Promise.all(imgs.map(img => img.complete ? null
            : new Promise(done => { img.onload = img.onerror = done; })));
        return imgs.filter(img => img.naturalWidth === 0).map(img => img.src);
    }""")
    problems.extend(f"image did not load: {src}" for src in broken)
    images = page.evaluate("document.querySelectorAll('article img').length")

    # Every formula typeset: MathJax replaces each with an mjx-container.
    untypeset = page.evaluate("""async () => {
        if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
            await MathJax.startup.promise;
        }
        return Array.from(document.querySelectorAll('article div.math, article span.math'))
            .filter(m => !m.querySelector('mjx-container'))
            .map(m => m.textContent.trim().slice(0, 60));
    }""")
    problems.extend(f"formula not typeset: {m}" for m in untypeset)

    # Not blank: a title, text in the article, and more than one colour on the screen.
    title = page.evaluate("(document.querySelector('article h1') || {}).innerText || ''")
    text = page.evaluate("(document.querySelector('article') || {}).innerText || ''")
    if not title.strip():
        problems.append("no title (h1) in the article")
    if len(text.strip()) < MIN_TEXT:
        problems.append(f"blank page: {len(text.strip())} characters of text")
    if is_blank(page.screenshot()):
        problems.append("the screenshot is a single colour")

    # Every table fits the text column at 1280 px: a column pushed behind a scrollbar is
    # one the reader never sees (tables inside closed dropdowns are not laid out: skipped).
    wide = page.evaluate("""() => Array.from(document.querySelectorAll('article table'))
        .filter(t => t.offsetParent !== null)
        .map(t => [t, t.closest('.pst-scrollable-table-container') || t.parentElement])
        .filter(([t, box]) => t.scrollWidth > box.clientWidth + 2)
        .map(([t, box]) => `${(t.innerText || '').trim().slice(0, 40)}... is ` +
                           `${t.scrollWidth} px wide in a ${box.clientWidth} px column`)""")
    problems.extend(f"table wider than the page: {w}" for w in wide)
    # Every code block and output fits it too: an 88-character line of code (the book's
    # style rule) without a scrollbar, printed text wrapped (static/gpuinfer.css).
    problems.extend(f"wider than the page: {w}" for w in overflowing_code(page))

    links = check_links(page, base, url, problems)
    downloads = check_downloads(page, base, html, problems)

    page.screenshot(path=screenshot_name(docname), full_page=True)
    if images:  # figures must stay readable in the dark colour mode too: one shot of each
        page.emulate_media(color_scheme="dark")
        for i, figure in enumerate(page.query_selector_all("article img")):
            figure.screenshot(path=screenshot_name(docname, f"__dark_figure{i + 1}"))
    print(f"{docname}: {links} internal links, {downloads} downloads, {images} images, "
          f"{time.perf_counter() - start:.1f} s")
    assert not problems, f"{url}:\n" + "\n".join(problems)


def test_search_finds_roofline(tab):
    page, problems, base, _ = tab
    page.goto(f"{base}search.html?q=roofline", wait_until="load")
    page.wait_for_selector("#search-results ul.search li a", timeout=30_000)
    results = page.eval_on_selector_all("#search-results ul.search li a",
                                        "els => els.map(a => a.getAttribute('href'))")
    page.screenshot(path=screenshot_name("search"), full_page=True)
    assert any("01_roofline" in href for href in results), results
    assert not problems, "\n".join(problems)
