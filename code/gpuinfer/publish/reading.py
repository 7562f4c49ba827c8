"""How a built page reads: what the site's reading tests (tests/test_reading.py) count.

On a page of the built site, its article only (not the navigation around it):

- **equations**: labelled display equations (`$$ … $$ (label)`, a `{math}` block with a
  label, a `{glue:math}` with one) and whether the text refers to each (`{eq}`);
- **diagrams**: pictures of a mechanism, marked as such: the image a code cell tagged
  `diagram` draws, or an image or figure of class `diagram`; each needs alt text;
- **sentences**: every paragraph and list item (prose, captions, admonitions and the
  Markdown a cell displays; not code, tables or references) split into sentences, each
  counted in words, an inline formula as one word;
- **code lines**: the lines of code a reader sees without a click, notebook cells apart
  (a cell's input behind "Show code cell source" is not seen; its outputs are not code);
- **leaks**: what is not for the reader: a warning, a traceback, the repr of a path or of
  a figure, a temporary or home path, NaN, a placeholder.

`python -m gpuinfer.publish.reading [_build/html]` prints a line a page.
"""

from __future__ import annotations

import copy
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpuinfer.publish.book import toc_files

# What is not for the reader, by what it looks like in a page's text.
LEAKS = {
    "a traceback": re.compile(r"Traceback \(most recent call last\)"),
    "a warning or an error": re.compile(r"\b[A-Z][A-Za-z]*(?:Warning|Error): "),
    "the repr of a path": re.compile(r"\b(?:Posix|Windows|Pure)?Path\('"),
    "a temporary path": re.compile(r"(?<![\w.])/(?:tmp|var/folders|private/var)/"),
    "a home or install path": re.compile(r"(?<![\w.])/(?:root|home|Users)/\w|site-packages"),
    "the repr of an object": re.compile(r"<(?:Figure size|[\w.]+ object at 0x)"),
    "NaN": re.compile(r"\b(?:nan|NaN|NAN)\b"),
    "a placeholder": re.compile(r"<(?:the-[\w-]+|owner|repository|your-[\w-]+)>|"
                                r"\bTODO\b|\bFIXME\b|\bXXX\b|\{\{|\}\}"),
}
# Abbreviations whose full stop does not end a sentence.
ABBREVIATIONS = ("e.g.", "i.e.", "et al.", "vs.", "cf.", "Fig.", "Eq.", "approx.", "etc.")
SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"”’)\]]))\s+(?=[\"“‘(\[]?[A-Z0-9])")
WORD = re.compile(r"\S*[\w]\S*")


@dataclass
class Page:
    """What one built page holds, as the reading tests count it."""

    name: str
    equations: list[str] = field(default_factory=list)  # the labels of display equations
    referenced: set[str] = field(default_factory=set)  # labels the text refers to
    diagrams: list[str] = field(default_factory=list)  # each one's alt text
    sentences: list[str] = field(default_factory=list)
    notebook_code_lines: int = 0
    code_lines: int = 0  # notebook cells, literalinclude and code blocks
    leaks: list[str] = field(default_factory=list)  # "what: the text around it"

    def lengths(self) -> list[int]:
        return [len(WORD.findall(s)) for s in self.sentences]

    @property
    def longest(self) -> int:
        return max(self.lengths(), default=0)

    @property
    def median(self) -> float:
        return statistics.median(self.lengths()) if self.sentences else 0.0

    def longer_than(self, words: int) -> list[str]:
        return [s for s, n in zip(self.sentences, self.lengths()) if n > words]

    @property
    def unreferenced(self) -> list[str]:
        return [e for e in self.equations if e not in self.referenced]


def _article(html: str):
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    article = soup.select_one("article.bd-article") or soup.select_one("main") or soup
    for hidden in article.select("script, style, .headerlink"):
        hidden.decompose()
    return article


def _hidden(node) -> bool:
    """Whether a reader must click to see `node` (a dropdown or a hidden cell's input)."""
    return node.find_parent("details") is not None


def _lines(pre) -> int:
    return len(pre.get_text().rstrip("\n").splitlines())


def _prose(node) -> str:
    """The words of a paragraph or list item: an inline formula as one word, a nested
    list apart (its items are items of their own)."""
    node = copy.copy(node)
    for nested in node.select("ul, ol"):
        nested.decompose()
    for math in node.select("span.math"):
        math.replace_with(" formula ")
    return " ".join(node.get_text().split())


def sentences(text: str) -> list[str]:
    """`text` split into sentences, after a full stop, a question or exclamation mark
    followed by a capital or a digit (not after the usual abbreviations)."""
    protected = text
    for i, abbr in enumerate(ABBREVIATIONS):
        protected = protected.replace(abbr, abbr.replace(".", f"\x00{i}\x00"))
    out = []
    for s in SENTENCE_END.split(protected):
        s = re.sub(r"\x00\d+\x00", ".", s).strip()
        if WORD.search(s):
            out.append(s)
    return out


PROSE_OUTSIDE = ("table", "pre", "nav", "dl.citation", "div.citation", ".bibliography",
                 "aside.footnote", "div.cell_input", "div.toctree-wrapper")


def read_page(path: Path, name: str | None = None) -> Page:
    """Count what a built page holds (the module docstring says what)."""
    article = _article(Path(path).read_text(encoding="utf8"))
    page = Page(name or Path(path).stem)
    for block in article.select("div.math"):
        if block.select_one("span.eqno") is not None:
            page.equations.append((block.get("id") or "").removeprefix("equation-"))
    page.referenced = {a["href"].split("#equation-", 1)[1]
                       for a in article.select('a[href*="#equation-"]')}
    for img in article.select("div.tag_diagram img, .diagram img, img.diagram"):
        page.diagrams.append(img.get("alt", "").strip())

    excluded = {id(n) for sel in PROSE_OUTSIDE for n in article.select(sel)}

    def outside(node) -> bool:
        return id(node) not in excluded and \
            not any(id(p) in excluded for p in node.parents)

    for node in article.select("p, li"):
        if not outside(node) or node.name == "li" and node.find("p") is not None:
            continue
        if "admonition-title" in (node.get("class") or []) or node.find_parent("summary"):
            continue
        page.sentences += sentences(_prose(node))

    for cell_input in article.select("div.cell_input"):
        if not _hidden(cell_input):
            page.notebook_code_lines += sum(_lines(pre) for pre in cell_input.select("pre"))
    for pre in article.select("pre"):
        if not _hidden(pre) and pre.find_parent("div", class_="cell_output") is None \
                and pre.find_parent(class_="output") is None:
            page.code_lines += _lines(pre)

    for code in article.select("div.cell_input, div.highlight-python, "
                               "div.highlight-ipython3, div.highlight-default, "
                               "div.math, span.math"):
        code.decompose()  # code may say nan or /tmp, TeX `}}`; what a cell prints may not
    text = article.get_text(" ")
    for what, pattern in LEAKS.items():
        for m in pattern.finditer(text):
            around = " ".join(text[max(0, m.start() - 60):m.end() + 60].split())
            page.leaks.append(f"{what}: …{around}…")
    return page


def read_site(html: Path, docnames: list[str]) -> dict[str, Page]:
    """{docname: Page} of the built site's pages."""
    return {d: read_page(Path(html) / f"{d}.html", d) for d in docnames}


def main(argv: list[str] | None = None) -> int:
    """`python -m gpuinfer.publish.reading [HTML_FOLDER] [--long N]`: a line a page of the
    TOC; with --long N, every sentence over N words and every leak."""
    args = sys.argv[1:] if argv is None else list(argv)
    long_words = None
    if "--long" in args:
        i = args.index("--long")
        long_words = int(args[i + 1])
        del args[i:i + 2]
    html = Path(args[0] if args else "_build/html")
    root = Path.cwd()
    pages = read_site(html, [d for d in toc_files(root) if (html / f"{d}.html").is_file()])
    print(f"{'page':34} {'eqs':>4} {'refd':>4} {'diag':>4} {'nb code':>7} {'code':>5} "
          f"{'sent':>5} {'>45':>4} {'max':>4} {'median':>6} {'leaks':>5}")
    for name, p in pages.items():
        print(f"{name:34} {len(p.equations):4d} {len(p.equations) - len(p.unreferenced):4d} "
              f"{len(p.diagrams):4d} {p.notebook_code_lines:7d} {p.code_lines:5d} "
              f"{len(p.sentences):5d} {len(p.longer_than(45)):4d} {p.longest:4d} "
              f"{p.median:6.1f} {len(p.leaks):5d}")
        if long_words is not None:
            for s in p.longer_than(long_words):
                print(f"    [{len(WORD.findall(s))} words] {s}")
            for leak in p.leaks:
                print(f"    LEAK {leak}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
