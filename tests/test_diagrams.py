"""The primitives of the chapters' diagrams (gpuinfer.report.diagrams): a canvas in its own
units without axes, and a PNG that carries its alt text to the page's <img>, which the
site's extension reads back (gpuinfer.publish.sphinx_figures.png_description). The chapters'
own diagrams are drawn by every build of the book (tests/test_build.py) and counted on its
pages (tests/test_reading.py)."""

import pytest

pytest.importorskip("IPython")

from gpuinfer.report import diagrams as dg  # noqa: E402


def test_a_canvas_is_measured_in_its_own_units_without_axes():
    fig, ax = dg.canvas(10, 4)
    assert ax.get_xlim() == (0, 10) and ax.get_ylim() == (0, 4) and not ax.axison
    width, height = fig.get_size_inches()
    assert width == pytest.approx(7.5) and height == pytest.approx(3.0)  # 10 : 4
    dg.plt.close(fig)


def test_a_diagram_carries_its_alt_text_to_the_page(tmp_path):
    from gpuinfer.publish.sphinx_figures import png_description

    fig, ax = dg.canvas(6, 2)
    dg.box(ax, 0.5, 0.5, 2, 1, "weights", color=dg.BLUE)
    dg.cells(ax, 3, 0.5, 1, 1, 2, 4, fills={(0, 0): dg.ORANGE})
    dg.arrow(ax, (2.5, 1), (3, 1), "read once")
    dg.lane(ax, 1.7, 0.2, "GPU", 0.5, 5.5)
    dg.span(ax, 1.7, 0.2, 1, 2, "k", color=dg.GREEN)
    dg.bracket(ax, 1, 2, 1.6, "2 µs", below=True)
    alt = "A box of weights read once into a grid of tiles."
    png = dg.image(fig, alt)
    assert png.data[:8] == b"\x89PNG\r\n\x1a\n"
    path = tmp_path / "diagram.png"
    path.write_bytes(png.data)
    assert png_description(path) == alt
    assert not dg.plt.fignum_exists(fig.number), "image() closes the figure"
