"""Chapter 7's pictures: a decoder layer split over two GPUs, and the split step in time.

- `layer_split`: one layer's matrices as each GPU holds them. The matrices that read the
  layer's input (q, k, v; gate, up) are split by columns, so each GPU computes its own
  heads and its own MLP features alone; the matrices that follow (o, down) are split by
  rows, so each GPU gets a partial sum of the whole hidden vector, and an all-reduce adds
  the partial sums. Drawn as y = x·W: a row of W is an input feature, a column an output.
- `step_timeline`: one batch-1 decode step on one GPU against the same step split over N,
  to scale, from measured times: each GPU reads 1/N of every matrix, then waits for two
  all-reduces a layer and one all-gather of the logits.
"""

from __future__ import annotations

from gpuinfer.report.diagrams import (AMBER, BLUE, GREEN, ORANGE, PINK, SMALL_TEXT, TEXT,
                                      arrow, box, bracket, canvas, cells, label,
                                      lane, span)

# The two GPUs' colours, as in every picture of the chapter.
GPU_COLORS = (BLUE, ORANGE)
SMALL = SMALL_TEXT + 0.5  # points: the notes under the lanes


def _matrix(ax, x: float, y: float, w: float, h: float, rank: int, by: str) -> None:
    """A 4 × 4 grid for a matrix, the half that GPU `rank` holds filled in its colour:
    columns 2·rank and 2·rank + 1 when split `by` columns, rows when split by rows."""
    own = range(2 * rank, 2 * rank + 2)
    fills = {(r, c): GPU_COLORS[rank] for r in range(4) for c in range(4)
             if (c if by == "columns" else r) in own}
    cells(ax, x, y, w, h, 4, 4, color="0.35", fills=fills, alpha=0.55)


def _sum(ax, x: float, w: float, y0: float, y1: float, text: str) -> None:
    """An all-reduce: one box across both lanes, since it joins the GPUs."""
    box(ax, x, y0, w, y1 - y0, color=AMBER, alpha=0.3)
    label(ax, x + w / 2, y1 - 0.8, "Σ", ha="center", size=TEXT + 6, weight="bold")
    # its name, the message and its measured time, written along the box: there is no
    # room across
    ax.text(x + w / 2, y0 + 0.35 * (y1 - y0), "\n".join(filter(None, ("all-reduce", text))),
            rotation=90, ha="center", va="center", fontsize=SMALL_TEXT, color="0.1")


def layer_split(message: str = "") -> object:
    """One decoder layer split over two GPUs (a figure). `message` (e.g. "4 kB, 12 µs":
    the hidden vector's bytes and the measured all-reduce) is written on the all-reduces."""
    fig, ax = canvas(15, 7.0)
    lanes = {0: 4.6, 1: 1.9}  # the lower edge of each GPU's row of matrices
    h = 1.5  # a matrix's height
    mid = {rank: y + h / 2 for rank, y in lanes.items()}
    # (left edge, width, what, how it is split) of each stage, left to right
    stages = [(1.95, 1.3, "q, k, v", "columns"), (3.7, 1.3, "attention", None),
              (5.45, 1.3, "o", "rows"), (7.2, 0.7, "all-reduce", "sum"),
              (8.35, 1.3, "gate, up", "columns"), (10.1, 1.3, "SiLU(gate)·up", None),
              (11.85, 1.3, "down", "rows"), (13.6, 0.7, "all-reduce", "sum")]
    notes = {"q, k, v": "by columns\n(heads)", "attention": "with its own\nKV cache",
             "o": "by rows", "gate, up": "by columns",
             "SiLU(gate)·up": "own\nfeatures", "down": "by rows"}
    for x, w, what, by in stages:
        if by == "sum":  # named below, not above: its box is narrow
            _sum(ax, x, w, lanes[1], lanes[0] + h, message)
            label(ax, x + w / 2, 1.25, "sum of\npartials", ha="center", size=SMALL,
                  color="0.3")
            continue
        label(ax, x + w / 2, 6.55, what, ha="center", weight="bold",
              size=TEXT if len(what) < 10 else SMALL)
        label(ax, x + w / 2, 1.25, notes[what], ha="center", size=SMALL, color="0.3")
        for rank, y in lanes.items():
            if by is None:  # work on this GPU's own heads or features only
                box(ax, x, y + 0.25, w, h - 0.5, "own\nheads" if what == "attention"
                    else "own\nfeatures", color=GPU_COLORS[rank], alpha=0.25, size=SMALL)
            else:
                _matrix(ax, x, y, w, h, rank, by)
    # what moves: along each GPU's row, from one stage to the next
    for rank, y in mid.items():
        label(ax, 0.05, y, f"GPU {rank}", weight="bold", color=GPU_COLORS[rank])
        label(ax, 1.3, y + 0.28, "x", ha="center", style="italic")
        arrow(ax, (1.15, y), (1.95, y))
        for (x0, w0, *_), (x1, *_) in zip(stages, stages[1:]):
            arrow(ax, (x0 + w0, y), (x1, y))
        arrow(ax, (14.3, y), (14.95, y))
    # between the rows: where the GPUs work alone
    for x0, x1 in ((1.95, 6.75), (8.35, 13.15)):
        label(ax, (x0 + x1) / 2, 4.0, "each GPU alone: no communication", ha="center",
              size=SMALL, color="0.35", style="italic")
    label(ax, 7.5, 0.35, "After the last layer: the output projection split by vocabulary "
          "columns, then an all-gather of the logits.", ha="center", size=SMALL,
          color="0.3")
    return fig


def step_timeline(t1_us: float, layers: int, shares: tuple[float, float, float],
                  allreduce_us: float, allgather_us: float, *, n: int = 2,
                  measured_us: float | None = None) -> object:
    """One decode step on one GPU against the step split over `n`, to scale (a figure).

    `t1_us` is the unsplit step's measured time, `shares` the fractions of its bytes in
    the attention matrices, the MLP matrices and the output projection (their sum 1);
    the split step reads 1/n of each and waits for two all-reduces a layer and one
    all-gather at their measured times, as the chapter's prediction does. `measured_us`,
    the split step's measured time, is marked beside the prediction."""
    attention, mlp, head = (s * t1_us for s in shares)
    waits = 2 * layers * allreduce_us + allgather_us
    predicted = t1_us / n + waits
    end = max(t1_us, predicted, measured_us or 0)
    fig, ax = canvas(15, 4.6)
    x0, width = 2.6, 12.2

    def at(t_us: float) -> float:
        return x0 + width * t_us / end

    def bar(y: float, t: float, d: float, color: str, hatch: str | None = None) -> float:
        span(ax, y, 0.6, at(t), at(t + d), color=color, alpha=0.45, hatch=hatch)
        return t + d

    one, split = 2.55, 0.85  # the lanes' lower edges
    lane(ax, one, 0.6, "1 GPU", x0, at(end))
    lane(ax, split, 0.6, f"{n} GPUs", x0, at(end))
    t = s = 0.0
    for _ in range(layers):
        t = bar(one, bar(one, t, attention / layers, BLUE), mlp / layers, GREEN)
        # the split step: the same reads, 1/n as long, each followed by an all-reduce
        s = bar(split, bar(split, s, attention / layers / n, BLUE), allreduce_us, AMBER,
                "////")
        s = bar(split, bar(split, s, mlp / layers / n, GREEN), allreduce_us, AMBER,
                "////")
    bar(one, t, head, PINK)
    bar(split, bar(split, s, head / n, PINK), allgather_us, AMBER, "////")
    # the brackets' text starts where time does: a short bracket cannot hold it centred
    bracket(ax, at(0), at(t1_us), one + 0.75, "")
    label(ax, x0, one + 1.0, f"one GPU, measured: {t1_us:,.0f} µs", size=SMALL)
    bracket(ax, at(0), at(predicted), split - 0.12, "", below=True)
    label(ax, x0, split - 0.4, f"split over {n}, predicted: {predicted:,.0f} µs, of which "
          f"the collectives {waits:,.0f} µs", size=SMALL)
    if measured_us is not None:
        ax.plot([at(measured_us)] * 2, [split - 0.05, split + 0.95], color="0.1", lw=1.4,
                ls="--")
        label(ax, at(measured_us), split + 1.15, f"measured: {measured_us:,.0f} µs",
              ha="right" if measured_us > 0.6 * end else "left", size=SMALL)
    # the legend, on one line at the top
    x = x0
    for text, color, hatch in (("attention matrices", BLUE, None),
                               ("MLP matrices", GREEN, None),
                               ("output projection", PINK, None),
                               ("all-reduce, all-gather", AMBER, "////")):
        box(ax, x, 4.05, 0.35, 0.3, color=color, alpha=0.45, rounded=False, hatch=hatch)
        label(ax, x + 0.45, 4.2, text, size=SMALL)
        x += 0.45 + 0.105 * len(text) + 0.6
    return fig
