"""Every chapter runs end to end on the CPU in smoke mode, with its self-checks passing.

The chapters' `assert`s are their self-checks, so a successful execution *is* the test. In
smoke mode a chapter must say so visibly: its outputs are not GPU results.
"""

import base64
import re
import shutil
import struct
from pathlib import Path

import pytest

from conftest import book_chapters
from gpuinfer.publish.book import chapters, drafts, read_chapter

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).parent / "fixtures" / "book"  # two tiny chapters, ch_a and ch_b
# A draft, out of the TOC, is tested too. (An unreadable book: test_recordings says why.)
CHAPTERS, _ = book_chapters(ROOT, with_drafts=True)


def execute_smoke(path: Path, tmp_path: Path, monkeypatch):
    """The chapter as it is recorded and built, in smoke mode: its measurement cells run
    as the record command runs them (keeping what its presentation cells read), then its
    presentation cells run from the kept values, as the build runs them."""
    import nbclient

    from gpuinfer.publish.kept import DATA_FILE
    from gpuinfer.publish.present import PresentationError, present
    from gpuinfer.publish.measuring import measuring_client

    artifacts = tmp_path / "artifacts"
    monkeypatch.setenv("GPUINFER_ARTIFACTS", str(artifacts))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # smoke mode even on a GPU machine
    nb = read_chapter(path)  # as the record command reads it
    kept = artifacts / path.stem
    client = measuring_client(nb, path.parent, kept)
    client.kernel_name = "python3"
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as err:
        pytest.fail(f"{path.name} failed in smoke mode:\n{err}", pytrace=False)
    try:
        present(nb, kept / DATA_FILE, path.parent, path.stem)
    except PresentationError as err:
        pytest.fail(str(err), pytrace=False)
    return nb


def output_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts.extend(str(v) for k, v in out.get("data", {}).items() if k.startswith("text/"))
    return "\n".join(parts)


def test_there_are_chapters():
    assert "01_roofline" in CHAPTERS


def test_a_draft_is_a_chapter_out_of_the_toc(tmp_path):
    """A chapter written but not listed in the TOC is a draft: left out of the build, still
    run in smoke mode by this file's tests. Pages that are not notebooks are neither."""
    root = Path(shutil.copytree(FIXTURE, tmp_path / "book"))
    toc = root / "_toc.yml"
    toc.write_text(toc.read_text(encoding="utf8").replace("  - file: book/ch_b\n", ""),
                   encoding="utf8")
    assert list(chapters(root)) == ["ch_a"]
    assert list(drafts(root)) == ["ch_b"]
    assert not set(drafts(ROOT)) & set(chapters(ROOT))


@pytest.mark.slow
@pytest.mark.parametrize("chapter", list(CHAPTERS))
def test_chapter_runs_in_smoke_mode(chapter, tmp_path, monkeypatch):
    nb = execute_smoke(CHAPTERS[chapter], tmp_path, monkeypatch)
    text = output_text(nb)
    assert "Smoke mode: no CUDA device" in text, "the smoke-mode warning must be visible"
    assert not list(CHAPTERS[chapter].parent.glob("*.ipynb")), "chapter wrote into book/"
    wide = {i: w for i, w in png_widths(nb) if w > MAX_PNG_WIDTH}
    assert not wide, (f"{chapter}: figures wider than {MAX_PNG_WIDTH} px (cell: width) are "
                      f"shrunk on the page until their text is unreadable; make them at "
                      f"most 7.5 inches wide: {wide}")


MAX_PNG_WIDTH = 1200  # the page shows a figure ~700 px wide: wider ones shrink their text


def png_widths(nb):
    """(cell index, width in pixels) of every PNG a chapter shows or glues."""
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            for key, data in out.get("data", {}).items():
                if key.endswith("image/png"):
                    head = base64.b64decode("".join(data)[:100])
                    yield i, struct.unpack(">II", head[16:24])[0]


def exercises(text: str) -> list[str]:
    """The exercises of a chapter's "Exercises" section, each with what follows it up to the
    next exercise (numbered list items at the start of a line)."""
    section = text.split("## Exercises", 1)[1] if "## Exercises" in text else ""
    section = re.split(r"\n## ", section, maxsplit=1)[0]
    return [part for part in re.split(r"\n(?=\d+\. )", "\n" + section) if part.strip()]


@pytest.mark.parametrize("chapter", list(CHAPTERS))
def test_every_exercise_has_an_answer(chapter):
    """An exercise without an answer leaves the reader unable to check their work: each
    one is followed by a dropdown with its answer, read from the recording."""
    items = exercises(CHAPTERS[chapter].read_text(encoding="utf8"))
    bare = [item.strip().splitlines()[0][:70] for item in items if "dropdown" not in item]
    assert not bare, f"{chapter}: exercises without a dropdown answer: {bare}"


HIDDEN = {"remove-input", "remove-cell"}  # cells whose code the page never shows (hide-input
# cells show it on a click, in the same column)


@pytest.mark.parametrize("chapter", list(CHAPTERS))
def test_shown_code_fits_the_column(chapter):
    """The page's code column is 88 characters: a longer line scrolls sideways."""
    long = [f"cell {i}: {line}" for i, cell in enumerate(read_chapter(CHAPTERS[chapter]).cells)
            if cell.cell_type == "code" and not HIDDEN & set(cell.metadata.get("tags", []))
            for line in cell.source.splitlines() if len(line) > 88]
    assert not long, f"{chapter}: lines over 88 characters:\n" + "\n".join(long)
