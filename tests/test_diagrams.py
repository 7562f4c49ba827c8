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


@pytest.mark.parametrize("bare, kernel, traced", [
    # an H100-like run: the host faster than the kernel, the kernels queue
    (15.7, 46.1, dict(host=41.3, kernel=45.2, queued=85.9, event=48.6)),
    # an H200-like run: the host slower than the kernel, the GPU idles between kernels
    (19.3, 34.0, dict(host=51.8, kernel=33.0, queued=8.4, event=50.4)),
    # even the bare call slower than the kernel
    (20.0, 17.0, dict(host=51.8, kernel=17.0, queued=8.4, event=52.0)),
])
def test_the_handover_diagram_draws_the_regime_its_numbers_give(bare, kernel, traced):
    from matplotlib.patches import FancyBboxPatch

    from gpuinfer.report.diagrams.roofline import eager_handover

    ax = eager_handover(bare, kernel, traced).axes[0]
    texts = [t.get_text() for t in ax.texts]
    for panel, host, k in [("(a)", bare, kernel), ("(b)", traced["host"], traced["kernel"])]:
        title = next(t for t in texts if t.startswith(panel))
        than = "less than" if host < k else "more than"
        assert f"{host:.1f} µs" in title and f"{than} the kernel's {k:.1f} µs" in title
    # the host runs ahead in each panel whose host is faster than its kernel
    assert texts.count("the host runs ahead") == (bare < kernel) + (traced["host"] < kernel)
    bars = [p for p in ax.patches if isinstance(p, FancyBboxPatch)]
    lanes: dict[float, list[tuple[float, float]]] = {}
    for bar in bars:
        assert bar.get_width() >= 0, "a bar of negative length"
        lanes.setdefault(round(bar.get_y(), 3), []).append(
            (bar.get_x(), bar.get_x() + bar.get_width()))
    for spans in lanes.values():  # no two bars of a lane overlap: kernel 2 after kernel 1
        spans.sort()
        assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans
    # the GPU idles in a panel only where its host is the slower
    idle = {round(bar.get_y(), 3) for bar in bars if bar.get_hatch()}
    assert idle == {y for y, slower in [(3.95, bare > kernel),
                                        (1.0, traced["host"] > traced["kernel"])] if slower}
    dg.plt.close("all")
