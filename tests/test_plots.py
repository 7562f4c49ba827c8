"""The book's figure style: readable sizes, and alt text carried by every inline PNG."""

import base64
import io

import matplotlib

matplotlib.use("Agg")

from PIL import Image  # noqa: E402

from gpuinfer.report import plots  # noqa: E402
from gpuinfer.report.plots import Point, Roof, describe, plt, roofline_plot  # noqa: E402


def test_describe_reads_titles_labels_scales_and_legend():
    fig, (a, b) = plt.subplots(1, 2)
    a.plot([1, 2], [3, 4], label="measured")
    a.plot([1, 2], [3, 3], label="floor")
    a.legend()
    a.set(title="Decode time", xlabel="batch", ylabel="time (ms)", yscale="log")
    b.set(xlabel="step")
    fig.suptitle("Two panels")
    assert describe(fig) == ("Figure: Two panels. Decode time. x axis: batch. y axis: time (ms), "
                             "log scale. Legend: measured; floor. x axis: step.")
    plt.close(fig)
    empty, _ = plt.subplots()
    assert describe(empty) == "Figure"
    plt.close(empty)


def test_inline_png_carries_its_alt_text():
    """use_book_style makes IPython's PNG of a figure carry describe(fig) as 'Description',
    which the site's Sphinx extension turns into the <img> alt text."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    plots.use_book_style()
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3])
    ax.set(title="Copy bandwidth", xlabel="size (MiB)", ylabel="GB/s")
    data, _ = shell.display_formatter.format(fig)
    png = Image.open(io.BytesIO(base64.b64decode(data["image/png"])))
    assert png.text["Description"] == describe(fig)
    # A figure of the default size at the book's dpi: sharp on dense screens.
    assert png.size[0] >= 7 * plots.BOOK_STYLE["figure.dpi"]
    plt.close(fig)


def test_no_text_below_the_smallest_size():
    plots.use_book_style()
    points = [Point("a", 0.25, 1e12, 1e12, "elementwise"), Point("b", 500, 5e14, 7e14, "matmul")]
    roofs = [Roof("BF16 measured", 7e14, True), Roof("BF16 datasheet", 9.9e14, False)]
    ax = roofline_plot(points, roofs, bandwidth=4e12, bandwidth_datasheet=4.8e12)
    sizes = [t.get_fontsize() for t in ax.texts + ax.get_xticklabels() + ax.get_yticklabels()]
    assert min(sizes) >= plots.SMALL_TEXT
    # Opaque: readable on the site's dark background.
    assert matplotlib.colors.to_rgba(ax.figure.get_facecolor())[3] == 1
    plt.close(ax.figure)


def test_bandwidth_labels_do_not_overlap():
    """The measured and the datasheet bandwidth roofs run close together: their labels sit
    on opposite sides of the lines, apart from each other and inside the axes."""
    plots.use_book_style()
    points = [Point("x + y", 1 / 12, 0.37e12, 0.35e12, "elementwise"),
              Point("M=1", 1, 4e12, 4.2e12, "gemv"), Point("8192³", 2730, 7.7e14, 8e14, "mm")]
    roofs = [Roof("BF16 measured", 8e14, True), Roof("BF16 datasheet", 9.89e14, False)]
    for fig_size in [(8.5, 6), None]:
        fig, ax = plt.subplots(figsize=fig_size)
        roofline_plot(points, roofs, bandwidth=4.19e12, bandwidth_datasheet=4.8e12, ax=ax)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        labels = [t for t in ax.texts if "TB/s" in t.get_text()]
        assert [t.get_text() for t in labels] == ["4.19 TB/s (measured)", "4.80 TB/s (datasheet)"]
        boxes = [t.get_window_extent(renderer) for t in labels]
        assert not boxes[0].overlaps(boxes[1])
        inside = ax.get_window_extent(renderer)
        assert all(inside.contains(b.x0, b.y0) and inside.contains(b.x1, b.y1) for b in boxes)
        plt.close(fig)


def test_bytes_plot_labels_each_point_with_its_fraction_of_the_line():
    ax = plots.bytes_plot({"bf16": (2.5e9, 1000.0), "int8": (1.25e9, 1600.0)},
                          bandwidth=4e12)
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["bf16 (62 %)", "int8 (50 %)"]  # 1000 x 2.5 GB = 2.5 TB/s of 4
    line = ax.lines[0]
    x, y = line.get_xdata(), line.get_ydata()
    assert abs(x[0] * 1e9 * y[0] - 4e12) < 1e3  # tokens/s x bytes = the bandwidth
    assert ax.get_xscale() == "log" and "copy rate" in ax.get_legend().get_texts()[0].get_text()
    plt.close(ax.figure)


def test_plain_log_ticks_never_print_exponents():
    fig, ax = plt.subplots()
    ax.plot([0.05, 2e6], [1, 2])
    ax.set_xscale("log")
    plots.plain_log_ticks(ax, "x")
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert "0.1" in labels and "1,000,000" in labels and "20" in labels
    assert not any("e" in label or "×" in label for label in labels)
    plt.close(fig)
