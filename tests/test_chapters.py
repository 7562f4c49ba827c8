"""Every chapter runs end to end on the CPU in smoke mode, with its self-checks passing.

The chapters' `assert`s are their self-checks, so a successful execution *is* the test. In
smoke mode a chapter must say so visibly: its outputs are not GPU results.
"""

import shutil
from pathlib import Path

import pytest

from conftest import book_chapters
from gpuinfer.publish.book import chapters, drafts, read_chapter

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).parent / "fixtures" / "book"  # two tiny chapters, ch_a and ch_b
# A draft, out of the TOC, is tested too. (An unreadable book: test_recordings says why.)
CHAPTERS, _ = book_chapters(ROOT, with_drafts=True)


def execute_smoke(path: Path, tmp_path: Path, monkeypatch):
    import nbclient

    monkeypatch.setenv("GPUINFER_ARTIFACTS", str(tmp_path / "artifacts"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # smoke mode even on a GPU machine
    nb = read_chapter(path)  # as the record command reads it
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=600,
                                     resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as err:
        pytest.fail(f"{path.name} failed in smoke mode:\n{err}", pytrace=False)
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


HIDDEN = {"remove-input", "remove-cell", "hide-input"}  # cells whose code the page hides


@pytest.mark.parametrize("chapter", list(CHAPTERS))
def test_shown_code_fits_the_column(chapter):
    """The page's code column is 88 characters: a longer line scrolls sideways."""
    long = [f"cell {i}: {line}" for i, cell in enumerate(read_chapter(CHAPTERS[chapter]).cells)
            if cell.cell_type == "code" and not HIDDEN & set(cell.metadata.get("tags", []))
            for line in cell.source.splitlines() if len(line) > 88]
    assert not long, f"{chapter}: lines over 88 characters:\n" + "\n".join(long)
