"""gpuinfer.publish.pdf: the whole book printed from the built site into one PDF.

Built from the session's build of the book (conftest's `built_book`): every page of the TOC
is in it, in TOC order, each with a bookmark and its title in the text; its figures are in
it (as many images as the printed pages show); page links point inside the PDF. Misuse: no
built site is one line naming the fix. Needs playwright, Debian's chromium and pypdf, like
tests/test_browser.py; skipped without them.
"""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from html import unescape
from pathlib import Path

import pytest

from gpuinfer.publish import pdf
from gpuinfer.publish.book import BookError, toc_files

ROOT = Path(__file__).resolve().parent.parent
try:
    PAGES = toc_files(ROOT)
except BookError:  # test_recordings fails with the reason
    PAGES = []

pytestmark = pytest.mark.slow


def words(text: str) -> str:
    """Text with its whitespace collapsed (the PDF's lines break where the HTML's do not)
    and its ligatures spelled out (the PDF's text has "ﬂ" for "fl")."""
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text)).strip()


@pytest.fixture(scope="module")
def book_pdf(built_book):
    """(the PDF's reader, its path): printed now unless this session's browser test did."""
    pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    pypdf = pytest.importorskip("pypdf", reason="pip install pypdf")
    if not pdf.CHROMIUM.exists():
        pytest.skip(f"no {pdf.CHROMIUM}: apt-get install -y chromium")
    path = built_book / pdf.PDF_NAME
    if not path.is_file():
        assert pdf.build_pdf(ROOT, html=built_book) == path
    return pypdf.PdfReader(path), path


def outline(reader) -> list[tuple[str, int]]:
    """(title, first page) of each bookmark, in order."""
    return [(item.title, reader.get_destination_page_number(item))
            for item in reader.outline if not isinstance(item, list)]


def article(html: Path, docname: str) -> str:
    """The HTML of a page's article (the theme's print-only title stands before it)."""
    text = (html / f"{docname}.html").read_text(encoding="utf8")
    return text[text.index("<article"):text.index("</article>")]


def page_title(html: Path, docname: str) -> str:
    """The text of the article's h1, as the page shows it."""
    h1 = re.search(r"<h1[^>]*>(.*?)<a class=\"headerlink\"", article(html, docname), re.S)
    return words(unescape(re.sub(r"<[^>]+>", "", h1.group(1))))


def article_images(html: Path, docname: str) -> int:
    """How many <img> the page's article has (its figures; none outside the article)."""
    return len(re.findall(r"<img\b", article(html, docname)))


def test_every_page_of_the_toc_is_in_the_pdf_in_order(book_pdf, built_book):
    reader, path = book_pdf
    marks = outline(reader)
    assert len(marks) == len(PAGES), (marks, PAGES)
    starts = [page for _, page in marks]
    assert starts == sorted(starts) and starts[0] == 0 and len(set(starts)) == len(starts)
    for (title, start), end, docname in zip(marks, starts[1:] + [len(reader.pages)], PAGES):
        expected = page_title(built_book, docname)
        assert words(title) == expected, docname
        text = words(" ".join(reader.pages[i].extract_text() for i in range(start, end)))
        assert expected[:40] in text, f"{docname}: its title {expected!r} not in its pages"


def test_the_pdf_has_the_figures_and_a_plausible_length(book_pdf, built_book):
    reader, _ = book_pdf
    starts = [page for _, page in outline(reader)] + [len(reader.pages)]
    for docname, start, end in zip(PAGES, starts, starts[1:]):
        site_images = article_images(built_book, docname)
        pdf_images = sum(len(reader.pages[i].images) for i in range(start, end))
        assert pdf_images >= site_images, \
            f"{docname}: {pdf_images} images in the PDF, {site_images} <img> on the page"
    chapters = [d for d in PAGES if re.match(r"book/0\d_", d)]
    # a chapter is several pages of A4; the whole book well under a thousand
    assert 3 * len(chapters) + len(PAGES) <= len(reader.pages) < 1000, len(reader.pages)
    for start, end in zip(starts, starts[1:]):
        assert end - start < 80, "a page of the site printed onto more than 80 pages"


def test_links_between_pages_point_inside_the_pdf(book_pdf):
    reader, _ = book_pdf
    inside, local = 0, []
    for page in reader.pages:
        for ref in page.get("/Annots") or []:
            annotation = ref.get_object()
            inside += "/Dest" in annotation
            uri = str((annotation.get("/A") or {}).get("/URI", ""))
            if uri.startswith("http://127.0.0.1"):
                local.append(uri)
    assert inside > len(PAGES) and not local, (inside, local[:3])


def test_without_a_built_site_one_line_names_the_fix(tmp_path):
    (tmp_path / "_toc.yml").write_text((ROOT / "_toc.yml").read_text(), encoding="utf8")
    with pytest.raises(FileNotFoundError, match=r"^.*no built site to print: run "
                                                r"`jupyter-book build \.` in .* first$"):
        pdf.build_pdf(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "gpuinfer.publish.pdf", "--root",
                           str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "jupyter-book build ." in proc.stderr
    assert not (tmp_path / "_build").exists()  # nothing written
