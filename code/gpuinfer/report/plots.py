"""The book's figure style, shared by every chapter, and the roofline plot.

Figures are drawn on an opaque white background, so that they stay readable in the site's
dark mode (a transparent figure would put black text on a dark page). They are sized for the
page: a 7.5-inch figure fills the text column (about 700-850 CSS pixels), so 11-point text
shows at about 13 pixels and no label is set below 8.5 points; they are rendered at 150 dpi,
sharp on high-density screens. The palette is safe for colour blindness. Every figure a
chapter shows carries alt text made from its own title, axis labels and legend (`describe`),
which the book's Sphinx extension puts on the page's <img>.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np

# Okabe-Ito: distinguishable with the common forms of colour blindness. The yellow (index 6)
# is too light for lines or text on white: use it for fills only.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442",
           "#000000"]

BOOK_STYLE = {
    "figure.figsize": (7.5, 4.5),
    "figure.dpi": 150,
    "savefig.dpi": 150,
    "figure.facecolor": "white",
    "axes.facecolor": "white",
    "savefig.facecolor": "white",
    "savefig.transparent": False,
    "axes.edgecolor": "0.2",
    "axes.grid": True,
    "grid.alpha": 0.35,
    "grid.linestyle": "-",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.prop_cycle": mpl.cycler(color=PALETTE[:6] + PALETTE[7:]),
    "lines.linewidth": 1.8,
    "lines.markersize": 5.5,
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.titleweight": "bold",
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "legend.frameon": True,
    "legend.framealpha": 0.9,
    "legend.edgecolor": "0.85",
    "figure.constrained_layout.use": True,
}
SMALL_TEXT = 8.5  # points: the smallest text on a figure (annotations next to points)


def use_book_style() -> None:
    """Apply the book's matplotlib style (call once at the top of a chapter)."""
    mpl.rcParams.update(BOOK_STYLE)
    # Inline figures as PNG: embedded in the recording, rendered the same everywhere; each
    # PNG carries its alt text (see describe) for the page.
    try:
        from IPython import get_ipython
        from IPython.core.pylabtools import print_figure
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:  # outside IPython
        return
    set_matplotlib_formats("png")
    shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["image/png"].for_type(
            mpl.figure.Figure,
            lambda fig: print_figure(fig, "png", base64=True,
                                     metadata={"Description": describe(fig)}))


def describe(fig) -> str:
    """Alt text for a figure, from what it says: titles, axis labels (with their scales) and
    legend entries: what a reader who cannot see the image needs to follow the caption.

    >>> fig, ax = plt.subplots(); _ = ax.plot([1, 2], label="copy"); _ = ax.legend()
    >>> _ = ax.set(title="Bandwidth", xlabel="size (MiB)", xscale="log", ylabel="GB/s")
    >>> describe(fig)
    'Figure: Bandwidth. x axis: size (MiB), log scale. y axis: GB/s. Legend: copy.'
    """
    parts = []
    title = fig.get_suptitle() if hasattr(fig, "get_suptitle") else ""
    if title:
        parts.append(title + ".")
    for ax in fig.axes:
        if ax.get_title():
            parts.append(ax.get_title() + ".")
        for name, label, scale in (("x", ax.get_xlabel(), ax.get_xscale()),
                                   ("y", ax.get_ylabel(), ax.get_yscale())):
            if label:
                on_scale = "" if scale == "linear" else f", {scale} scale"
                parts.append(f"{name} axis: {label}{on_scale}.")
        legend = ax.get_legend()
        if legend is not None:
            entries = [t.get_text() for t in legend.get_texts() if t.get_text()]
            if entries:
                parts.append("Legend: " + "; ".join(entries) + ".")
    return " ".join(["Figure:"] + parts) if parts else "Figure"


def plain_log_ticks(ax, axis: str = "both") -> None:
    """Label a log axis with plain numbers at 1, 2 and 5 times each power of ten ("20",
    "0.5") and nothing at the minor ticks, instead of "2×10¹" and labels that collide."""
    formatter = mpl.ticker.FuncFormatter(
        lambda value, _: f"{value:,.0f}" if value >= 1e4 else f"{value:g}")
    for which in ("x", "y") if axis == "both" else (axis,):
        target = ax.xaxis if which == "x" else ax.yaxis
        target.set_major_locator(mpl.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        target.set_major_formatter(formatter)
        target.set_minor_formatter(mpl.ticker.NullFormatter())


@dataclass(frozen=True)
class Roof:
    """A horizontal compute roof: `peak` FLOP/s; `measured` False for a datasheet value."""

    label: str
    peak: float
    measured: bool


@dataclass(frozen=True)
class Point:
    """A measured kernel: its intensity, achieved FLOP/s and attainable FLOP/s."""

    label: str
    intensity: float
    achieved: float
    attainable: float
    group: str = ""

    @property
    def fraction(self) -> float:
        return self.achieved / self.attainable


def roofline_plot(points, roofs, *, bandwidth: float,
                  bandwidth_datasheet: float | None = None, title: str = "Roofline",
                  ax=None):
    """Log-log roofline: a sloped bandwidth roof per bandwidth, a flat roof per compute peak
    (measured solid, datasheet dashed), each point labelled with its % of attainable, and
    the ridge point of the highest measured roof marked. Values in SI units; plotted in
    TFLOP/s. With two bandwidths, the lower roof is labelled below its line, the higher
    above.
    """
    ax = ax or plt.subplots(figsize=(8, 5.5))[1]
    intensities = [p.intensity for p in points]
    x_lo = min(intensities + [0.05]) / 2
    x_hi = max(intensities + [2000]) * 2
    xs = np.logspace(np.log10(x_lo), np.log10(x_hi), 400)
    top = max(r.peak for r in roofs)
    y_lo = min(p.achieved for p in points) / 3  # FLOP/s at the bottom of the axes
    bandwidths = [(bandwidth, True)]
    if bandwidth_datasheet:
        bandwidths.append((bandwidth_datasheet, False))
    # The sloped roofs run close together (a measured bandwidth is 80-90% of the
    # datasheet's), so labels on the same side would overlap. Set horizontally, a label
    # stays clear of a line rising to the right if it sits below the line and extends right,
    # or above it and extends left. The lower roof (on a tie, the measured one) is labelled
    # the first way, at the left end of its visible part; the other the second way, about a
    # third of the axes further right, so that its text fits left of where it is anchored.
    lower = min(bandwidths, key=lambda b: (b[0], not b[1]))
    x_label = max(x_lo * 1.3, 2 * y_lo / lower[0])  # twice the bottom: room for text below
    for bw, measured in bandwidths:
        ax.plot(xs, np.minimum(bw * xs, top) / 1e12, color="0.25",
                ls="-" if measured else "--", lw=1.4 if measured else 1.0)
        kind = "measured" if measured else "datasheet"
        below = len(bandwidths) > 1 and (bw, measured) == lower
        x = x_label if below else min(x_label * (x_hi / x_lo) ** 0.3, top / bw / 3)
        ax.annotate(f"{bw / 1e12:.2f} TB/s ({kind})", xy=(x, bw * x / 1e12),
                    xytext=(2, -3) if below else (-2, 3), textcoords="offset points",
                    ha="left" if below else "right", va="top" if below else "bottom",
                    fontsize=SMALL_TEXT, color="0.25")
    for i, roof in enumerate(roofs):
        color = PALETTE[i % len(PALETTE)]
        ridge = roof.peak / bandwidth
        ax.plot([ridge, x_hi], [roof.peak / 1e12] * 2, color=color,
                ls="-" if roof.measured else "--", lw=1.6 if roof.measured else 1.0)
        ax.annotate(f"{roof.label}: {roof.peak / 1e12:.3g} TFLOP/s",
                    xy=(ridge * 1.15, roof.peak / 1e12), ha="left", va="bottom",
                    fontsize=SMALL_TEXT, color=color)
    best = max((r for r in roofs if r.measured), key=lambda r: r.peak, default=None)
    if best is not None:
        ridge = best.peak / bandwidth
        ax.axvline(ridge, color="0.5", lw=0.8, ls=":")
        # At the top left of the line, above the sloped roofs: no point is plotted there.
        ax.annotate(f"ridge {ridge:.0f} FLOP/B", xy=(ridge, top * 2.4 / 1e12),
                    xytext=(-3, 0), textcoords="offset points", ha="right", va="top",
                    fontsize=SMALL_TEXT, color="0.4")
    groups = sorted({p.group for p in points})
    markers = dict(zip(groups, "osD^vP*X"))
    for p in points:
        ax.scatter(p.intensity, p.achieved / 1e12, marker=markers[p.group], s=28, zorder=3,
                   color=PALETTE[groups.index(p.group) % len(PALETTE)],
                   label=p.group if p.group else None)
    point_labels = [ax.annotate(f"{p.label} ({100 * p.fraction:.0f}%)",
                                xy=(p.intensity, p.achieved / 1e12), xytext=(4, -3),
                                textcoords="offset points", fontsize=SMALL_TEXT, va="top")
                    for p in points]
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    if unique:
        ax.legend(unique.values(), unique.keys(), loc="lower right")
    ax.set(xscale="log", yscale="log", xlim=(x_lo, x_hi),
           ylim=(y_lo / 1e12, top / 1e12 * 2.5),
           xlabel="arithmetic intensity (FLOP / byte)", ylabel="performance (TFLOP/s)",
           title=title)
    plain_log_ticks(ax)
    _separate(ax, point_labels)
    return ax


def bytes_plot(points: dict[str, tuple[float, float]], *, bandwidth: float,
               title: str = "Tokens per second against bytes per token", ax=None):
    """Batch-1 decoding as a memory-bound line: {label: (bytes per token, tokens/s)}, one
    point per variant, and the floor tokens/s = bandwidth / bytes that a step moving its
    bytes at the copy rate would reach (log-log: a line of slope -1). Each point is
    labelled with its fraction of the line (its MBU)."""
    ax = ax or plt.subplots(figsize=(7.5, 4.8))[1]
    sizes = [b for b, _ in points.values()]
    xs = np.logspace(np.log10(min(sizes) / 1.6), np.log10(max(sizes) * 1.6), 50)
    ax.plot(xs / 1e9, bandwidth / xs, color="0.25", lw=1.4,
            label=f"the copy rate, {bandwidth / 1e12:.2f} TB/s")
    labels = []
    for i, (name, (size, rate)) in enumerate(points.items()):
        ax.scatter(size / 1e9, rate, s=30, zorder=3, color=PALETTE[i % len(PALETTE)])
        labels.append(ax.annotate(f"{name} ({100 * rate * size / bandwidth:.0f} %)",
                                  xy=(size / 1e9, rate), xytext=(4, -3),
                                  textcoords="offset points", fontsize=SMALL_TEXT,
                                  va="top"))
    rates = [r for _, r in points.values()] + [bandwidth / min(sizes) * 1.6]
    ax.set(xscale="log", yscale="log", xlabel="bytes a token must move (GB)",
           ylabel="tokens / s", title=title,
           ylim=(min(rates) / 2, max(rates) * 1.3))
    plain_log_ticks(ax)
    ax.legend(loc="upper right")
    _separate(ax, labels)
    return ax


# Where a point's label may go, in points from the point: right below (the default), right
# above, left below, left above, and further below or above on the right.
_PLACES = [((4, -3), "left", "top"), ((4, 4), "left", "bottom"),
           ((-4, -3), "right", "top"), ((-4, 4), "right", "bottom"),
           ((4, -11), "left", "top"), ((4, 12), "left", "bottom")]


def _separate(ax, labels) -> None:
    """Move each point label to the first of `_PLACES` where it overlaps no label placed
    before it, so that every label stays beside its own point."""
    renderer = ax.figure.canvas.get_renderer()
    placed = []
    for label in labels:
        for place in _PLACES + _PLACES[:1]:  # nowhere free: back to the default place
            (label.xyann, ha, va) = place
            label.set_horizontalalignment(ha)
            label.set_verticalalignment(va)
            box = label.get_window_extent(renderer).expanded(1.02, 1.1)
            if not any(box.overlaps(other) for other in placed):
                break
        placed.append(label.get_window_extent(renderer))


__all__ = ["PALETTE", "BOOK_STYLE", "SMALL_TEXT", "use_book_style", "describe", "plt",
           "Roof", "Point", "roofline_plot", "plain_log_ticks", "bytes_plot"]
