"""The book's figure style, shared by every chapter, and the roofline plot.

Figures are drawn on an opaque white background so that they stay readable in the site's
dark mode, at a size that fits the page width, with a palette safe for colour blindness.
"""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt

# Okabe-Ito: distinguishable with the common forms of colour blindness.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]

BOOK_STYLE = {
    "figure.figsize": (7.5, 4.5),
    "figure.dpi": 110,
    "savefig.dpi": 110,
    "figure.facecolor": "white",
    "axes.facecolor": "white",
    "savefig.facecolor": "white",
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linestyle": "-",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.prop_cycle": mpl.cycler(color=PALETTE),
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "legend.fontsize": 9,
    "legend.frameon": False,
    "figure.constrained_layout.use": True,
}


def use_book_style() -> None:
    """Apply the book's matplotlib style (call once at the top of a chapter)."""
    mpl.rcParams.update(BOOK_STYLE)
    # Inline figures as PNG: embedded in the recording, rendered the same everywhere.
    try:
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("png")
    except ImportError:  # outside IPython
        pass


__all__ = ["PALETTE", "BOOK_STYLE", "use_book_style", "plt"]
