"""Every chapter of the book has a fresh GPU recording in book/_recorded/.

Fails, naming the chapter and the command that re-records it, when a recording is missing,
stale (the chapter's code cells or the gpuinfer modules it imports changed since), corrupt,
or a CPU smoke recording. Recording needs the GPU: see README.md, "Recording on a GPU".
"""

from pathlib import Path

import pytest

from gpuinfer.publish import record, recordings

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = list(recordings.chapters(ROOT))


def test_the_toc_has_chapters():
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
