"""Chapter 5's diagrams: the mechanisms of a decode step written in Triton.

- `gemv_tiling`: how a batch-1 matrix-vector product is cut into programs (a block of
  rows each, streamed tile by tile) and how split-K cuts each block's reduction into S
  programs whose partial sums the last of them adds up;
- `int8_widening`: what weight-only int8 stores (a byte a weight, one scale a row) and
  how the kernel turns a byte into a float without a conversion instruction, multiplies,
  accumulates, and applies the row's scale once, each step with the rate its
  instructions issue at on Hopper;
- `step_kernels`: the kernels of one Triton decode step, what each has fused, and where
  each reads weights.

Each function takes the numbers it shows (the matrix's shape, the GPU's multiprocessors)
as arguments, so that the picture says what this recording's GPU and model are.

The page shows a 7.5-inch picture at about 0.6 of its drawn size, so no text here is
smaller than 11 points as drawn.
"""

from __future__ import annotations

import math

from gpuinfer.report.diagrams import (BLUE, GREEN, GREY, ORANGE, PINK, SKY, arrow, box,
                                      bracket, canvas, cells, label)

SMALL = 11  # points: the smallest text these pictures use (about 9 px on the page)
TITLE = 12  # points: a panel's bold title


def gemv_tiling(rows: int, cols: int, block_n: int, sms: int, split: int,
                tiles: int = 1):
    """(a) y = W x with one program per block of `block_n` rows of W (`rows` × `cols`),
    each streaming its rows in `tiles` tiles, the first loaded before the wait for the
    previous kernel; (b) split-K: each block's columns cut into `split` ranges, one
    program each, writing FP32 partial sums that the last program to finish adds up.
    `sms`: the GPU's multiprocessors, against which the programs are counted."""
    fig, ax = canvas(15, 9.4)
    programs = math.ceil(rows / block_n)
    # the partials' traffic against the matrix's: written once, read back once, FP32
    partial_pct = 100 * (2 * 4 * split * rows) / (2 * rows * cols)

    # --- (a): one program per block of rows -----------------------------------------
    label(ax, 0.15, 9.05, "(a) One program per block of rows", weight="bold", size=TITLE)
    wx, wy, ww, wh = 2.35, 2.9, 3.3, 4.4  # W
    box(ax, wx, wy + wh + 0.35, ww, 0.32, "", color=GREEN, rounded=False)
    label(ax, wx + ww / 2, wy + wh + 0.95, "x: K values, read by every program",
          ha="center", size=SMALL)
    stripes = 6
    fills = {(r, 0): BLUE for r in range(stripes) if r != 3}
    fills |= {(r, c): SKY for r in range(stripes) for c in range(1, tiles) if r != 3}
    cells(ax, wx, wy, ww, wh, stripes, tiles, fills=fills, alpha=0.45)
    sh = wh / stripes
    names = ["program 0", "program 1", "program 2", "⋮", f"program {programs - 2}",
             f"program {programs - 1}"]
    for r, name in enumerate(names):
        label(ax, wx - 0.12, wy + wh - (r + 0.5) * sh, name, ha="right", size=SMALL)
    # y: one value per row of W; each program writes its block's b_n values
    yx = wx + ww + 0.7
    cells(ax, yx, wy, 0.4, wh, stripes, 1, fills={(r, 0): ORANGE for r in range(6)},
          alpha=0.35)
    label(ax, yx + 0.2, wy + wh + 0.5, "y", ha="center", size=SMALL)
    arrow(ax, (wx + ww + 0.05, wy + wh - 0.5 * sh), (yx - 0.05, wy + wh - 0.5 * sh))
    bracket(ax, wx, wx + ww, wy - 0.2, "", below=True)
    label(ax, wx + ww / 2, wy - 0.6, f"K = {cols:,} columns"
          + (f", {tiles} tiles" if tiles > 1 else ", one tile"), ha="center", size=SMALL)
    # the legend: what each program has in flight before the PDL wait
    box(ax, 0.2, 1.55, 0.35, 0.3, "", color=BLUE, alpha=0.45, rounded=False)
    label(ax, 0.7, 1.7, "first tile: loaded before the wait" if tiles > 1 else
          "a program's rows: all loaded", size=SMALL)
    label(ax, 0.7, 1.25, "the rest: after it" if tiles > 1 else "before the wait",
          size=SMALL)
    if tiles > 1:
        box(ax, 0.2, 1.1, 0.35, 0.3, "", color=SKY, alpha=0.45, rounded=False)
    label(ax, 0.15, 0.7, f"{rows:,} rows ÷ {block_n} = {programs:,} programs",
          size=SMALL)
    label(ax, 0.15, 0.25, f"for {sms} multiprocessors", size=SMALL)

    # --- (b): split-K, S programs per block --------------------------------------------
    x0 = 7.75
    label(ax, x0, 9.05, f"(b) Split-K: S = {split} programs a block", weight="bold",
          size=TITLE)
    bx, by, bw, bh = x0 + 1.3, 6.6, 5.8, 0.7  # one block of b_n rows, magnified
    colors = [BLUE, GREEN, PINK, ORANGE]
    seg = bw / split
    box(ax, bx, by + bh + 0.35, bw, 0.32, "", color=GREEN, rounded=False)
    label(ax, bx + bw / 2, by + bh + 0.95, "x, cut into the same S ranges",
          ha="center", size=SMALL)
    for s in range(split):
        box(ax, bx + s * seg, by, seg, bh, f"(j, {s})", color=colors[s % 4],
            rounded=False, size=SMALL)
    label(ax, bx - 0.12, by + bh / 2, "block j", ha="right", size=SMALL)
    # each program's b_n partial sums, FP32, into a workspace
    py, pw, ph = 4.75, seg - 0.2, 0.95
    for s in range(split):
        cx = bx + s * seg + seg / 2
        box(ax, cx - pw / 2, py, pw, ph, f"partial\nsums {s}", color=colors[s % 4],
            rounded=False, size=SMALL)
        arrow(ax, (cx, by - 0.05), (cx, py + ph + 0.05))
    # the last program to arrive (an atomic counter says which) adds them in order
    lx, ly, lw, lh = x0, 2.3, 15 - 0.1 - x0, 1.6
    box(ax, lx, ly, lw, lh, "the last program to arrive adds\nthe S FP32 partials in "
        "order, then:\nresidual, rounding, store y", color=GREY, size=SMALL)
    for s in range(split):
        cx = bx + s * seg + seg / 2
        arrow(ax, (cx, py - 0.05), (cx, ly + lh + 0.05))
    label(ax, x0, 1.7, f"{split} × {programs:,} = {split * programs:,} programs;",
          size=SMALL)
    label(ax, x0, 1.25, f"the partials add {partial_pct:.1f} % to W's bytes,", size=SMALL)
    label(ax, x0, 0.8, "and a round trip at the kernel's end", size=SMALL)
    return fig


def int8_widening():
    """Weight-only int8: a row of BF16 weights stored as a byte each and one BF16 scale;
    in the kernel, four bytes loaded as one word, flipped by one XOR, each placed in the
    bits of a float by a byte permute, a subtraction leaving the exact value, multiplied
    by x and summed in FP32, the row's sum scaled once. Each step is labelled with the
    rate its instructions issue at on Hopper (per multiprocessor and cycle, from the CUDA
    programming guide's table): the grey ones replace one conversion a weight, at 16."""
    fig, ax = canvas(15, 9.6)
    # --- stored -----------------------------------------------------------------------
    label(ax, 0.15, 9.25, "Stored: one row i of W", weight="bold", size=TITLE)
    n = 8
    cw = 0.8
    cells(ax, 2.0, 8.0, n * cw, 0.6, 1, n, fills={(0, c): BLUE for c in range(n)},
          alpha=0.3)
    for c in range(n):
        label(ax, 2.0 + (c + 0.5) * cw, 8.3, f"w{c + 1}" if c < n - 1 else "wK",
              ha="center", size=SMALL)
    label(ax, 1.85, 8.3, "BF16", ha="right", size=SMALL)
    label(ax, 2.0 + n * cw + 0.2, 8.3, "2 bytes a weight", size=SMALL)
    arrow(ax, (3.5, 7.95), (3.5, 7.05))
    label(ax, 3.7, 7.5, "once, offline:  s = max |w| / 127,  q = round(w / s)",
          size=SMALL, color="0.25")
    cells(ax, 2.0, 6.4, n * cw / 2, 0.6, 1, n, fills={(0, c): GREEN for c in range(n)},
          alpha=0.35)
    box(ax, 2.0 + n * cw / 2 + 0.15, 6.4, 0.7, 0.6, "s", color=ORANGE, rounded=False,
        size=SMALL)
    label(ax, 1.85, 6.7, "int8", ha="right", size=SMALL)
    label(ax, 2.0 + n * cw / 2 + 1.05, 6.7, "a byte a weight, and one BF16 scale a row",
          size=SMALL)

    # --- in the kernel: a snake, left to right, then back right to left -----------------
    label(ax, 0.15, 5.65, "In the kernel: four weights at a time", weight="bold",
          size=TITLE)
    w, gap, h = 4.5, 0.6, 1.45
    xs = [0.15 + i * (w + gap) for i in range(3)]
    top, bottom = 3.65, 1.2
    steps = [  # (text, colour, x, y): the first row runs right, the second back left
        ("one 32-bit load:\nfour int8 bytes q", GREEN, xs[0], top),
        ("one XOR 0x80808080:\nu = q + 128, all four\ninteger, 64 a cycle", GREY,
         xs[1], top),
        ("a byte permute each:\nthe float 2²³ + u\nan integer instruction", GREY, xs[2],
         top),
        ("a subtraction each:\n− (2²³ + 128) leaves q\nfloat, 128 a cycle", GREY, xs[2],
         bottom),
        ("× xⱼ, added to the\nrow's FP32 sum\nfloat, 128 a cycle", BLUE, xs[1], bottom),
        ("× s once a row,\nrounded to BF16: yᵢ", ORANGE, xs[0], bottom),
    ]
    for text, color, x, y in steps:
        box(ax, x, y, w, h, text, color=color, size=SMALL)
    for (_, _, xa, ya), (_, _, xb, yb) in zip(steps, steps[1:]):
        if ya != yb:  # down from the first row's end to the second row's start
            arrow(ax, (xa + w / 2, ya - 0.05), (xb + w / 2, yb + h + 0.05))
        elif xb > xa:
            arrow(ax, (xa + w + 0.03, ya + h / 2), (xb - 0.03, yb + h / 2))
        else:
            arrow(ax, (xa - 0.03, ya + h / 2), (xb + w + 0.03, yb + h / 2))
    # what the grey steps replace, and where the rates come from
    label(ax, 0.15, 0.65, "Grey: in place of one int-to-float conversion a weight, "
          "which issues at 16 a cycle.", size=SMALL)
    label(ax, 0.15, 0.2, "Rates: instructions per cycle per multiprocessor on Hopper.",
          size=SMALL, color="0.25")
    return fig


def step_kernels(layers: int, kernels: int):
    """The kernels of one decode step in launch order, each box what it computes: an
    embedding lookup, then per layer five kernels (the q/k/v product with the norm
    before it and the rotary embedding and cache write after it; attention; the
    o-projection with the residual add; gate/up with the norm and SiLU·up; down with
    the residual add), then the lm_head with the final norm and the argmax."""
    fig, ax = canvas(15, 5.2)
    kinds = {"product": BLUE, "attention": ORANGE, "other": GREY}
    y, h = 1.55, 2.45
    boxes = [("embed:\none row", "other", 1.35),
             ("norm,\nq/k/v,\nrotary,\ncache\nwrite", "product", 1.5),
             ("attention\nover the\ncache", "attention", 1.8),
             ("o,\nresidual", "product", 1.5),
             ("norm,\ngate/up,\nSiLU·up", "product", 1.7),
             ("down,\nresidual", "product", 1.5),
             ("norm,\nlm_head", "product", 1.55),
             ("argmax:\nthe next\ntoken", "other", 1.45)]
    gap, x = 0.3, 0.15
    edges = []
    for i, (text, kind, w) in enumerate(boxes):
        box(ax, x, y, w, h, text, color=kinds[kind], size=SMALL)
        if i:
            arrow(ax, (x - gap + 0.02, y + h / 2), (x - 0.02, y + h / 2))
        edges.append((x, x + w))
        x += w + gap
    # the five kernels of a layer, repeated for every layer
    bracket(ax, edges[1][0], edges[5][1], y + h + 0.25,
            f"× {layers} layers: five kernels a layer", size=SMALL)
    label(ax, 0.15, 0.95, f"{kernels} kernels a step, each waiting on the one before "
          "it for its input", size=SMALL)
    label(ax, 0.15, 0.4, "blue: reads weights;  orange: reads the KV cache;  "
          "grey: a few kilobytes", size=SMALL)
    return fig
