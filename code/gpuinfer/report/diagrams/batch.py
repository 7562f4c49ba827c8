"""Chapter 4's diagrams: what a decode step reads and computes, and where its time goes.

- `shared_weights`: a batch-B decode step. The weights are read once and multiply the B
  sequences' tokens together (FLOPs grow with B, bytes do not); each sequence's KV cache is
  read by its own query alone (bytes and FLOPs both grow with B).
- `bytes_by_batch`: the step's bytes by part at a few batch sizes, to one scale, with the
  step's FLOPs and intensity beside each bar: the weights stay, the caches grow, and the intensity
  climbs towards the ceiling that the caches set.
- `step_budget`: the batch-1 step's time against its floor: the floor (every byte at the
  copy rate) above; below, the measured step split into its kernels by kind, the memory
  operations and the GPU's idle time, which add up to the step.

Every number a picture shows is passed in (from the chapter's recording); the shapes are
schematic. A page shows a diagram at about 0.6 of its drawn size, so no text here is drawn
smaller than 11 pt.
"""

from __future__ import annotations

from gpuinfer.report.diagrams import (AMBER, BLUE, GREEN, GREY, ORANGE, PINK, SKY, arrow,
                                      box, bracket, canvas, cells, label, lane, span)

# One colour per sequence of the batch: the same in its token column and in its attention.
SEQUENCE_COLOURS = (GREEN, PINK, AMBER, SKY)
# Points, as drawn at 7.5 in: shown at about 0.6 of that, 11 pt is about 9 px on the page.
NOTE = 11  # notes, numbers and the text in boxes
HEAD = 12  # bold headings and row names
CHAR = 0.13  # canvas units an 11-pt character takes, about (10 units = 7.5 in)


def shared_weights(*, weights_gb: float, cache_mb: float, context: float):
    """A batch-B decode step: the weights (`weights_gb`) read once for the whole batch and
    multiplied by B token vectors; B caches of `cache_mb` each (at `context` tokens), each
    read by its own sequence's attention. Four sequences stand for B."""
    fig, ax = canvas(10, 6.2)
    label(ax, 0.3, 5.9, "In memory: read once a step", weight="bold", size=HEAD)
    label(ax, 4.3, 5.9, "On the chip: the step's arithmetic", weight="bold", size=HEAD)

    # The weights: one box, one arrow, whatever B is.
    box(ax, 0.3, 3.25, 3.0, 2.2, f"weights\n{weights_gb:.2f} GB\nshared by the batch",
        color=BLUE, size=HEAD)
    arrow(ax, (3.3, 4.4), (4.25, 4.4), "once", color=BLUE, size=NOTE)

    # W x X = Y: each weight meets all B token columns, so FLOPs grow with B, bytes do not.
    cells(ax, 4.3, 3.55, 1.7, 1.7, 6, 6, color=BLUE,
          fills={(r, c): BLUE for r in range(6) for c in range(6)}, alpha=0.25)
    label(ax, 5.15, 5.45, "W", ha="center", weight="bold", size=HEAD)
    label(ax, 6.25, 4.4, "×", ha="center", size=14)
    token_cols = {(r, c): SEQUENCE_COLOURS[c] for r in range(6) for c in range(4)}
    cells(ax, 6.5, 3.55, 1.1, 1.7, 6, 4, fills=token_cols, alpha=0.55)
    label(ax, 7.05, 5.45, "B tokens", ha="center", weight="bold", size=HEAD)
    label(ax, 7.85, 4.4, "=", ha="center", size=14)
    cells(ax, 8.1, 3.55, 1.1, 1.7, 6, 4, fills=token_cols, alpha=0.55)
    label(ax, 8.65, 5.45, "B outputs", ha="center", weight="bold", size=HEAD)
    label(ax, 4.3, 3.2, "every weight meets every sequence's token:", size=NOTE,
          color="0.25")
    label(ax, 4.3, 2.88, r"$Q_W$ bytes, $2BQ_W/s$ FLOPs:", size=NOTE, color="0.25")
    label(ax, 4.3, 2.56, "FLOPs grow with B, bytes do not", size=NOTE, color="0.25")

    # The caches: one per sequence, each read by its own query only (nothing shared).
    label(ax, 0.3, 2.3, f"{cache_mb:.1f} MB each at {context:.0f} tokens", size=NOTE,
          color="0.25")
    names = ["sequence 1", "sequence 2", "sequence 3", "sequence B"]
    for i, (name, colour) in enumerate(zip(names, SEQUENCE_COLOURS)):
        y = 1.6 - i * 0.5
        box(ax, 0.3, y, 3.0, 0.4, f"KV cache, {name}", color=ORANGE, size=NOTE)
        box(ax, 4.3, y, 3.0, 0.4, f"attention, {name}", color=colour, alpha=0.35,
            size=NOTE)
        arrow(ax, (3.3, y + 0.2), (4.25, y + 0.2), color=ORANGE)
    label(ax, 7.5, 1.25, "each cache meets\nits own query only:\n"
          r"$B(n+1)Q_\mathrm{tok}$ bytes," "\n" r"$4BLHd_hn$ FLOPs", size=NOTE,
          color="0.25")
    return fig


PART_COLOURS = {"MLP": BLUE, "q, k, v, o": SKY, "embedding": GREEN, "norms": GREY,
                "KV cache": ORANGE}


def _grouped(parts: dict[str, float]) -> dict[str, float]:
    """The accounting's parts (gpuinfer.model.cost.bytes_by_part), named for the picture,
    the cache read and written as one."""
    out = dict.fromkeys(PART_COLOURS, 0.0)
    for name, b in parts.items():
        key = ("KV cache" if name.startswith("KV cache") else
               "MLP" if name.startswith("MLP") else
               "q, k, v, o" if name.startswith("attention") else
               "embedding" if name.startswith("embedding") else "norms")
        out[key] += b
    return out


def bytes_by_batch(parts: dict[int, dict[str, float]], flops: dict[int, float], *,
                   ridge: float, context: float):
    """One bar a batch size (`parts[batch]`: bytes by part, as the accounting gives them),
    all to one scale, with the step's FLOPs (`flops[batch]`) and its intensity beside it,
    and the ridge point (FLOP/byte) under the intensities."""
    batches = list(parts)
    grouped = {b: _grouped(parts[b]) for b in batches}
    longest = max(sum(g.values()) for g in grouped.values())
    x0, width = 1.75, 4.2  # the bars' scale: `width` units for the longest bar
    scale = width / longest
    fig, ax = canvas(10, 1.6 + 0.9 * len(batches))
    top = 1.05 + 0.9 * len(batches)
    label(ax, 0.1, top + 0.3, f"Bytes a step moves ({context:.0f} tokens of context)",
          weight="bold", size=HEAD)
    label(ax, 8.1, top + 0.3, "GFLOP", weight="bold", ha="right", size=HEAD)
    label(ax, 9.9, top + 0.3, "FLOP/byte", weight="bold", ha="right", size=HEAD)
    for i, b in enumerate(batches):
        y = top - 0.9 * (i + 1)
        label(ax, x0 - 0.15, y + 0.25, f"batch {b}", ha="right", weight="bold", size=HEAD)
        x = x0
        for name, nbytes in grouped[b].items():
            w = nbytes * scale
            if w <= 0:
                continue
            # a part too narrow for its name is named in the legend below only
            text = name if w > CHAR * (len(name) + 1) else ""
            box(ax, x, y, w, 0.5, text, color=PART_COLOURS[name], rounded=False,
                size=NOTE, alpha=0.35)
            x += w
        total = sum(grouped[b].values())
        label(ax, x + 0.08, y + 0.25, f"{total / 1e9:.2f} GB", size=NOTE)
        gflop = flops[b] / 1e9
        label(ax, 8.1, y + 0.25, f"{gflop:,.0f}" if gflop >= 10 else f"{gflop:.1f}",
              ha="right", size=NOTE)
        intensity = flops[b] / total
        label(ax, 9.9, y + 0.25, f"{intensity:,.0f}" if intensity >= 10 else
              f"{intensity:.1f}", ha="right", size=NOTE)
    label(ax, 9.9, 0.88, f"ridge: {ridge:.0f}", ha="right", size=NOTE, color="0.25")
    # the legend: every part's colour, the narrow ones included
    x = 0.3
    for name, colour in PART_COLOURS.items():
        box(ax, x, 0.2, 0.25, 0.25, color=colour, rounded=False, alpha=0.35)
        label(ax, x + 0.32, 0.325, name, size=NOTE)
        x += 0.6 + CHAR * len(name)
    return fig


def step_budget(*, floor_us: float, matmul_us: float, matmul_floor_us: float,
                attention_us: float, other_us: float, memory_us: float, idle_us: float,
                step_us: float):
    """The batch-1 step on a time axis: above, its floor (`floor_us`: all its bytes at the
    copy rate); below, the measured step (`step_us`): its kernels by kind (the profiler's
    durations), its memory operations (`memory_us`: the GPU's busy time beyond the
    kernels') and the GPU idle (`idle_us`), which add up to `step_us`. Under the matrix
    products, a bracket marks what their weights alone would take at the copy rate."""
    x0, x1 = 1.7, 9.8
    scale = (x1 - x0) / (step_us * 1.01)
    fig, ax = canvas(10, 3.55)

    def at(t: float) -> float:
        return x0 + t * scale

    bracket(ax, at(0), at(step_us), 3.15, f"the measured step: {step_us:.0f} µs, "
            f"{step_us / floor_us:.2f}× its floor", size=NOTE)
    lane(ax, 2.25, 0.6, "floor", x0, x1, size=HEAD)
    span(ax, 2.25, 0.6, at(0), at(floor_us), f"every byte at the copy rate: "
         f"{floor_us:.0f} µs", color=GREEN, size=NOTE)
    lane(ax, 0.85, 0.75, "measured", x0, x1, size=HEAD)
    parts = [("matrix products", matmul_us, BLUE), ("attention", attention_us, ORANGE),
             ("other\nkernels", other_us, AMBER)]
    t = 0.0
    for name, us, colour in parts:
        text = f"{name}\n{us:.0f} µs"
        lines = text.split("\n")
        # named inside its bar where the text fits, under it where not
        inside = (us * scale > CHAR * max(map(len, lines)) + 0.1
                  and 0.75 > 0.22 * len(lines))
        span(ax, 0.85, 0.75, at(t), at(t + us), text if inside else "", color=colour,
             size=NOTE)
        if not inside:
            label(ax, at(t + us / 2), 0.75, text, ha="center", va="top", size=NOTE,
                  color="0.25")
        t += us
    # what the kernels leave of the step: the memory operations, then the GPU idle
    span(ax, 0.85, 0.75, at(t), at(t + memory_us), "", color=GREY, alpha=0.45)
    span(ax, 0.85, 0.75, at(t + memory_us), at(step_us), "", color=GREY, alpha=0.12,
         hatch="//")
    label(ax, at(step_us), 1.7, f"memory operations: {memory_us:.0f} µs\n"
          f"GPU idle: {idle_us:.0f} µs", ha="right", va="bottom", size=NOTE, color="0.25")
    bracket(ax, at(0), at(matmul_floor_us), 0.75,
            f"weights at the copy rate: {matmul_floor_us:.0f} µs", below=True,
            size=NOTE)
    return fig
