"""gpuinfer.compare: two recordings of a chapter side by side, glued value by glued value."""

import json

import pytest

from gpuinfer.publish import compare

GLUE = "application/papermill.record/text/plain"


def notebook(path, gpu, values):
    """A minimal executed notebook holding myst_nb glue outputs, as the record command writes."""
    outputs = [{"output_type": "display_data", "data": {GLUE: text},
                "metadata": {"scrapbook": {"name": name, "mime_prefix": GLUE[:-10]}}}
               for name, text in values.items()]
    outputs.append({"output_type": "stream", "name": "stdout", "text": "not glued\n"})
    nb = {"cells": [{"cell_type": "code", "id": "glued", "source": "", "metadata": {},
                     "outputs": outputs, "execution_count": 1}],
          "metadata": {"gpuinfer": {"gpu": gpu, "torch": "2.11.0", "date": "2026-11-29"}},
          "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb))
    return path


@pytest.mark.parametrize("text, number", [("4.18", 4.18), ("np.float64(4.18)", 4.18),
                                          ("1e-05", 1e-5), ("767", 767.0), ("nan", None),
                                          ("'H200 SXM 141GB'", None), ("None", None)])
def test_as_number(text, number):
    value = compare.as_number(text)
    assert value == number or (number is None and (value is None or value != value))


def test_compare_two_recordings(tmp_path, capsys):
    a = notebook(tmp_path / "h200.ipynb", "NVIDIA H200",
                 {"bw_tbs": "4.18", "peak": "np.float64(767.0)", "gpu_row": "'H200 SXM 141GB'"})
    b = notebook(tmp_path / "mine.ipynb", "NVIDIA A100-SXM4-80GB",
                 {"bw_tbs": "1.672", "peak": "np.float64(276.1)", "only_mine": "3"})
    assert compare.glued_values(a) == {"bw_tbs": "4.18", "peak": "np.float64(767.0)",
                                       "gpu_row": "'H200 SXM 141GB'"}
    rows = {r[0]: r for r in compare.compare(a, b)}
    assert rows["bw_tbs"] == ("bw_tbs", "4.18", "1.672", "0.40×")
    assert rows["peak"][3] == "0.36×"
    assert rows["gpu_row"] == ("gpu_row", "'H200 SXM 141GB'", "–", "")
    assert rows["only_mine"] == ("only_mine", "–", "3", "")

    assert compare.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H200" in out and "NVIDIA A100-SXM4-80GB" in out and "0.40×" in out


def test_missing_file_is_a_clear_error(tmp_path, capsys):
    assert compare.main([str(tmp_path / "nope.ipynb"), str(tmp_path / "nope.ipynb")]) == 2
    assert "no such notebook" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["{", "[]", '{"cells": [1]}', "[" * 100_000, "\udcff"])
def test_a_file_that_is_not_a_notebook_is_one_line(tmp_path, capsys, text):
    good = notebook(tmp_path / "h200.ipynb", "NVIDIA H200", {"bw_tbs": "4.18"})
    bad = tmp_path / "bad.ipynb"
    bad.write_bytes(text.encode("utf8", "surrogateescape"))
    assert compare.main([str(good), str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {bad} is not a notebook"), err


def test_glued_markdown_prints_as_its_text(tmp_path, capsys):
    """A value glued as a Markdown object (a verdict in words, shown with {glue:md}): its
    markdown source, on one line, never `<IPython.core.display.Markdown object>`."""
    def markdown(path, text):
        nb = json.loads(notebook(path, "NVIDIA H200", {"bw_tbs": "4.18"}).read_text())
        nb["cells"][0]["outputs"].insert(0, {
            "output_type": "display_data",
            "data": {GLUE: "<IPython.core.display.Markdown object>",
                     GLUE.replace("plain", "markdown"): text},
            "metadata": {"scrapbook": {"name": "verdict", "mime_prefix": GLUE[:-10]}}})
        path.write_text(json.dumps(nb))
        return path

    a = markdown(tmp_path / "h200.ipynb", "**1.8×** faster than\nthe naive loop")
    b = markdown(tmp_path / "mine.ipynb", "**1.2×** faster")
    rows = {r[0]: r for r in compare.compare(a, b)}
    assert rows["verdict"] == ("verdict", "**1.8×** faster than the naive loop",
                               "**1.2×** faster", "")
    assert compare.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "Markdown object" not in out and "**1.2×** faster" in out
