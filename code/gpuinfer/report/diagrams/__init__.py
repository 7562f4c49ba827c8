"""Pictures of mechanisms: the primitives every chapter's diagrams are drawn with.

A diagram is a schematic, not a plot of data: boxes for buffers and kernels, arrows for
what moves, lanes for a timeline. It is drawn in the book's style (gpuinfer.report.plots:
the palette, the fonts, a white background that survives dark mode) on a canvas measured
in its own units, with no axes, and shown by `show`, which stores its alt text in the PNG
for the page's <img> (gpuinfer.publish.sphinx_figures). A chapter draws one in a presentation
cell and either shows it there (the cell tagged `diagram`) or glues it (`image`) into a
`{glue:figure}` of class `diagram`, with a caption; the site's reading tests count both.

The modules beside this one hold each chapter's diagrams, one function a picture.
"""

from __future__ import annotations

import io

from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

from gpuinfer.report.plots import PALETTE, SMALL_TEXT, plt, use_book_style

BLUE, ORANGE, GREEN, PINK, AMBER, SKY, YELLOW, BLACK = PALETTE
GREY = "0.55"
LIGHT = "0.93"  # the fill of a neutral box
TEXT = 10  # points: a label inside a box


def canvas(width: float, height: float, inches: float = 7.5):
    """(fig, ax): an empty drawing area `width` × `height` units, `inches` wide, no axes;
    (0, 0) is the lower left corner."""
    use_book_style()
    fig = plt.figure(figsize=(inches, inches * height / width))
    fig.set_layout_engine("none")  # the book's style lays out axes; a canvas has none
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_axis_off()
    return fig, ax


def box(ax, x: float, y: float, w: float, h: float, text: str = "", *,
        color: str = GREY, fill: str | None = None, alpha: float = 0.22,
        size: float = TEXT, weight: str = "normal", rounded: bool = True,
        text_color: str = "0.1", hatch: str | None = None):
    """A box with its lower left corner at (x, y), its edge in `color` and filled with
    `fill` (default: `color` at `alpha`), `text` centred in it."""
    style = "round,pad=0,rounding_size=0.08" if rounded else "square,pad=0"
    patch = FancyBboxPatch((x, y), w, h, boxstyle=style, linewidth=1.2, edgecolor=color,
                           facecolor=fill or (*_rgb(color), alpha), hatch=hatch)
    ax.add_patch(patch)
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size,
                weight=weight, color=text_color)
    return patch


def cells(ax, x: float, y: float, w: float, h: float, rows: int, cols: int, *,
          color: str = GREY, fills: dict[tuple[int, int], str] | None = None,
          alpha: float = 0.3) -> None:
    """A grid of rows × cols cells filling the box (x, y, w, h), the first row at the top;
    `fills` colours single cells ({(row, col): colour})."""
    dw, dh = w / cols, h / rows
    for r in range(rows):
        for c in range(cols):
            fill = (fills or {}).get((r, c))
            ax.add_patch(Rectangle((x + c * dw, y + h - (r + 1) * dh), dw, dh,
                                   linewidth=0.6, edgecolor=color,
                                   facecolor=(*_rgb(fill), alpha) if fill else "white"))


def arrow(ax, start: tuple[float, float], end: tuple[float, float], text: str = "", *,
          color: str = "0.25", size: float = SMALL_TEXT + 0.5, curve: float = 0.0,
          style: str = "-|>", offset: tuple[float, float] = (0, 0.12),
          linestyle: str = "-") -> None:
    """An arrow from `start` to `end` (bent by `curve`), `text` beside its middle."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12,
                                 color=color, linewidth=1.2, linestyle=linestyle,
                                 connectionstyle=f"arc3,rad={curve}"))
    if text:
        mx, my = (start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1]
        ax.text(mx, my, text, ha="center", va="bottom", fontsize=size, color=color)


def label(ax, x: float, y: float, text: str, *, size: float = TEXT, ha: str = "left",
          va: str = "center", color: str = "0.1", weight: str = "normal",
          style: str = "normal") -> None:
    """Text at (x, y)."""
    ax.text(x, y, text, ha=ha, va=va, fontsize=size, color=color, weight=weight,
            style=style)


def lane(ax, y: float, h: float, name: str, x0: float, x1: float, *,
         size: float = TEXT) -> None:
    """A timeline lane from x0 to x1 at height y (h high), named at its left in bold type
    of `size` points."""
    ax.plot([x0, x1], [y, y], color="0.75", linewidth=0.8)
    label(ax, x0 - 0.1, y + h / 2, name, ha="right", weight="bold", size=size)


def span(ax, y: float, h: float, t0: float, t1: float, text: str = "", *,
         color: str = BLUE, alpha: float = 0.3, size: float = SMALL_TEXT + 0.5,
         hatch: str | None = None) -> None:
    """Work on a lane: a bar from t0 to t1, `text` inside it."""
    box(ax, t0, y, t1 - t0, h, text, color=color, alpha=alpha, size=size, rounded=False,
        hatch=hatch)


def bracket(ax, x0: float, x1: float, y: float, text: str, *, below: bool = False,
            color: str = "0.25", size: float = SMALL_TEXT + 0.5) -> None:
    """A measure from x0 to x1 at height y, `text` above it (or below)."""
    tick = -0.08 if below else 0.08
    ax.plot([x0, x0, x1, x1], [y + tick, y, y, y + tick], color=color, linewidth=1)
    ax.text((x0 + x1) / 2, y - 0.06 if below else y + 0.06, text, ha="center",
            va="top" if below else "bottom", fontsize=size, color=color)


def image(fig, alt: str):
    """`fig` as an IPython Image, a PNG that carries `alt` (the page's alt text: a sentence
    or two saying what the picture shows), the figure closed. Glue it
    (`glue(name, image(fig, alt), display=False)`) to place it with a caption by
    `{glue:figure}` and `:figclass: diagram`, or display it."""
    from IPython.display import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Description": alt})
    plt.close(fig)
    return Image(data=buf.getvalue(), format="png")


def show(fig, alt: str) -> None:
    """Display `fig` where the cell is, as `image` makes it."""
    from IPython.display import display

    display(image(fig, alt))


def _rgb(color: str) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    return to_rgb(color)
