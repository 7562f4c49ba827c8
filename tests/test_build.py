"""Building the site from the GPU recordings, on a machine without a GPU.

- the real book: with every recording fresh, `jupyter-book build` executes no cell, warns
  about nothing, renders every TOC page with its figures and leaves `git status`
  unchanged; its seconds are printed (the README keeps them), never asserted: on a busy
  machine a build is slower, not wrong;
- the mechanism, on the fixture book recorded with --allow-cpu (accepted there through
  `gpuinfer_accept_cpu_recordings`): fresh chapters come from the recordings, a stale, a
  corrupt or an unfinished one is executed on the CPU with a banner and a warning naming
  the fix, and an incremental build picks up a re-recording;
- what a build refuses, with one line: an artifacts folder in or around any book (where a
  preview would overwrite recorded traces, this book's or another's) or the package, or a
  relative one, and a book whose TOC or pages cannot be read
  (`python -m gpuinfer.publish.build` checks the TOC before `jupyter-book build` reads
  it).
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import jupyter_book_build, recorded_files
from test_recordings import UNREADABLE
from gpuinfer.publish import book, record, recordings

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).parent / "fixtures" / "book"


def executed(log: str) -> list[str]:
    """The notebooks myst-nb executed (rather than took from its cache)."""
    return re.findall(r"(\S+): Executing notebook", log)


def sphinx_warnings(log: str) -> list[str]:
    return [line for line in log.splitlines()
            if "WARNING:" in line and not line.startswith("[IPKernelApp]")]


def page(html: Path, docname: str) -> str:
    path = html / f"{docname}.html"
    assert path.is_file(), f"no page {path}"
    return path.read_text(encoding="utf8")


def images(html: Path, docname: str) -> list[Path]:
    """The images a page shows; each must exist in the built site."""
    srcs = re.findall(r'<img [^>]*src="([^"]+)"', page(html, docname))
    paths = [(html / docname).parent / src for src in srcs if not src.startswith("data:")]
    missing = [p for p in paths if not p.is_file()]
    assert not missing, f"{docname}: missing images {missing}"
    return paths


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                          check=True).stdout


# --- the real book ------------------------------------------------------------------------

@pytest.mark.slow
def test_book_builds_from_the_recordings_without_executing(request):
    statuses = [recordings.status(ROOT, c) for c in book.chapters(ROOT)]
    stale = [st.message for st in statuses if not st.fresh]
    if stale:
        pytest.fail("not every chapter has a fresh GPU recording, so the build would execute "
                    "chapters on the CPU:\n" + "\n".join(stale), pytrace=False)
    in_git = shutil.which("git") and (ROOT / ".git").exists()
    before = git(ROOT, "status", "--porcelain") if in_git else None

    built = request.getfixturevalue("book_build")  # the session's one build of the book
    log, seconds, html = built.log, built.seconds, built.html
    print(f"\njupyter-book build from a clean _build: {seconds:.1f} s")

    assert executed(log) == [], "the build executed notebooks"
    assert log.count("Using cached notebook") == len(statuses)
    assert sphinx_warnings(log) == []
    for docname in book.toc_files(ROOT):
        page(html, docname)
    for st in statuses:
        docname = st.recording.parent.parent.relative_to(ROOT).as_posix() + "/" + st.chapter
        assert f"Recorded on an {st.provenance['gpu']}" in page(html, docname)
        assert images(html, docname), f"{docname}: its figures are not on the page"
    if in_git:
        assert git(ROOT, "status", "--porcelain") == before, "the build changed the git tree"


def test_the_build_reads_no_virtual_environment():
    """scripts/install makes .venv in the book's folder where the system's Python takes no
    pip installs: Sphinx must not read its thousands of files as pages (it stops on the
    first it cannot parse)."""
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf8"))
    assert ".venv" in config.get("exclude_patterns", []), (
        "_config.yml: add .venv to exclude_patterns")


# --- the mechanism, on the fixture book ----------------------------------------------------

def commit_all(root: Path) -> None:
    git(root, "add", "-A")
    git(root, "-c", "user.name=test", "-c", "user.email=test@example.com",
        "commit", "-q", "-m", "state")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_fixture_builds_from_recordings_and_previews_the_rest(tmp_path):
    root = Path(shutil.copytree(FIXTURE, tmp_path / "book",
                                ignore=shutil.ignore_patterns("_build", "_recorded")))
    html = root / "_build" / "html"
    (root / ".gitignore").write_text("_build/\n")
    assert record.main(["--root", str(root), "--allow-cpu"]) == 0
    ch_b = root / "book" / "ch_b.md"
    ch_b.write_text(ch_b.read_text().replace('print("gpuinfer"', 'print("gpuinfer version"'))
    git(root, "init", "-q")
    commit_all(root)

    # 1. from a clean _build: ch_a from its recording, the stale ch_b executed as a preview
    log = jupyter_book_build(root).log
    assert executed(log) == [str(ch_b)]
    assert "book/ch_a.md: Using cached notebook" in log
    [warning] = sphinx_warnings(log)
    assert "chapter ch_b" in warning and "python -m gpuinfer.publish.record ch_b" in warning
    a = page(html, "book/ch_a")
    assert "A CPU smoke run, not GPU results" in a  # the provenance box
    assert "ch_a.ipynb" in a and "trace.json.gz" in a  # download links
    assert "data.json" in a  # the values the figure and the glued number were drawn from
    assert "The answer is 45" in re.sub(r"<[^>]+>", "", a)  # glued by a presentation cell
    assert len(images(html, "book/ch_a")) == 1  # the figure, drawn from the recording
    results_page = re.sub(r"<[^>]+>", "", page(html, "book/results"))
    assert "V0 fixture" in results_page and "V9 fixture" in results_page  # read back
    assert "a CPU smoke run, not GPU results" in results_page
    assert "CPU preview: these outputs are not GPU results" in page(html, "book/ch_b")
    assert git(root, "status", "--porcelain") == ""

    # 2. ch_b re-recorded: an incremental build re-reads it and executes nothing
    assert record.main(["--root", str(root), "--allow-cpu", "ch_b"]) == 0
    commit_all(root)
    log = jupyter_book_build(root).log
    assert executed(log) == [] and "book/ch_b.md: Using cached notebook" in log
    assert sphinx_warnings(log) == [] and "build succeeded." in log
    assert "CPU preview" not in page(html, "book/ch_b")
    assert git(root, "status", "--porcelain") == ""

    # 3. a corrupt recording: reported by file name, executed as a preview, no traceback
    (root / "book" / "_recorded" / "ch_a.ipynb").write_text('{"cells": [')
    commit_all(root)
    log = jupyter_book_build(root).log
    assert executed(log) == [str(root / "book" / "ch_a.md")]
    [warning] = sphinx_warnings(log)
    assert "book/_recorded/ch_a.ipynb is unreadable" in warning
    assert "Traceback" not in log
    assert "CPU preview: these outputs are not GPU results" in page(html, "book/ch_a")
    assert git(root, "status", "--porcelain") == ""

    # 4. valid JSON, damaged inside (an image that is not base64): the same, and the rest
    # of the book is built
    assert record.main(["--root", str(root), "--allow-cpu", "ch_a"]) == 0
    rec = root / "book" / "_recorded" / "ch_a.ipynb"
    nb = json.loads(rec.read_text())
    [table] = [out for c in nb["cells"] for out in c.get("outputs", [])
               if "text/markdown" in out.get("data", {})]
    table["data"]["image/png"] = "not base64!"
    rec.write_text(json.dumps(nb))
    commit_all(root)
    log = jupyter_book_build(root).log  # the preview of step 3 is still in the cache
    [warning] = sphinx_warnings(log)
    assert "book/_recorded/ch_a.ipynb is unreadable" in warning and "not base64" in warning
    assert "Traceback" not in log and "binascii" not in log
    assert "CPU preview" in page(html, "book/ch_a") and "CPU preview" not in page(html,
                                                                                   "book/ch_b")

    # 5. an output whose data is a list, not a mapping (valid JSON): a preview, no crash
    assert record.main(["--root", str(root), "--allow-cpu", "ch_a"]) == 0
    nb = json.loads(rec.read_text())
    outputs = [out for c in nb["cells"] for out in c.get("outputs", []) if "data" in out]
    outputs[0]["data"] = []
    rec.write_text(json.dumps(nb))
    log = jupyter_book_build(root).log
    [warning] = sphinx_warnings(log)
    assert "is not of type 'object'" in warning and "Traceback" not in log
    assert "CPU preview" in page(html, "book/ch_a")

    # 6. a code cell edited inside the recording: the build and the tests say the same
    assert record.main(["--root", str(root), "--allow-cpu", "ch_a"]) == 0
    rec.write_text(rec.read_text().replace("xs = [1, 2, 3]", "xs = [1, 2, 4]"))
    assert recordings.status(root, "ch_a", accept_cpu=True).state == "stale"
    [warning] = sphinx_warnings(jupyter_book_build(root).log)
    assert "its code cells are not the ones it was recorded with" in warning

    # 7. a write cut short by a kill (the journal is there): a preview naming --recover
    assert record.main(["--root", str(root), "--allow-cpu", "ch_a"]) == 0
    (root / "book" / "_recorded" / ".ch_a.commit").write_text("being written")
    [warning] = sphinx_warnings(jupyter_book_build(root).log)
    assert "python -m gpuinfer.publish.record --recover" in warning
    assert record.main(["--root", str(root), "--recover"]) == 0

    # 8. the artifacts folder gone: stale, so the page never lists downloads that vanished
    shutil.rmtree(root / "book" / "_recorded" / "ch_a")
    [warning] = sphinx_warnings(jupyter_book_build(root).log)
    assert "missing: data.json, trace.json.gz" in warning
    assert "trace.json.gz" not in page(html, "book/ch_a")

    # 9. the rows the results page reads, glued unreadable by a presentation cell (no
    # re-recording: the page and the results page follow the edit): a warning there
    assert record.main(["--root", str(root), "--allow-cpu", "ch_a"]) == 0
    ch_a = root / "book" / "ch_a.md"
    text = ch_a.read_text()
    ch_a.write_text(text.replace("glue(GLUE_NAME, dumps(", "glue(GLUE_NAME, '[{\"variant\": ' "
                                 "or dumps("))
    assert recordings.status(root, "ch_a", accept_cpu=True).fresh
    [warning] = sphinx_warnings(jupyter_book_build(root).log)
    assert "its glued decode_results is unreadable" in warning
    assert "V9 fixture" not in re.sub(r"<[^>]+>", "", page(html, "book/results"))


@pytest.mark.slow
def test_pages_glue_their_peak_and_the_reproduce_page_names_the_hosts(tmp_path):
    """Every chapter page glues peak_gpu_gib (NaN: not recorded on a GPU), the one made
    from its recording and the preview alike, and the preview is cached with the cell that
    glues it; the reproduce page's tables come from the recordings, the GPU budget from
    gpuinfer.env; the results page heads a chapter by its title."""
    from gpuinfer import env

    root = Path(shutil.copytree(FIXTURE, tmp_path / "book",
                                ignore=shutil.ignore_patterns("_build", "_recorded")))
    for name in ("ch_a", "ch_b"):
        chapter = root / "book" / f"{name}.md"
        chapter.write_text(chapter.read_text() +
                           "\nPeak GPU memory: {glue:text}`peak_gpu_gib` GiB.\n")
    (root / "book" / "reproduce.md").write_text(
        "# Reproduce\n\nCapped at {{ gpu_budget_gib }} GiB ({{ gpu_budget_gb }} GB).\n\n"
        "```{recorded-runtimes}\n```\n\n```{recorded-hosts}\n```\n\n"
        "```{gpu-memory-fit}\n```\n")
    toc = root / "_toc.yml"
    toc.write_text(toc.read_text() + "  - file: book/reproduce\n")
    config = root / "_config.yml"
    config.write_text(config.read_text().replace(
        "    - gpuinfer.publish.sphinx_results\n",
        "    - gpuinfer.publish.sphinx_results\n    - gpuinfer.publish.sphinx_reproduce\n"))
    assert record.main(["--root", str(root), "--allow-cpu", "ch_a"]) == 0  # ch_b: none
    html = root / "_build" / "html"

    log = jupyter_book_build(root).log
    assert executed(log) == [str(root / "book" / "ch_b.md")]  # the preview
    [warning] = sphinx_warnings(log)
    assert "there is no recording book/_recorded/ch_b.ipynb" in warning
    text = {name: " ".join(re.sub(r"<[^>]+>", "", page(html, f"book/{name}")).split())
            for name in ("ch_a", "ch_b", "reproduce", "results")}
    assert "Peak GPU memory: nan GiB" in text["ch_a"]  # from its (CPU) recording
    assert "Peak GPU memory: nan GiB" in text["ch_b"]  # from the preview's own cell
    assert f"Host: {env.host_text(env.provenance())}" in text["ch_a"]
    budget_gb = env.GPU_BUDGET_GIB * 2**30 / 1e9
    assert f"Capped at {env.GPU_BUDGET_GIB:g} GiB ({budget_gb:.1f} GB)" in text["reproduce"]
    hosts = re.search(r'<table class="[^"]*recorded-hosts.*?</table>',
                      page(html, "book/reproduce"), re.S)
    assert hosts, "no table of the recordings' hosts"
    rows = [" ".join(re.sub(r"<[^>]+>", " ", r).split())
            for r in re.findall(r"<tr.*?</tr>", hosts.group(0), re.S)[1:]]
    assert rows[0].startswith("Chapter A none (CPU smoke run)") and \
        env.cpu_model() in rows[0] and f" {len(os.sched_getaffinity(0))} " in rows[0]
    assert rows[1].startswith("Chapter B not recorded yet")
    assert 'class="gpu-memory-fit' in page(html, "book/reproduce")
    assert "Chapter A: a fixture model" in text["results"] and "ch_a:" not in text["results"]

    log = jupyter_book_build(root).log  # the preview, with its cell, is cached
    assert executed(log) == [] and "book/ch_b.md: Using cached notebook" in log


# --- what a build refuses -----------------------------------------------------------------

JUPYTER_BOOK = [sys.executable, "-c", "from jupyter_book.cli.main import main; main()",
                "build"]
BUILD = [sys.executable, "-m", "gpuinfer.publish.build"]  # the book checked, then the above


def failed_build(root: Path, command: list[str] = JUPYTER_BOOK, **env) -> str:
    """A build expected to fail at its start: the error line it ends with."""
    proc = subprocess.run(command + [str(root)], cwd=root, capture_output=True, text=True,
                          env={**os.environ, **env})
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    return proc.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def recorded_fixture(tmp_path_factory) -> Path:
    root = Path(shutil.copytree(FIXTURE, tmp_path_factory.mktemp("fx") / "book",
                                ignore=shutil.ignore_patterns("_build", "_recorded")))
    assert record.main(["--root", str(root), "--allow-cpu"]) == 0
    return root


@pytest.mark.slow
@pytest.mark.parametrize("chapter_file", ["moved away", "kept"])
def test_a_chapter_taken_out_of_the_toc_leaves_the_results_page(recorded_fixture, tmp_path,
                                                                 chapter_file):
    """An incremental build after ch_a left the TOC (its page moved away, or kept beside
    the chapters as a draft): the results page shows only the chapters the TOC lists."""
    root = Path(shutil.copytree(recorded_fixture, tmp_path / "book"))
    html = root / "_build" / "html"
    jupyter_book_build(root)
    assert "V0 fixture" in re.sub(r"<[^>]+>", "", page(html, "book/results"))
    toc = root / "_toc.yml"
    toc.write_text(toc.read_text().replace("  - file: book/ch_a\n", ""))
    if chapter_file == "moved away":
        (root / "book" / "ch_a.md").rename(tmp_path / "ch_a.md")
    log = jupyter_book_build(root).log
    assert "build succeeded" in log
    results_page = re.sub(r"<[^>]+>", "", page(html, "book/results"))
    assert "V0 fixture" not in results_page and "V9 fixture" not in results_page


CODE = Path(book.__file__).resolve().parents[2]  # code/, the package's sources


@pytest.mark.parametrize("artifacts", [
    "{root}", "{root}/_build/traces", "{root}/book", "{root}/book/_recorded/x", "{root}/..",
    "/", "{code}", "{code}/gpuinfer", "{code}/gpuinfer/publish", "{code}/..", "leak",
    "{other}", "{other}/book/_recorded", "{other}/book/_recorded/ch_a", "{other}/_build/x",
    "{loose}", "{loose}/x", "{shelf}", "{tmp}"])
def test_an_artifacts_folder_in_or_around_a_book_or_the_package_is_refused(tmp_path,
                                                                             artifacts):
    """A preview writes a folder per chapter under GPUINFER_ARTIFACTS: refused in the
    book's root, its chapters or recordings, the package's sources, any other book (a
    folder holding a _toc.yml, or a _recorded: `loose` holds one with no TOC beside it),
    or a folder holding any of them (`shelf` holds a book three levels down); one line
    naming the value, the folder it meets and where to point it. Unset, or a folder apart
    from all of them: accepted."""
    root, other = tmp_path / "repo", tmp_path / "other"
    (root / "book").mkdir(parents=True)
    (other / "book" / "_recorded" / "ch_a").mkdir(parents=True)
    (other / "_toc.yml").write_text("format: jb-book\nroot: book/intro\n")
    loose = tmp_path / "loose"
    (loose / "_recorded").mkdir(parents=True)
    shelf = tmp_path / "shelf"
    (shelf / "a" / "b" / "c" / "_recorded").mkdir(parents=True)
    value = artifacts.format(root=root, code=CODE, other=other, loose=loose, shelf=shelf,
                             tmp=tmp_path)
    with pytest.raises(book.BookError) as caught:
        book.check_artifacts_env(root, value)
    line = str(caught.value)
    assert line.startswith(f"GPUINFER_ARTIFACTS={value} ") and "\n" not in line
    assert "unset it" in line and "absolute folder outside every book and the package" in line
    if artifacts.startswith(("{other}", "{loose}", "{shelf}")):
        assert "which holds _recorded (a book)" in line or "which holds _toc.yml (a book)" \
            in line, line
    for fine in (None, "", str(tmp_path / "artifacts"), str(shelf / "a" / "elsewhere")):
        book.check_artifacts_env(root, fine)


@pytest.mark.slow
@pytest.mark.parametrize("into", ["book/_recorded", "."])
def test_a_preview_never_writes_into_another_books_recordings(recorded_fixture, tmp_path,
                                                              into):
    """Two books side by side, both recorded: a build of A, whose ch_a is stale (a preview
    would write its trace), with GPUINFER_ARTIFACTS in B is refused, in one line naming B's
    folder; B is left byte for byte, and still fresh."""
    a = Path(shutil.copytree(recorded_fixture, tmp_path / "a"))
    b = Path(shutil.copytree(recorded_fixture, tmp_path / "b"))
    ch_a = a / "book" / "ch_a.md"
    ch_a.write_text(ch_a.read_text().replace("answer = sum(range(10))",
                                             "answer = sum(range(10)) + 0"))
    before = {path: path.read_bytes() for path in sorted(b.rglob("*")) if path.is_file()}
    value = str((b / into).resolve())
    line = failed_build(a, GPUINFER_ARTIFACTS=value)
    assert line.startswith(f"error: GPUINFER_ARTIFACTS={value} ") and "unset it" in line
    assert str(b.resolve()) in line
    assert {path: path.read_bytes() for path in sorted(b.rglob("*")) if path.is_file()} \
        == before
    assert all(recordings.status(b, ch, accept_cpu=True).fresh for ch in ("ch_a", "ch_b"))


@pytest.mark.slow
@pytest.mark.parametrize("artifacts", ["{root}/book/_recorded", "{root}/book", "leak",
                                       "{root}", "{root}/.."])
def test_a_build_never_writes_into_the_recordings(recorded_fixture, tmp_path, artifacts):
    """A stale chapter would run as a preview and write its trace under GPUINFER_ARTIFACTS:
    into the recordings, or the book, or (relative) each chapter's folder, or beside the
    book's sources. Refused."""
    root = Path(shutil.copytree(recorded_fixture, tmp_path / "book"))
    ch_a = root / "book" / "ch_a.md"
    ch_a.write_text(ch_a.read_text().replace("answer = sum(range(10))",
                                             "answer = sum(range(10)) + 0"))
    before = recorded_files(root)
    value = artifacts.format(root=root)
    line = failed_build(root, GPUINFER_ARTIFACTS=value)
    assert line.startswith(f"error: GPUINFER_ARTIFACTS={value} ") and "unset it" in line
    assert recorded_files(root) == before
    assert not (root / "book" / "leak").exists() and not (root / "book" / "ch_a").exists()
    assert not (root / "ch_a").exists() and not (tmp_path / "ch_a").exists()


@pytest.mark.slow
def test_a_presentation_cell_that_touches_the_gpu_stops_the_build(recorded_fixture,
                                                                  tmp_path):
    root = Path(shutil.copytree(recorded_fixture, tmp_path / "book"))
    ch_a = root / "book" / "ch_a.md"
    ch_a.write_text(ch_a.read_text().replace("plt.show()", "x = torch.ones(1).cuda()"))
    assert recordings.status(root, "ch_a", accept_cpu=True).fresh  # presentation only
    line = failed_build(root)
    assert line == ("error: chapter ch_a: presentation cell 4 uses torch.ones(1).cuda: a "
                    "presentation cell runs at build time on the CPU and cannot touch the "
                    "GPU or time anything; move that into a measurement cell")


@pytest.mark.parametrize("case", UNREADABLE)
def test_an_unreadable_book_stops_the_build_command_with_one_line(case, tmp_path,
                                                                  monkeypatch, capsys):
    """Every book the record command refuses, the build command refuses with the same
    line, before `jupyter-book build` reads the TOC (which would stop with a traceback)."""
    from gpuinfer.publish import build

    damage, said = UNREADABLE[case]
    root = Path(shutil.copytree(FIXTURE, tmp_path / "book",
                                ignore=shutil.ignore_patterns("_build", "_recorded")))
    damage(root)
    monkeypatch.chdir(root)
    assert build.main(["."]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and said in err and err.count("\n") == 1, err
    assert not (root / "_build").exists()


@pytest.mark.slow
@pytest.mark.parametrize("case, command", [
    ("toc-plain-string", "build"), ("toc-unknown-key", "build"), ("not-utf8", "build"),
    ("toc-missing-page", "jupyter-book"), ("toc-nul-byte", "jupyter-book")])
def test_an_unreadable_book_stops_the_build_with_one_line(case, command, tmp_path):
    """The build command, and `jupyter-book build` on a TOC its own reader takes: one
    line, no traceback."""
    damage, said = UNREADABLE[case]
    root = Path(shutil.copytree(FIXTURE, tmp_path / "book",
                                ignore=shutil.ignore_patterns("_build", "_recorded")))
    damage(root)
    line = failed_build(root, BUILD if command == "build" else JUPYTER_BOOK)
    assert line.startswith("error: ") and said in line
