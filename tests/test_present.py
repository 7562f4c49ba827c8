"""A chapter's page made from its recording (gpuinfer.publish.present): the recorded outputs
of the measurement cells beside the presentation cells run now from the kept values; what a
presentation cell may not do; and `python -m gpuinfer.publish.glued`."""

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from gpuinfer.publish import book, glued, record, recordings
from gpuinfer.publish.kept import DATA_FILE
from gpuinfer.publish.present import PresentationError, page

FIXTURE = Path(__file__).parent / "fixtures" / "book"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = Path(shutil.copytree(FIXTURE, tmp_path_factory.mktemp("present") / "book",
                                ignore=shutil.ignore_patterns("_build", "_recorded")))
    assert record.main(["--root", str(root), "--allow-cpu", "ch_a"]) == 0
    return root


@pytest.fixture
def root(recorded, tmp_path):
    return Path(shutil.copytree(recorded, tmp_path / "book"))


def edit(root: Path, old: str, new: str) -> None:
    path = root / "book" / "ch_a.md"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def made(root: Path):
    path = root / "book" / "ch_a.md"
    recorded = nbformat.read(book.recording_path(path), as_version=4)
    return page(book.read_chapter(path), recorded, book.artifacts_path(path) / DATA_FILE,
                path.parent, "ch_a")


def outputs(nb) -> list[str]:
    return [json.dumps(c.get("outputs", [])) for c in nb.cells if c.cell_type == "code"]


def test_the_page_has_recorded_and_presented_outputs(root):
    nb = made(root)
    shown = outputs(nb)
    assert "answer 45" in shown[2]  # measurement cell 3, as recorded
    assert "image/png" in shown[3]  # presentation cell 4: the figure, drawn now
    assert glued.values(nb)["answer"] == 45  # presentation cell 5's glue
    recorded_nb = json.loads(book.recording_path(root / "book" / "ch_a.md").read_text())
    assert "image/png" not in json.dumps(recorded_nb), "the recording holds no figure"


def test_a_presentation_edit_keeps_the_recording_and_shows_at_once(root):
    edit(root, 'ylabel="y (units)"', 'ylabel="y squared (units)"')
    edit(root, 'glue("answer", answer, display=False)',
         'glue("answer", answer, display=False)\nglue("double", 2 * answer, display=False)')
    assert recordings.status(root, "ch_a", accept_cpu=True).fresh
    assert glued.values(made(root))["double"] == 90


@pytest.mark.parametrize("where", ["first", "between measurements", "last"])
def test_a_presentation_cell_added_anywhere_keeps_the_recording(root, where):
    """Code cells are numbered together, so a presentation cell added before measurement
    cell 3 makes it cell 4; the values kept after it are still found, and restored where
    the presentation cells after it read them."""
    diagram = ("```{code-cell} ipython3\n:tags: [presentation, remove-input, diagram]\n"
               "from myst_nb import glue\n\nglue('sketch', 'a mechanism', display=False)\n"
               "```\n\n")
    anchor = {"first": "```{code-cell} ipython3\nimport json",
              "between measurements": "```{code-cell} ipython3\nxs = [1, 2, 3]",
              "last": "The answer is"}[where]
    edit(root, anchor, diagram + anchor)
    st = recordings.status(root, "ch_a", accept_cpu=True)
    assert st.fresh, st.message
    values = glued.values(made(root))
    assert values["answer"] == 45 and values["sketch"] == "a mechanism"


def test_a_comment_in_a_measurement_cell_keeps_it_and_the_page_shows_the_edited_cell(root):
    edit(root, "answer = sum(range(10))", "# the sum of 0..9\nanswer = sum(range(10))")
    assert recordings.status(root, "ch_a", accept_cpu=True).fresh
    nb = made(root)
    cell = [c for c in nb.cells if c.cell_type == "code"][2]
    assert cell.source.startswith("xs = [1, 2, 3]") and "# the sum of 0..9" in cell.source
    assert "answer 45" in json.dumps(cell.outputs)
    edit(root, "answer = sum(range(10))", "answer = sum(range(11))")
    st = recordings.status(root, "ch_a", accept_cpu=True)
    assert st.state == "stale" and "its measurement cell 3 changed" in st.reason


def test_a_presentation_cell_reading_what_was_not_kept_makes_it_stale(root):
    edit(root, "ax.plot(xs, ys, marker=\"o\")", "ax.plot(xs, [x ** 3 for x in xs])\n"
         "print(answer)")  # answer was kept after cell 3 anyway: still fresh
    assert recordings.status(root, "ch_a", accept_cpu=True).fresh
    edit(root, "print(answer)", "print(ys, json)")  # json: imported, never kept
    st = recordings.status(root, "ch_a", accept_cpu=True)
    assert st.state == "stale" and "\n" not in st.message
    assert "presentation cell 4 reads json, which the recording did not keep after " \
           "measurement cell 3 (book/_recorded/ch_a/data.json)" in st.message


def test_a_failing_presentation_cell_is_one_line_naming_it(root):
    edit(root, "ax.plot(xs, ys, marker=\"o\")", "ax.plot(xs, ys[:2])")
    with pytest.raises(PresentationError) as caught:
        made(root)
    said = str(caught.value)
    assert said.startswith("chapter ch_a: presentation cell 4 failed: ValueError") and \
        "\n" not in said


def test_a_presentation_cell_that_reaches_the_gpu_is_refused(root):
    edit(root, "ax.plot(xs, ys, marker=\"o\")",
         "import torch\ntorch.zeros(1, device='cu' + 'da')")  # past the static check
    with pytest.raises(PresentationError, match="presentation cell 4 failed: .*cannot touch "
                                                "the GPU"):
        made(root)
    edit(root, "torch.zeros(1, device='cu' + 'da')", "torch.cuda.is_available()")
    with pytest.raises(PresentationError, match="presentation cell 4 uses "
                                                "torch.cuda.is_available"):
        made(root)


def test_glued_prints_the_pages_values_as_json(recorded, capsys, monkeypatch):
    monkeypatch.chdir(recorded)
    assert glued.main(["ch_a"]) == 0
    values = json.loads(capsys.readouterr().out)
    assert values["answer"] == 45 and "decode_results" in values
    assert glued.main(["ch_b"]) == 2  # not recorded here
    err = capsys.readouterr().err
    assert err.startswith("error: chapter ch_b has no valid GPU recording") and \
        err.count("\n") == 1


def test_every_page_glues_its_recordings_peak_gpu_memory(root):
    """peak_gpu_gib, a plain float: the recording's peak GPU memory; NaN where the chapter
    was not recorded on a GPU (this CPU smoke recording). Its output rides on an existing
    cell, so the page's code cells (myst-nb's cache key) are the chapter's."""
    import math

    from gpuinfer.publish.present import PEAK_NAME
    from gpuinfer.publish.validation import METADATA_KEY

    path = root / "book" / "ch_a.md"
    nb = made(root)
    assert PEAK_NAME == "peak_gpu_gib" and math.isnan(glued.values(nb)[PEAK_NAME])
    assert [c.source for c in nb.cells] == [c.source for c in book.read_chapter(path).cells]
    recorded_nb = nbformat.read(book.recording_path(path), as_version=4)
    recorded_nb.metadata[METADATA_KEY].update(smoke=False, peak_gpu_memory_gib=18.31)
    nb = page(book.read_chapter(path), recorded_nb, book.artifacts_path(path) / DATA_FILE,
              path.parent, "ch_a")
    assert glued.values(nb)[PEAK_NAME] == 18.31
    recorded_nb.metadata[METADATA_KEY]["peak_gpu_memory_gib"] = None  # no nvidia-smi
    nb = page(book.read_chapter(path), recorded_nb, book.artifacts_path(path) / DATA_FILE,
              path.parent, "ch_a")
    assert math.isnan(glued.values(nb)[PEAK_NAME])


def test_a_recording_presented_on_its_own_glues_its_peak(root):
    """present() on a recording itself (as gpuinfer.publish.compare runs it) reads the
    peak from the recording's own provenance; on the chapter alone it glues NaN."""
    import math

    from gpuinfer.publish.present import PEAK_NAME, present
    from gpuinfer.publish.validation import METADATA_KEY

    path = root / "book" / "ch_a.md"
    nb = nbformat.read(book.recording_path(path), as_version=4)
    nb.metadata[METADATA_KEY].update(smoke=False, peak_gpu_memory_gib=7.5)
    present(nb, book.artifacts_path(path) / DATA_FILE, path.parent, "ch_a")
    assert glued.values(nb)[PEAK_NAME] == 7.5
    nb = book.read_chapter(path)  # the chapter, no provenance: a smoke run (test_chapters)
    present(nb, book.artifacts_path(path) / DATA_FILE, path.parent, "ch_a")
    assert math.isnan(glued.values(nb)[PEAK_NAME])


def test_glued_lists_the_peak(recorded, capsys, monkeypatch):
    import math

    monkeypatch.chdir(recorded)
    assert glued.main(["ch_a"]) == 0
    values = json.loads(capsys.readouterr().out)
    assert math.isnan(values["peak_gpu_gib"])  # a CPU recording: NaN, printed as NaN
