"""The whole book as one PDF, printed from the built site: `python -m gpuinfer.publish.pdf
[--root .]` after `jupyter-book build .` writes `_build/html/book.pdf`, which the site links
on every page (the download menu) and publishes with its pages.

Chromium (Debian's, the one tests/test_browser.py drives with Playwright) prints every page
of the TOC, in TOC order, each on its own (`page.pdf()`), and pypdf joins them. One print
per page, rather than one combined HTML printed once, keeps each page exactly as the site
serves it: its own scripts, styles and ids (pages share ids such as `summary`, which a
combined page would have to rename, and every link to them with it). What the per-page
prints lose, the join puts back: a bookmark per page, and the links between pages, which
Chromium writes as addresses of the local server, become links to the page they name
inside the PDF. The print styles (`@media print` in static/gpuinfer.css) hide the
sidebars, the header buttons and the previous/next links.

The site is served from localhost and printed offline: a request to another host is
refused (no page of the book needs one to be read). The PDF is written beside the site
under a temporary name and renamed over book.pdf only when it is whole.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import io
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

from gpuinfer.publish.book import BookError, toc_files

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]
PDF_NAME = "book.pdf"
PAPER = {"format": "A4", "margin": {"top": "14mm", "bottom": "14mm", "left": "12mm",
                                    "right": "12mm"}}
LOAD_TIMEOUT_MS = 60_000

# Every image loaded (lazy ones made eager first) before a page is printed.
IMAGES_LOADED_JS = """async () => {
    const imgs = Array.from(document.images);
    imgs.forEach(img => { img.loading = "eager"; });
    await Promise.all(imgs.map(img => img.complete ? null
        : new Promise(done => { img.onload = img.onerror = done; })));
    return imgs.filter(img => img.naturalWidth === 0).map(img => img.src);
}"""


# The equations typeset (MathJax runs after the page's load event) before it is printed.
MATH_TYPESET_JS = """async () => {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
        await MathJax.startup.promise;
    }
    return document.querySelectorAll("div.math, span.math").length -
        document.querySelectorAll("mjx-container").length;
}"""


def site_folder(root: Path) -> Path:
    """The built site of the book in `root`, or one line that says how to build it."""
    html = Path(root) / "_build" / "html"
    if not (html / "index.html").is_file():
        raise FileNotFoundError(f"{html}/index.html: no built site to print: run "
                                f"`jupyter-book build .` in {Path(root).resolve()} first")
    return html


def pages_to_print(root: Path, html: Path) -> list[str]:
    """The TOC's docnames, in order, each with its page in the built site."""
    pages = toc_files(root)
    missing = [d for d in pages if not (html / f"{d}.html").is_file()]
    if missing:
        raise FileNotFoundError(f"{html / (missing[0] + '.html')}: a page of the TOC is "
                                f"not in the built site ({len(missing)} missing): run "
                                "`jupyter-book build .` again first")
    return pages


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextmanager
def serve(html: Path) -> Iterator[str]:
    """The built site on localhost while the block runs: its base URL."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(html)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()


def print_pages(base: str, pages: list[str], chromium: Path) -> list[tuple[str, bytes]]:
    """(title, PDF bytes) of each page, printed by Chromium in the print colour mode."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise ModuleNotFoundError("playwright is not installed: the book's PDF is printed "
                                  "by Chromium through it (pip install playwright)") from None
    if not Path(chromium).is_file():
        raise FileNotFoundError(f"{chromium}: no Chromium to print the book with: "
                                "apt-get install chromium (or pass --chromium PATH)")
    printed = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(service_workers="block").new_page()
            page.set_default_timeout(LOAD_TIMEOUT_MS)
            page.route("**/*", lambda route: route.continue_()
                       if route.request.url.startswith(base) else route.abort())
            page.emulate_media(media="print", color_scheme="light")
            for docname in pages:
                response = page.goto(f"{base}{docname}.html", wait_until="load")
                if response is None or response.status != 200:
                    raise FileNotFoundError(f"{docname}.html: the local server answered "
                                            f"{response and response.status}")
                broken = page.evaluate(IMAGES_LOADED_JS)
                if broken:
                    raise FileNotFoundError(f"{docname}.html: an image did not load: "
                                            f"{broken[0]}: rebuild the site first")
                raw = page.evaluate(MATH_TYPESET_JS)
                if raw > 0:
                    raise RuntimeError(f"{docname}.html: {raw} formulas were not typeset "
                                       "(MathJax did not load): rebuild the site first")
                title = page.evaluate(
                    "(document.querySelector('article h1') || {}).innerText || ''")
                printed.append((title.strip().rstrip("#¶ ").strip() or docname,
                                page.pdf(print_background=True, **PAPER)))
        finally:
            browser.close()
    return printed


def link_target(uri: str, base: str, first_page: dict[str, int]) -> int | None:
    """The PDF page a link to the local server lands on (the first of the page it names),
    or None for a link elsewhere."""
    if not uri.startswith(base):
        return None
    path = unquote(urlsplit(urldefrag(uri)[0]).path).removeprefix(urlsplit(base).path)
    docname = path.removesuffix(".html")
    return first_page.get("book/intro" if docname in ("", "index") else docname)


def join(printed: list[tuple[str, bytes]], pages: list[str], base: str):
    """One PdfWriter of the printed pages, a bookmark for each, links between them inside."""
    from pypdf import PdfReader, PdfWriter
    from pypdf.generic import ArrayObject, NameObject

    writer = PdfWriter()
    first_page = {}
    for docname, (title, pdf) in zip(pages, printed):
        first_page[docname] = len(writer.pages)
        writer.append(PdfReader(io.BytesIO(pdf)), import_outline=False)
        writer.add_outline_item(title=title, page_number=first_page[docname])
    for page in writer.pages:
        annotations = page.get("/Annots")
        if not annotations:
            continue
        kept = ArrayObject()
        for ref in annotations:
            annotation = ref.get_object()
            action = annotation.get("/A")
            uri = str(action.get_object().get("/URI", "")) if action is not None else ""
            if uri.startswith(base):  # a page of the site: inside the PDF, or no link
                target = link_target(uri, base, first_page)
                if target is None:  # outside the TOC (the index, a download): text only
                    continue
                del annotation["/A"]
                annotation[NameObject("/Dest")] = ArrayObject(
                    [writer.pages[target].indirect_reference, NameObject("/Fit")])
            kept.append(ref)
        page[NameObject("/Annots")] = kept
    return writer


def build_pdf(root: Path = Path("."), chromium: Path = CHROMIUM,
              html: Path | None = None) -> Path:
    """Print the built site of the book in `root` (its _build/html, or `html`: a build made
    with --path-output) into <site>/book.pdf; returns its path."""
    html = site_folder(Path(root)) if html is None else site_folder(Path(html).parent.parent)
    pages = pages_to_print(Path(root), html)
    with serve(html) as base:
        printed = print_pages(base, pages, chromium)
    writer = join(printed, pages, base)
    out = html / PDF_NAME
    partial = out.with_name(f".{PDF_NAME}.partial")
    try:
        with open(partial, "wb") as f:
            writer.write(f)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path("."),
                        help="the book's folder (where _toc.yml is); default: here")
    parser.add_argument("--chromium", type=Path, default=CHROMIUM,
                        help=f"the Chromium to print with (default {CHROMIUM})")
    args = parser.parse_args(argv)
    try:
        out = build_pdf(args.root, args.chromium)
    except (BookError, FileNotFoundError, ModuleNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
