"""What the site's extensions (gpuinfer.publish.sphinx_*) add to the built site: the spec
table rendered from the package, the run times read from the recordings, alt text on
figures, the download menu, a page head without the theme's script errors, and author-year
labels on the references page. Checked in the HTML of the session's build."""

import html
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("sphinx.addnodes")  # the GPU machine runs the GPU tests without Sphinx

from gpuinfer import roofline  # noqa: E402
from gpuinfer.publish import book, recordings  # noqa: E402
from gpuinfer.publish.sphinx_downloads import add_download_buttons  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


@pytest.mark.slow
def test_spec_table_is_the_package_table(built_book):
    table = re.search(r'<table class="[^"]*gpu-spec-table.*?</table>',
                      (built_book / "book" / "appendix.html").read_text(), re.S)
    assert table, "no GPU spec table on the appendix page"
    rows = [text_of(r) for r in re.findall(r"<tr.*?</tr>", table.group(0), re.S)[1:]]
    assert len(rows) == len(roofline.GPU_SPECS)
    for spec, row in zip(roofline.GPU_SPECS, rows):
        assert spec.name in row and spec.memory in row and f"{spec.hbm_tbs:g}" in row
        if spec.bf16_tflops:
            ridge = roofline.ridge_point(spec.bf16_tflops * 1e12, spec.hbm_tbs * 1e12)
            assert f"{spec.bf16_tflops:g}" in row and f" {ridge:.0f} " in row + " "


@pytest.mark.slow
def test_run_times_table_lists_every_chapter(built_book):
    html = (built_book / "book" / "reproduce.html").read_text()
    table = re.search(r'<table class="[^"]*recorded-runtimes.*?</table>', html, re.S)
    assert table, "no run-time table on the reproduce page"
    for chapter, path in book.chapters(ROOT).items():
        assert f'href="{path.stem}.html"' in table.group(0), chapter
        st = recordings.status(ROOT, chapter)
        if st.state in ("fresh", "stale"):
            assert f"{st.provenance['seconds']:.0f}" in text_of(table.group(0))


@pytest.mark.slow
def test_chapter_figures_have_alt_text(built_book):
    for chapter, path in book.chapters(ROOT).items():
        page = (built_book / path.relative_to(ROOT).with_suffix(".html")).read_text()
        for alt in re.findall(r'<img alt="([^"]*)"', page):
            # a plot's, made from its labels ("Figure: ..."), or a diagram's own sentences
            assert len(alt.split()) >= 3 and not alt.endswith(".png"), (chapter, alt)


@pytest.mark.slow
def test_page_head_has_no_duplicate_script_and_a_valid_colour_mode(built_book):
    page = (built_book / "book" / "intro.html").read_text()
    assert page.count("const THEBE_JS_URL") <= 1
    assert 'data-default-mode="auto"' in page


@pytest.mark.parametrize("pdf", ["printed after the build", "there already", "none"])
def test_download_menu_gets_the_recording_files(pdf, tmp_path, monkeypatch):
    """The recording and artifact links of a page go into the theme's download menu, after
    the page's source and before "print to PDF"; the whole book's PDF last, where the site
    will have it (a plain build links none, rather than a missing file)."""
    monkeypatch.delenv("GPUINFER_PDF", raising=False)
    if pdf == "printed after the build":
        monkeypatch.setenv("GPUINFER_PDF", "1")
    elif pdf == "there already":
        (tmp_path / "book.pdf").write_bytes(b"%PDF-1.7")
    app = SimpleNamespace(outdir=str(tmp_path), env=SimpleNamespace(dlfiles={
        "book/_recorded/01_roofline.ipynb": ({"book/01_roofline"}, "abc/01_roofline.ipynb"),
        "book/_recorded/01_roofline/trace.json.gz": ({"book/01_roofline"}, "def/trace.json.gz"),
        "book/_recorded/02_decode.ipynb": ({"book/02_decode"}, "ghi/02_decode.ipynb"),
        "book/data.csv": ({"book/01_roofline"}, "jkl/data.csv"),
    }))
    group = {"label": "download-buttons", "buttons": [{"text": ".md"}, {"text": ".pdf"}]}
    context = {"header_buttons": [group], "pathto": lambda uri, resource: "../" + uri}
    add_download_buttons(app, "book/01_roofline", "page.html", context, None)
    texts = [".md", ".ipynb (recorded)", "trace.json.gz", ".pdf"]
    if pdf == "none":
        assert [b["text"] for b in group["buttons"]] == texts
    else:
        assert [b["text"] for b in group["buttons"]] == texts + ["book.pdf (whole book)"]
        assert group["buttons"][-1]["url"] == "../book.pdf"  # printed from the built site
    assert group["buttons"][1]["url"] == "../_downloads/abc/01_roofline.ipynb"


@pytest.mark.slow
def test_references_are_labelled_by_author_and_year(built_book):
    page = html.unescape(text_of((built_book / "book" / "references.html").read_text()))
    page = re.sub(r"\[ (.*?) \]", r"[\1]", page)  # "[ label ]": the brackets are own spans
    assert "[Williams et al., 2009]" in page and "[Okabe and Ito, 2008]" in page
    assert "[PyTorch Contributors, n.d.-a]" in page and "[PyTorch Contributors, n.d.-b]" in page
    assert not re.search(r"\[[A-Z][A-Za-z]{1,3}\+?\d\d\]", page), "an alpha label is left"


def test_author_year_labels():
    from pybtex.database import Entry, Person

    from gpuinfer.publish.sphinx_bib import AuthorYearLabels

    def entry(authors, year=None):
        e = Entry("misc", fields={"year": year} if year else {})
        for name in authors:
            e.add_person(Person(name), "author")
        return e

    entries = [entry(["Williams, Samuel", "Waterman, Andrew", "Patterson, David"], "2009"),
               entry(["Okabe, Masataka", "Ito, Kei"], "2008"), entry(["{NVIDIA}"], "2024"),
               entry(["{NVIDIA}"], "2024"), entry(["Kaiser, {\\L}ukasz", "others"], "2017"),
               entry(["{PyTorch Contributors}"])]
    assert list(AuthorYearLabels().format_labels(entries)) == [
        "Williams et al., 2009", "Okabe and Ito, 2008", "NVIDIA, 2024a", "NVIDIA, 2024b",
        "Kaiser et al., 2017", "PyTorch Contributors, n.d."]


def test_the_repository_address_from_the_workflow_or_the_checkout(monkeypatch, tmp_path):
    from gpuinfer.publish import sphinx_repository

    for key in ("GPUINFER_REPOSITORY", "GITHUB_REPOSITORY", "GITHUB_SERVER_URL"):
        monkeypatch.delenv(key, raising=False)
    assert sphinx_repository.repository_url(tmp_path) is None  # not a checkout: no address
    monkeypatch.setenv("GITHUB_REPOSITORY", "owner/book")  # any GitHub Actions run
    assert sphinx_repository.repository_url(tmp_path) == "https://github.com/owner/book"
    monkeypatch.setenv("GPUINFER_REPOSITORY", "git@github.com:owner/other.git")
    assert sphinx_repository.repository_url(tmp_path) == "https://github.com/owner/other"
    monkeypatch.delenv("GPUINFER_REPOSITORY")
    monkeypatch.delenv("GITHUB_REPOSITORY")
    import subprocess
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "remote", "add", "origin",
                    "https://github.com/someone/gpu-book.git"], check=True)
    assert sphinx_repository.repository_url(tmp_path) == "https://github.com/someone/gpu-book"
    # a clone of a local folder: its origin is a path, which no page can link to
    subprocess.run(["git", "-C", str(tmp_path), "remote", "set-url", "origin",
                    "/work/gpu-book"], check=True)
    assert sphinx_repository.repository_url(tmp_path) is None
    monkeypatch.setenv("GPUINFER_REPOSITORY", "/work/gpu-book")  # set, but wrong: say so
    with pytest.raises(ValueError, match="GPUINFER_REPOSITORY.*https://host/owner/name"):
        sphinx_repository.repository_url(tmp_path)


def test_the_repository_button_and_substitution(monkeypatch, tmp_path):
    from gpuinfer.publish import sphinx_repository

    monkeypatch.setenv("GPUINFER_REPOSITORY", "https://github.com/owner/book")
    app = SimpleNamespace(srcdir=str(tmp_path))
    config = SimpleNamespace(html_theme_options={"repository_url": "x"},
                             myst_substitutions={})
    sphinx_repository.set_repository(app, config)
    assert config.html_theme_options == {"repository_url": "https://github.com/owner/book",
                                         "use_repository_button": True}
    assert config.myst_substitutions["repository"] == "https://github.com/owner/book"
    monkeypatch.delenv("GPUINFER_REPOSITORY")
    monkeypatch.delenv("GITHUB_REPOSITORY", raising=False)
    sphinx_repository.set_repository(app, config)  # tmp_path is no checkout: no button
    assert config.html_theme_options == {"use_repository_button": False}
    assert config.myst_substitutions["repository"] == sphinx_repository.NO_REPOSITORY


def test_results_rows_against_both_denominators_and_the_fastest_of_ours():
    from gpuinfer.publish.sphinx_results import cells, fastest
    from gpuinfer.report.results import Result

    ours = Result("V9", "m", 1.0, 3.0e9, 4.0e12, prefill_ms=12.0)
    stock = Result("generate(static)", "m", 0.5, 3.0e9, 4.0e12, stock=True)
    spec = Result("speculative", "m", 0.4, None, 4.0e12)
    assert cells(ours, 5.0e12)[:6] == ["1", "1,000", "12", "3,000", "75 %", "60 %"]
    assert cells(spec, 5.0e12)[2:6] == ["–", "–", "–", "–"]  # no per-token floor
    assert cells(ours, None)[5] == "–"  # a GPU without a datasheet row
    assert fastest([ours, stock, spec]) == [spec]  # the fastest of the book's own loops
    assert fastest([stock]) == []


@pytest.mark.parametrize("url", ["https://github.com/owner/book", None])
def test_the_commands_clone_the_repository_the_build_knows(url):
    """With the repository's address, the commands clone it; without one (a local build,
    read in a clone already) they start in the book's folder: never a placeholder."""
    from gpuinfer.publish.sphinx_repository import RepositoryCommands

    directive = object.__new__(RepositoryCommands)
    directive.state = SimpleNamespace(document=SimpleNamespace(settings=SimpleNamespace(
        env=SimpleNamespace(config=SimpleNamespace(
            html_theme_options={"repository_url": url} if url else {})))))
    [block] = directive.run()
    text = block.astext()
    assert "<" not in text and "gpuinfer.publish.record" in text
    if url:
        assert text.startswith(f"git clone {url} gpu-book && cd gpu-book\n")
    else:
        assert "git clone" not in text


@pytest.mark.slow
def test_the_reproduce_page_clones_an_address_or_none(built_book):
    """On the built page: `git clone` of an https address, or no clone at all."""
    text = html.unescape(text_of((built_book / "book" / "reproduce.html").read_text()))
    address = re.search(r"git clone (\S+) gpu-book", text)
    assert "git clone" not in text or (address and address.group(1).startswith("https://"))
