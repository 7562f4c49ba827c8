"""Chapter 2's diagrams: what a decode step computes and reads, and where its time goes.

- `decode_step`: one decode step without a KV cache (the whole sequence runs through the
  model again, attention over every pair of positions) above one with a cache (one token
  runs through the model, attention reads the cached keys and values), each with this
  model's work and bytes written beside it.
- `cache_layout`: what the KV cache holds in one layer (a key tensor and a value tensor,
  a row per key-value head, a column per token) and why it grows by
  2 x layers x kv heads x head dim x bytes per element with every token.
- `launch_bound`: two decode steps of an eager loop on a host lane and a GPU lane, drawn
  to scale from measured times: the host spends the step launching, the GPU runs short
  kernels between long gaps, and a sync at the end of a step waits only for the last
  kernel.

Every function takes the numbers it writes as arguments (from the chapter's recording)
and returns a matplotlib figure, which the chapter glues with
`gpuinfer.report.diagrams.image`. The symbols are the book's: n the context length, L the
layers, H the heads, d_h a head's size, N_W the weights a token is multiplied by, s the
bytes per element.

The page shows a 7.5-inch canvas at about 0.6 of its drawn size, so no text here is
smaller than 11 points as drawn (about 9 px on the page).
"""

from __future__ import annotations

from gpuinfer.report.diagrams import (BLUE, GREEN, GREY, ORANGE, PINK, arrow, box,
                                      bracket, canvas, cells, label, lane, span)

SMALL = 11  # points: the smallest text, annotations beside the boxes
TITLE = 12  # points: a panel's title


def _sequence(ax, x, y, w, h, n, fill, *, last=None):
    """A row of n token cells, all filled with `fill`, the last one with `last`."""
    fills = {(0, c): fill for c in range(n)}
    if last:
        fills[(0, n - 1)] = last
    cells(ax, x, y, w, h, 1, n, fills=fills, alpha=0.45)


def decode_step(*, context: int, weight_mb: float, kv_mb: float, naive_gflop: float,
                naive_ms: float, cached_gflop: float, cached_us: float,
                floor_us: float):
    """A decode step without a KV cache (top) and with one (bottom), at `context`
    tokens.

    Top: all n tokens go through the weights; attention forms an n x n grid of scores,
    of which the causal half is used; logits come out for every position and only the
    last is kept. Bottom: one token goes through the same weights; its key and value are
    appended to the cache; attention is one row of n scores. The numbers beside each say
    what it costs on this GPU: FLOPs and their time at the measured rate, and the bytes
    read with their time at the copy rate."""
    fig, ax = canvas(15, 11.4)
    # Both panels share one layout, left to right: tokens in, the weights, attention,
    # logits out; so the eye compares them column by column.
    x_tok, x_w, x_att, x_out = 0.3, 4.0, 7.5, 11.7

    # --- without a cache ---
    label(ax, 0.3, 11.0, "Without a cache: each step runs the whole sequence again",
          weight="bold", size=TITLE)
    _sequence(ax, x_tok, 8.55, 3.0, 0.45, 8, ORANGE, last=PINK)
    label(ax, x_tok + 1.5, 8.1, f"all n = {context:,} tokens", ha="center", size=SMALL)
    arrow(ax, (x_tok + 3.05, 8.78), (x_w - 0.05, 8.78))
    box(ax, x_w, 8.15, 2.6, 1.25, f"weights\n{weight_mb:,.0f} MB", color=BLUE,
        size=SMALL)
    label(ax, x_w + 1.3, 7.75, "applied to n tokens", ha="center", size=SMALL)
    arrow(ax, (x_w + 2.65, 8.78), (x_att - 0.05, 8.78))
    # the scores: n x n, the causal lower half used; eager attention computes all of it
    cells(ax, x_att, 7.55, 2.5, 2.5, 8, 8,
          fills={(r, c): ORANGE for r in range(8) for c in range(r + 1)}, alpha=0.45)
    label(ax, x_att + 1.25, 10.4, "attention: n × n scores", ha="center", size=SMALL)
    arrow(ax, (x_att + 2.55, 8.78), (x_out - 0.05, 8.78))
    _sequence(ax, x_out, 8.55, 3.0, 0.45, 8, GREY, last=PINK)
    label(ax, x_out + 1.5, 9.4, "logits, every position", ha="center", size=SMALL)
    label(ax, x_out + 1.5, 8.1, "only the last is used", ha="center", size=SMALL)
    # the cost, on two lines: at 11 points one line would not fit the width
    label(ax, 0.3, 6.95, r"work $\approx 2N_W n + 2\,L H d_h n^2$, which grows with $n$ "
          r"and $n^2$:", size=SMALL, color=ORANGE)
    label(ax, 0.3, 6.45, f"{naive_gflop:,.0f} GFLOP, {naive_ms:.0f} ms at the FP32 rate",
          size=SMALL, color=ORANGE)

    # --- with a cache ---
    ax.plot([0.3, 14.7], [5.95, 5.95], color="0.8", linewidth=0.8)
    label(ax, 0.3, 5.45, "With a KV cache: one token's work, plus a read of the cache",
          weight="bold", size=TITLE)
    _sequence(ax, x_tok + 2.625, 3.15, 0.375, 0.45, 1, PINK)
    label(ax, x_tok + 3.0, 2.7, "the new token", ha="right", size=SMALL)
    arrow(ax, (x_tok + 3.05, 3.38), (x_w - 0.05, 3.38))
    box(ax, x_w, 2.75, 2.6, 1.25, f"weights\n{weight_mb:,.0f} MB", color=BLUE,
        size=SMALL)
    label(ax, x_w + 1.3, 2.35, "applied to 1 token", ha="center", size=SMALL)
    arrow(ax, (x_w + 2.65, 3.38), (x_att - 0.05, 3.38))
    # the cache: one stored key-value column per earlier token, the new one appended
    _sequence(ax, x_att, 3.15, 2.5, 0.45, 8, GREEN, last=PINK)
    label(ax, x_att + 1.25, 4.6, f"KV cache, read: {kv_mb:,.0f} MB", ha="center",
          size=SMALL, color=GREEN)
    label(ax, x_att + 1.25, 4.05, "(new key, value appended)", ha="center",
          size=SMALL)
    label(ax, x_att + 1.25, 2.7, "attention: 1 × n scores", ha="center", size=SMALL)
    arrow(ax, (x_att + 2.55, 3.38), (x_out + 2.575, 3.38))
    _sequence(ax, x_out + 2.625, 3.15, 0.375, 0.45, 1, PINK)
    label(ax, x_out + 2.8, 2.7, "logits", ha="center", size=SMALL)
    label(ax, 0.3, 1.45,
          r"work $= 2N_W + 4\,L H d_h n$:  "
          f"{cached_gflop:.2f} GFLOP,  {cached_us:.0f} µs at the FP32 rate",
          size=SMALL, color=BLUE)
    label(ax, 0.3, 0.95, f"bytes = weights + cache:  {weight_mb + kv_mb:,.0f} MB,  "
          f"{floor_us:.0f} µs at the copy rate,", size=SMALL, color=BLUE)
    label(ax, 0.3, 0.45, "so the bytes set the floor", size=SMALL, color=BLUE)
    return fig


def cache_layout(*, layers: int, kv_heads: int, head_dim: int, itemsize: int,
                 per_token_kib: float, prompt_len: int, prompt_mb: float):
    """One layer's KV cache: a key tensor and a value tensor, each a row per key-value
    head and a column per token, each cell a head's d_h numbers of `itemsize` bytes; the
    other layers' tensors stacked behind. A new token adds one column to both tensors in
    every layer."""
    fig, ax = canvas(15, 8.0)
    rows, cols = 6, 12  # drawn: a few heads and tokens stand for all of them
    w, h, y = 4.6, 2.6, 2.95
    for name, x in (("keys K", 1.9), ("values V", 9.0)):
        # the other layers' tensors, as shadows behind the first
        for k in (2, 1):
            box(ax, x + 0.18 * k, y + 0.18 * k, w, h, color=GREY, fill="0.93",
                rounded=False)
        box(ax, x, y, w, h, fill="white", color=GREY, rounded=False)  # hides them
        fills = {(r, cols - 1): PINK for r in range(rows)}
        fills.update({(r, c): GREEN for r in range(rows) for c in range(cols - 1)})
        cells(ax, x, y, w, h, rows, cols, fills=fills, alpha=0.35)
        label(ax, x + w / 2, y + h + 1.75, f"{name}: one tensor per layer ({layers})",
              ha="center", weight="bold", size=SMALL)
        # the bracket's text sits below its ticks, clear of them
        bracket(ax, x, x + w, y - 0.2, "", below=True)
        label(ax, x + w / 2, y - 0.55, f"n tokens, a column each (n = {prompt_len:,})",
              ha="center", size=SMALL)
        label(ax, x - 0.15, y + h / 2, f"{kv_heads} kv\nheads", ha="right", size=SMALL)
        arrow(ax, (x + w - 0.2, y + h + 1.35), (x + w - 0.2, y + h + 0.05), "new token",
              color=PINK, size=SMALL, offset=(-1.05, -0.2))
    for i, text in enumerate((
            f"A cell holds one head's $d_h$ = {head_dim} numbers of $s$ = {itemsize} "
            "bytes.",
            f"One token adds a column to each: 2 × {layers} × {kv_heads} × {head_dim} "
            f"× {itemsize} B = {per_token_kib:.0f} KiB.",
            f"The prompt's {prompt_len:,} tokens hold {prompt_mb:,.0f} MB, and every "
            "decode step reads all of it.")):
        label(ax, 0.3, 1.45 - 0.5 * i, text, size=SMALL)
    return fig


def launch_bound(*, step_ms: float, kernel_ms: float, kernels: int, launch_us: float):
    """The end of one decode step and the start of the next, of a launch-bound eager
    loop, to scale (microseconds). On the host lane, each slot is one kernel's launch
    (`launch_us`) and the Python around it: an even share of the measured step,
    `step_ms` / `kernels`. On the GPU lane, each kernel (an even share of `kernel_ms`)
    starts as its launch returns and ends long before the next arrives. Top: the step
    ends with a sync, which waits only for the last kernel. Bottom: without it, the host
    goes straight on."""
    fig, ax = canvas(15, 8.2)
    share = step_ms * 1e3 / kernels  # µs of host time per kernel
    kernel = kernel_ms * 1e3 / kernels  # µs of GPU time per kernel
    slots_before, slots_after = 5, 3
    x0 = 1.6
    scale = 12.6 / ((slots_before + slots_after + 0.6) * share)  # units per µs
    wait = kernel + 1.0  # the last kernel, then the token's copy back (about a µs)

    def row(y, sync):
        end = x0 + (slots_before + slots_after + 0.6) * share * scale
        lane(ax, y + 0.85, 0.55, "host", x0, end, size=SMALL)
        lane(ax, y, 0.55, "GPU", x0, end, size=SMALL)
        t = x0
        for s in range(slots_before + slots_after):
            if s == slots_before:  # the step boundary
                if sync:
                    span(ax, y + 0.85, 0.55, t, t + wait * scale, color=PINK, alpha=0.7)
                    ax.plot([t + wait * scale], [y + 1.55], marker="v", color=PINK,
                            markersize=7)
                    t += wait * scale
                ax.plot([t, t], [y - 0.15, y + 1.5], color="0.3", linewidth=1,
                        linestyle=":")
            python = (share - launch_us) * scale
            span(ax, y + 0.85, 0.55, t, t + python, color=BLUE, alpha=0.12)
            span(ax, y + 0.85, 0.55, t + python, t + share * scale, color=BLUE,
                 alpha=0.55)
            k0 = t + share * scale
            span(ax, y, 0.55, k0, k0 + kernel * scale, color=ORANGE, alpha=0.85)
            t += share * scale

    label(ax, 0.2, 7.8, "With a sync at the end of each step (the token read back)",
          weight="bold", size=TITLE)
    row(5.1, sync=True)
    label(ax, 0.2, 3.75, "Without syncs", weight="bold", size=TITLE)
    row(1.6, sync=False)
    b = x0 + slots_before * share * scale  # the step boundary (before the sync)
    python = (share - launch_us) * scale
    # what a slot holds, named once, on the top row
    label(ax, x0 + python / 2, 6.85, "Python", ha="center", size=SMALL)
    label(ax, x0 + (share + (share - launch_us) + launch_us / 2) * scale, 6.85,
          f"launch {launch_us:.1f} µs", ha="center", size=SMALL)
    label(ax, x0 + share * scale, 4.7, f"kernel {kernel:.1f} µs", size=SMALL,
          color=ORANGE)
    label(ax, b + (wait + 1.5 * share) * scale, 4.7, "the GPU idles", size=SMALL,
          color="0.35", style="italic")
    label(ax, b + wait * scale + 0.2, 6.85, "sync: waits for the last kernel",
          size=SMALL, color=PINK)
    label(ax, b - 0.1, 1.15, "← one step", ha="right", size=SMALL, color="0.3")
    label(ax, b + 0.1, 1.15, "the next step →", size=SMALL, color="0.3")
    label(ax, 0.2, 0.4,
          f"To scale: {share:.1f} µs of host time per kernel ({step_ms:.2f} ms over "
          f"{kernels} kernels); {kernel_ms:.2f} ms of kernels a step.",
          size=SMALL)
    return fig
