"""Every chapter of the book has a fresh GPU recording in book/_recorded/, and the TOC
and pages the chapters are found from read cleanly.

Fails, naming the chapter and the command that re-records it, when a recording is missing,
stale (the chapter's code cells, the gpuinfer modules it imports or its artifacts changed
since), corrupt, unfinished, or a CPU smoke recording. Recording needs the GPU: see
README.md, "Recording on a GPU". A book that cannot be read (a page that is not UTF-8,
front matter that is not YAML, a TOC that is not YAML or not one Jupyter Book reads, a TOC
entry outside the book, two chapters with one name) fails one test with the one line that
names the file and the fix, not the collection. `python -m gpuinfer.publish.recordings`
prints every chapter's state.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import book_chapters
from gpuinfer.publish import book, record, recordings

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).parent / "fixtures" / "book"
CHAPTERS, BOOK_ERROR = book_chapters(ROOT)


def test_the_toc_has_chapters():
    if BOOK_ERROR:
        pytest.fail(BOOK_ERROR, pytrace=False)
    assert CHAPTERS, f"no MyST notebook chapters in {ROOT / '_toc.yml'}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_has_a_fresh_gpu_recording(chapter):
    st = recordings.status(ROOT, chapter)
    if not st.fresh:
        pytest.fail(st.message, pytrace=False)
    assert st.provenance["gpu"], f"{chapter}: the recording names no GPU"


def test_recordings_are_small():
    folder = ROOT / "book" / "_recorded"
    files = [f for f in folder.rglob("*") if f.is_file()] if folder.is_dir() else []
    total = sum(f.stat().st_size for f in files)
    biggest = sorted(files, key=lambda f: f.stat().st_size)[-3:]
    assert total <= record.SIZE_LIMIT_MB * 1e6, (
        f"book/_recorded holds {total / 1e6:.1f} MB, over {record.SIZE_LIMIT_MB} MB; the "
        f"biggest: {', '.join(f'{f.name} {f.stat().st_size / 1e6:.1f} MB' for f in biggest)}")


def test_nothing_is_left_over_in_the_recordings():
    """Only recordings: no file a killed run left (`.*.tmp`), no unfinished write (a
    journal), no folder of a chapter the book does not have."""
    folder = ROOT / "book" / "_recorded"
    expected = {".gitignore", "README.md"} | {f"{c}.ipynb" for c in CHAPTERS} | set(CHAPTERS)
    extra = sorted(p.name for p in folder.iterdir() if p.name not in expected)
    assert not extra, (f"book/_recorded holds {', '.join(extra)}: `python -m "
                       "gpuinfer.publish.record --recover` finishes or removes what an "
                       "interrupted recording left; remove anything else")


def test_the_freshness_command_names_every_chapter_and_its_state(tmp_path, capsys):
    """`python -m gpuinfer.publish.recordings`: a line per chapter, its state first, then a
    count; exit 1 unless every chapter is fresh, 2 (one line) for a book it cannot read."""
    root = fixture_copy(tmp_path)
    assert recordings.main(["--root", str(root)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("missing    chapter ch_a has no valid GPU recording: there "
                               "is no recording book/_recorded/ch_a.ipynb")
    assert lines[1].startswith("missing    chapter ch_b ")
    assert lines[2:] == ["0 of 2 chapters fresh; re-record ch_a, ch_b"]
    (root / "_toc.yml").write_text("book/intro\n")
    assert recordings.main(["--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "_toc.yml is not a Jupyter Book" in err
    assert err.count("\n") == 1


# --- a book that cannot be read: one line, naming the file and the fix --------------------

def fixture_copy(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURE, tmp_path / "book",
                                ignore=shutil.ignore_patterns("_build", "_recorded")))


def add_to_toc(root: Path, entry: str) -> None:
    toc = root / "_toc.yml"
    toc.write_text(toc.read_text() + f"  - file: {entry}\n")


def _not_utf8(root):
    with open(root / "book" / "intro.md", "ab") as f:
        f.write(b"caf\xe9\n")  # Latin-1, on a page that is not a chapter


def _bad_front_matter(root):
    path = root / "book" / "ch_b.md"
    path.write_text(path.read_text().replace("kernelspec:", "kernelspec: [", 1))


def _unclosed_front_matter(root):
    path = root / "book" / "ch_b.md"
    path.write_text("---\njupytext: {}\n" + path.read_text().split("\n---\n", 1)[1])


def _outside(root):
    outside = root.parent / "elsewhere"
    outside.mkdir()
    shutil.copy(root / "book" / "ch_b.md", outside / "ch_c.md")
    add_to_toc(root, "../elsewhere/ch_c")


def _absolute(root):
    add_to_toc(root, str(root.parent / "elsewhere" / "ch_c"))


def _two_named_alike(root):
    (root / "other").mkdir()
    shutil.copy(root / "book" / "ch_b.md", root / "other" / "ch_b.md")
    add_to_toc(root, "other/ch_b")


def _bad_toc(root):
    (root / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n"
                                    "  - file: book/ch_a\n   - file: [\n")


def _not_a_toc(root):
    (root / "_toc.yml").write_text("- book/ch_a\n")


def _toc_is(text: str):
    def damage(root):
        (root / "_toc.yml").write_text(text)
    return damage


def _toc_with(chapters: str):
    def damage(root):
        (root / "_toc.yml").write_text(f"format: jb-book\nroot: book/intro\nchapters:\n"
                                        f"{chapters}")
    return damage


UNREADABLE = {
    "not-utf8": (_not_utf8, "book/intro.md is not UTF-8 text: byte 0xe9 on line"),
    "front-matter": (_bad_front_matter, "book/ch_b.md: its front matter is not valid YAML"),
    "unclosed-front-matter": (_unclosed_front_matter, "has no closing '---' line"),
    "outside": (_outside, "the entry '../elsewhere/ch_c' lies outside the book"),
    "absolute": (_absolute, "lies outside the book"),
    "two-named-alike": (_two_named_alike,
                        "lists two chapters named ch_b (book/ch_b.md, other/ch_b.md)"),
    "bad-toc": (_bad_toc, "_toc.yml is not valid YAML (line 5)"),
    "not-a-toc": (_not_a_toc, "_toc.yml is not a Jupyter Book table of contents"),
    # the shapes a TOC can take that YAML reads but Jupyter Book does not
    "toc-file-not-a-path": (_toc_with("  - file: 5\n"),
                            "_toc.yml is not a Jupyter Book table of contents: the entry "
                            "chapters[0] has file: 5, which is not a page path"),
    "toc-file-empty": (_toc_with("  - file:\n"), "chapters[0] has file: None"),
    "toc-sections-not-a-list": (_toc_with("  - file: book/ch_a\n    sections: book/ch_b\n"),
                                "the entry chapters[0] has sections: 'book/ch_b', which is "
                                "not a list of entries"),
    "toc-entry-not-a-mapping": (_toc_with("  - book/ch_a\n"),
                                "the entry chapters[0] is 'book/ch_a', not a mapping"),
    "toc-entry-without-file": (_toc_with("  - title: A\n"),
                               "the entry chapters[0] ({'title': 'A'}) has no file: key"),
    "toc-plain-string": (_toc_is("book/intro\n"), "_toc.yml is not a Jupyter Book table of "
                         "contents (it holds 'book/intro', not key: value lines)"),
    "toc-empty": (_toc_is(""), "(it is empty): it needs a 'root:' page"),
    "toc-no-root": (_toc_is("format: jb-book\nchapters:\n  - file: book/ch_a\n"),
                    "(it has no root: key): it needs a 'root:' page"),
    # what YAML and the shapes above take but Jupyter Book's own reader refuses
    "toc-no-format": (_toc_is("root: book/intro\nchapters:\n  - file: book/ch_a\n"),
                      "Unknown keys found: {'chapters'}"),
    "toc-unknown-key": (_toc_with("  - file: book/ch_a\n    foo: 1\n"),
                        "Unknown keys found: {'foo'}"),
    "toc-page-twice": (_toc_with("  - file: book/ch_a\n  - file: book/ch_a\n"),
                       "document file used multiple times: 'book/ch_a'"),
    "toc-missing-page": (_toc_with("  - file: book/ch_a\n  - file: book/nope\n"),
                         "_toc.yml: the entry 'book/nope' names no file of the book (no "
                         "book/nope.md)"),
    "toc-nul-byte": (_toc_with('  - file: "book/ch\\0a"\n'),
                     "the entry 'book/ch\\x00a' is not a usable file name"),
    "toc-name-too-long": (_toc_with(f"  - file: book/{'a' * 300}\n"),
                          "is not a usable file name (File name too long)"),
}


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_an_unreadable_book_is_one_line_naming_the_file(case, tmp_path, monkeypatch):
    damage, said = UNREADABLE[case]
    root = fixture_copy(tmp_path)
    damage(root)
    monkeypatch.chdir(root)
    with pytest.raises(book.BookError) as caught:
        book.chapters(root)
    message = str(caught.value)
    assert said in message and "\n" not in message
    fixes = ("save", "fix", "close it", "list pages", "rename", "needs")
    assert any(fix in message for fix in fixes), message


@pytest.mark.slow
def test_an_unreadable_page_fails_one_test_not_the_collection(tmp_path):
    """A copy of the repository with one Latin-1 byte in the glossary: every test module
    still collects, and test_the_toc_has_chapters fails with the one line."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("_toc.yml", "_config.yml", "pyproject.toml"):
        shutil.copy(ROOT / name, repo / name)
    shutil.copytree(ROOT / "book", repo / "book", ignore=shutil.ignore_patterns("_recorded"))
    for folder in ("tests", "scripts"):  # tests/test_blast.py imports scripts/blast.py
        shutil.copytree(ROOT / folder, repo / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    with open(repo / "book" / "glossary.md", "ab") as f:
        f.write(b"caf\xe9\n")
    run = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    collected = subprocess.run(run + ["--collect-only"], cwd=repo, capture_output=True,
                               text=True)
    assert collected.returncode == 0, collected.stdout[-3000:]
    failed = subprocess.run(run + ["tests/test_recordings.py::test_the_toc_has_chapters"],
                            cwd=repo, capture_output=True, text=True)
    assert failed.returncode == 1
    assert "book/glossary.md is not UTF-8 text: byte 0xe9 on line" in failed.stdout
    assert "Traceback" not in failed.stdout
