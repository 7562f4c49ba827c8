"""How the built site reads (gpuinfer.publish.reading): the counter on small pages, then the
book itself: every chapter derives before it measures (labelled display equations, each
referred to), draws a mechanism, keeps its sentences short and its visible code small; no
page shows what is not for the reader."""

import re
from pathlib import Path

import pytest

pytest.importorskip("bs4")

from conftest import book_chapters  # noqa: E402
from gpuinfer.publish import book  # noqa: E402
from gpuinfer.publish.reading import read_page, read_site, sentences  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MIN_EQUATIONS = 3  # labelled display equations a chapter derives
MIN_DIAGRAMS = 1  # pictures of a mechanism a chapter draws
MAX_WORDS = 45  # in any sentence
MAX_MEDIAN_WORDS = 22  # the median sentence of a chapter
MAX_NOTEBOOK_LINES = 150  # visible lines of a chapter's notebook code
MAX_CODE_LINES = 250  # visible lines of code in all, package code shown included


# --- the counter ---------------------------------------------------------------------------

PAGE = """<html><body><nav><p>Navigation is not the page's text. Not counted at all.</p></nav>
<article class="bd-article">
<p>One short sentence. A second one, e.g. with an abbreviation, and <span class="math">\\(I^\\ast
= \\pi / \\beta\\)</span> as one word? Yes.</p>
<ul><li>An item of four words<ul><li>A nested item apart.</li></ul></li></ul>
<div class="math notranslate nohighlight" id="equation-ch9-roof"><span class="eqno">(1)</span>
\\[P = \\min(\\pi, \\beta I_{\\mathrm{x}}}\\]</div>
<div class="math notranslate nohighlight" id="equation-ch9-ridge"><span class="eqno">(2)</span>
\\[I^\\ast\\]</div>
<div class="math notranslate nohighlight">\\[x\\]</div>
<p>By <a href="#equation-ch9-roof">(1)</a> it is bound.</p>
<figure class="diagram"><img alt="Two regions." src="a.png"/></figure>
<div class="cell tag_presentation tag_diagram"><div class="cell_output"><img alt="A lane."
src="b.png"/></div></div>
<img alt="Figure: a plot." src="c.png"/>
<div class="cell"><div class="cell_input"><div class="highlight-ipython3"><pre>x = 1
y = float("nan")
</pre></div></div><div class="cell_output"><div class="output stream"><pre>printed
/tmp/scratch-1/out.json
</pre></div></div></div>
<div class="cell tag_hide-input"><details class="hide above-input"><summary>Show</summary>
<div class="cell_input"><pre>hidden = 1
hidden = 2
</pre></div></details></div>
<div class="highlight-python"><pre>def shown():
    return 1
</pre></div>
<details class="sd-dropdown"><div class="highlight-python"><pre>def hidden():
    pass
</pre></div></details>
<table><tr><td><p>A table cell is not prose, however long it runs on and on.</p></td></tr></table>
<p>The value is nan here, from PosixPath('/x'); see &lt;the-book-repository-address&gt;.</p>
</article></body></html>"""


def test_the_counter_on_a_small_page(tmp_path):
    path = tmp_path / "page.html"
    path.write_text(PAGE, encoding="utf8")
    page = read_page(path)
    assert page.equations == ["ch9-roof", "ch9-ridge"]  # the unlabelled one is not counted
    assert page.unreferenced == ["ch9-ridge"]
    assert page.diagrams == ["Two regions.", "A lane."]  # not the plot
    assert page.notebook_code_lines == 2  # not the hidden cell, not the output
    assert page.code_lines == 4  # and the package code shown, not the dropdown's
    assert page.sentences[:4] == [
        "One short sentence.",
        "A second one, e.g. with an abbreviation, and formula as one word?", "Yes.",
        "An item of four words"]
    assert "A nested item apart." in page.sentences
    assert not any("Navigation" in s or "table cell" in s for s in page.sentences)
    assert page.lengths()[1] == 12 and page.longest == 12
    kinds = sorted({leak.split(":")[0] for leak in page.leaks})
    assert kinds == ["NaN", "a placeholder", "a temporary path", "the repr of a path"]


@pytest.mark.parametrize("text, expected", [
    ("It is 3.5 ms. Then 4 ms.", ["It is 3.5 ms.", "Then 4 ms."]),
    ("Williams et al. (2009) said so.", ["Williams et al. (2009) said so."]),
    ("Is it? (Yes.) No.", ["Is it?", "(Yes.)", "No."]),
    ("the V2L loop. decode is lower case.", ["the V2L loop. decode is lower case."]),
])
def test_sentences_end_before_a_capital_or_a_digit(text, expected):
    assert sentences(text) == expected


# --- the book --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pages(built_book):
    return read_site(built_book, toc_docnames())


def chapter_docnames() -> list[str]:
    """The chapters' docnames; none where the book cannot be read (test_recordings says
    why, in one line, rather than the collection stopping here)."""
    chapters, _ = book_chapters(ROOT)
    return [p.relative_to(ROOT).with_suffix("").as_posix() for p in chapters.values()]


def toc_docnames() -> list[str]:
    try:
        return book.toc_files(ROOT)
    except book.BookError:
        return []


@pytest.mark.slow
@pytest.mark.parametrize("docname", chapter_docnames())
def test_a_chapter_derives_before_it_measures(pages, docname):
    page = pages[docname]
    assert len(page.equations) >= MIN_EQUATIONS, (docname, page.equations)
    assert page.unreferenced == [], f"{docname}: equations the text never refers to"
    assert len(page.diagrams) >= MIN_DIAGRAMS, f"{docname}: no picture of a mechanism"
    assert all(page.diagrams), f"{docname}: a diagram without alt text"


@pytest.mark.slow
@pytest.mark.parametrize("docname", chapter_docnames())
def test_a_chapter_shows_the_code_to_read_and_no_more(pages, docname):
    page = pages[docname]
    assert page.notebook_code_lines <= MAX_NOTEBOOK_LINES, (docname,
                                                            page.notebook_code_lines)
    assert page.code_lines <= MAX_CODE_LINES, (docname, page.code_lines)


@pytest.mark.slow
@pytest.mark.parametrize("docname", toc_docnames())
def test_sentences_a_person_would_write(pages, docname):
    page = pages[docname]
    assert page.longer_than(MAX_WORDS) == [], f"{docname}: sentences over {MAX_WORDS} words"
    if docname in chapter_docnames():
        assert page.median <= MAX_MEDIAN_WORDS, (docname, page.median)


@pytest.mark.slow
@pytest.mark.parametrize("docname", toc_docnames())
def test_nothing_on_a_page_that_is_not_for_the_reader(pages, docname):
    assert pages[docname].leaks == []


MAINTAINER_MATTER = re.compile(r"git show|scripts/probes|probe_|no network|NaN|"
                               r"Jupyter packages|gpu_record\.sh")


@pytest.mark.slow
def test_the_reproduce_page_is_for_readers(built_book):
    from bs4 import BeautifulSoup

    article = BeautifulSoup((built_book / "book" / "reproduce.html").read_text(),
                            "html.parser").select_one("article")
    found = MAINTAINER_MATTER.findall(article.get_text(" "))
    assert found == [], "maintainer matter on the reproduce page (it belongs in the README)"


CORPUS_WRONG = re.compile(r"Python sources (?:installed )?(?:on|of) (?:your|the) machine|"
                          r"machine's Python sources", re.I)


def test_every_description_of_the_training_corpus_is_the_frozen_snapshot():
    """Chapter 6 trains on the book's own text frozen into the package: no page or README
    says it trains on the machine's installed Python sources."""
    texts = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf8")
             for p in [ROOT / "README.md", *sorted((ROOT / "book").glob("*.md"))]}
    wrong = [name for name, text in texts.items() if CORPUS_WRONG.search(" ".join(text.split()))]
    assert wrong == []


def test_the_draft_chapter_derives_before_it_measures():
    """Chapter 7 is a draft, out of the TOC (the site does not build it): its source holds
    its labelled display equations, each referred to."""
    text = (ROOT / "book" / "07_tensor_parallel.md").read_text(encoding="utf8")
    labels = re.findall(r"^\$\$\s*\((ch7-[\w-]+)\)\s*$", text, re.M)
    assert len(labels) >= MIN_EQUATIONS, labels
    assert all(f"{{eq}}`{label}`" in text for label in labels)


def prose_lines(text: str):
    """(line number, line) of a MyST page's markdown, code fences skipped: fences of code
    cells and of a language are code; a directive's fence ({note}, {glue:figure}) holds
    markdown."""
    code_fence = None  # the backticks that opened the code fence we are in
    for number, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^\s*(`{3,})(.*)$", line)
        if code_fence:
            if fence and fence.group(1).startswith(code_fence) and not fence.group(2).strip():
                code_fence = None
            continue
        if fence:
            info = fence.group(2).strip()
            if info.startswith("{code-cell}") or info and not info.startswith("{"):
                code_fence = fence.group(1)
            continue
        yield number, line


@pytest.mark.parametrize("path", sorted((ROOT / "book").glob("*.md")), ids=lambda p: p.name)
def test_no_line_of_prose_is_lost_to_a_comment(path):
    """A markdown line that starts with % is a MyST comment: the page drops it without a
    word (a sentence wrapped before "100 %" loses its end)."""
    lost = [f"{path.name}:{n}: {line.strip()}" for n, line in
            prose_lines(path.read_text(encoding="utf8")) if line.lstrip().startswith("%")]
    assert lost == []
