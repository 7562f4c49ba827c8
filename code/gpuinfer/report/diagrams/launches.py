"""Chapter 3's diagrams: where a small model's decode step waits, and what removes the wait.

- `eager_and_graph`: a host lane and a GPU lane, to scale. Eagerly, the host launches every
  kernel, each at a bare launch's cost (a lower bound on a real step's host time per
  kernel), and the GPU idles between short kernels; a CUDA graph is captured once (the
  launches recorded, not run) and replayed by one call, after which the GPU runs the
  kernels back to back, separated only by the hand-over between two kernels.
- `pdl_overlap`: one boundary between two kernels of a graph, not to scale. Without
  programmatic dependent launch the next kernel is launched only when the previous one
  has ended; with it, the next kernel is launched during the previous one's tail, runs
  its prologue there, and waits for the previous kernel's writes before its main work.

Each function takes the measured numbers it labels (this GPU's, from the recording) and
returns a matplotlib figure; the chapter glues it with `gpuinfer.report.diagrams.image`.
The page shows a 7.5-inch figure at about 0.6 of its size, so no text here is drawn
smaller than 11 pt (about 9 px on the page).
"""

from __future__ import annotations

from gpuinfer.report.diagrams import (AMBER, BLUE, GREY, ORANGE, arrow, box, bracket,
                                      canvas, label, lane, span)

NOTE = 11  # points: every text of these pictures, the smallest legible on the page
TITLE = 11.5  # points: a row's title, in bold


def eager_and_graph(t_launch_us: float, t_kernel_us: float, t_gap_us: float,
                    n_kernels: int, launches: int = 4):
    """Eager launches against a CUDA graph's capture and replay, on host and GPU lanes.

    t_launch_us: the host's cost of one eager launch; t_kernel_us: a kernel's mean
    duration in the eager step; t_gap_us: the GPU's idle time per kernel inside a graph;
    n_kernels: the kernels in one step (the graph's nodes). The two timelines share one
    time scale, so the eager row's idle GPU and the graph row's packed GPU compare by eye.
    """
    width, height = 16.0, 8.6
    fig, ax = canvas(width, height)
    x0, x1 = 2.0, 15.6  # where the lanes start and end
    # one time scale for both rows: the eager row's `launches` launches fill the lane
    scale = (x1 - x0 - 0.6) / (launches * t_launch_us)  # canvas units per µs
    h = 0.55  # a bar's height

    def at(t_us: float) -> float:
        return x0 + t_us * scale

    # --- eager: the host launches each kernel; the GPU waits for each launch. Each launch
    # is drawn at a bare launch's cost, the lower bound of the chapter's eq. (ch3-host):
    # a real step's host does more per kernel
    label(ax, 0.15, 8.25, "Eager, at a bare launch's cost: the host launches every kernel",
          weight="bold", size=TITLE)
    host_y, gpu_y = 6.85, 5.65
    lane(ax, host_y, h, "host", x0, x1, size=NOTE)
    lane(ax, gpu_y, h, "GPU", x0, x1, size=NOTE)
    for i in range(launches):
        start = i * t_launch_us
        span(ax, host_y, h, at(start), at(start + t_launch_us), f"launch {i + 1}",
             color=ORANGE, size=NOTE)
        # a kernel starts once its launch reaches the GPU, then the GPU idles again
        k0 = start + t_launch_us
        if k0 + t_kernel_us <= launches * t_launch_us + 1e-9:
            span(ax, gpu_y, h, at(k0), at(k0 + t_kernel_us), color=BLUE, alpha=0.55)
            idle_end = min(k0 + t_launch_us, launches * t_launch_us)
            span(ax, gpu_y, h, at(k0 + t_kernel_us), at(idle_end), color=GREY,
                 alpha=0.08, hatch="///")
    span(ax, gpu_y, h, at(0), at(t_launch_us), color=GREY, alpha=0.08, hatch="///")
    bracket(ax, at(0), at(t_launch_us), host_y + h + 0.12,
            rf"$t_\mathrm{{launch}}$ = {t_launch_us:.1f} µs", size=NOTE)
    bracket(ax, at(t_launch_us), at(t_launch_us + t_kernel_us), gpu_y + h + 0.1,
            rf"mean $t_i$ ≈ {t_kernel_us:.1f} µs", size=NOTE)
    label(ax, at(2.5 * t_launch_us), gpu_y - 0.35, "idle: waiting for the next launch",
          size=NOTE, ha="center", color="0.3")

    # --- capture, once: the same launches recorded into a graph, not run
    label(ax, 0.15, 4.35, "CUDA graph: captured once, replayed every step",
          weight="bold", size=TITLE)
    cap_y = 3.3
    lane(ax, cap_y, h, "capture", x0, x1, size=NOTE)
    box(ax, at(0), cap_y, 5.4, h, "one step under stream capture", color=ORANGE,
        size=NOTE, rounded=False)
    # the graph: its nodes are the step's kernels, each waiting for the one before
    nx, nw, step = 8.0, 0.95, 1.5
    for j, name in enumerate(["k1", "k2", "k3", "…", f"k{n_kernels}"]):
        x = nx + j * step
        if name == "…":
            label(ax, x + nw / 2, cap_y + h / 2, "…", ha="center", size=NOTE)
            continue
        box(ax, x, cap_y + 0.05, nw, h - 0.1, name, color=BLUE, size=NOTE)
        if j < 4 and name != "k3":
            arrow(ax, (x + nw, cap_y + h / 2), (x + step, cap_y + h / 2))
    arrow(ax, (at(0) + 5.45, cap_y + h / 2), (nx - 0.08, cap_y + h / 2))
    label(ax, x0, cap_y - 0.3, f"a graph of {n_kernels} kernel nodes, recorded, not run",
          size=NOTE, color="0.3")

    # --- replay: one launch; the GPU runs the kernels back to back
    rep_y, rgpu_y = 1.95, 0.85
    lane(ax, rep_y, h, "host", x0, x1, size=NOTE)
    lane(ax, rgpu_y, h, "GPU", x0, x1, size=NOTE)
    span(ax, rep_y, h, at(0), at(t_launch_us), "replay()", color=ORANGE, size=NOTE)
    label(ax, at(t_launch_us) + 0.2, rep_y + h / 2,
          "host free: it can prepare the next step", size=NOTE, color="0.3")
    t = t_launch_us
    drawn = 0
    while t + t_kernel_us <= launches * t_launch_us:
        span(ax, rgpu_y, h, at(t), at(t + t_kernel_us), color=BLUE, alpha=0.55)
        t += t_kernel_us + t_gap_us
        drawn += 1
    # the hand-over between the first two kernels, named below the lane
    g0 = t_launch_us + t_kernel_us
    arrow(ax, (at(g0) + 0.9, rgpu_y - 0.42), (at(g0 + t_gap_us / 2), rgpu_y + 0.02),
          style="-|>")
    label(ax, at(g0) + 1.0, rgpu_y - 0.45,
          rf"hand-over, $t_\mathrm{{gap}}$ ≈ {t_gap_us:.2f} µs",
          size=NOTE, color="0.3")
    # a scale bar: the rows are drawn to scale, this is how long 10 µs is
    bracket(ax, x1 - 10 * scale, x1, 0.15, "10 µs", color="0.3", size=NOTE)
    return fig


def pdl_overlap(t_gap_us: float):
    """One kernel boundary inside a graph, without and with programmatic dependent launch
    (not to scale). A kernel's height is how much of the GPU it occupies: its tail, the
    last thread blocks, leaves multiprocessors free. t_gap_us, the measured idle time per
    hand-over, labels the gap that PDL can hide."""
    width, height = 16.0, 7.0
    fig, ax = canvas(width, height)
    x0, x1 = 2.3, 15.7
    full, tail = 0.9, 0.4  # heights: a kernel filling the GPU, and its tail

    def kernel_a(y: float, named_tail: bool) -> None:
        span(ax, y, full, 2.5, 7.0, "kernel A", color=BLUE, alpha=0.5, size=NOTE)
        span(ax, y, tail, 7.0, 9.0, color=BLUE, alpha=0.5)
        if named_tail:
            label(ax, 8.0, y + tail + 0.22, "A's tail", size=NOTE, ha="center",
                  color="0.3")

    # --- without PDL: B is launched only when A has ended
    y = 4.6
    label(ax, 0.15, 6.55, "Without PDL: B is launched when A has ended", weight="bold",
          size=TITLE)
    lane(ax, y, full, "GPU", x0, x1, size=NOTE)
    kernel_a(y, named_tail=True)
    span(ax, y, full, 9.0, 10.2, color=GREY, alpha=0.08, hatch="///")
    span(ax, y, full, 10.2, 11.4, "pro-\nlogue", color=AMBER, alpha=0.5, size=NOTE)
    span(ax, y, full, 11.4, 14.0, "kernel B", color=ORANGE, alpha=0.5, size=NOTE)
    # brackets below a lane, their text clear of the ticks
    bracket(ax, 9.0, 10.2, y - 0.12, "", below=True)
    label(ax, 9.6, y - 0.45, rf"hand-over, $t_\mathrm{{gap}}$ ≈ {t_gap_us:.2f} µs",
          size=NOTE, ha="center", color="0.25")

    # --- with PDL: B launched during A's tail, its prologue overlapping it
    y = 1.1
    label(ax, 0.15, 3.62, "With PDL: B starts during A's tail, then waits for A's writes",
          weight="bold", size=TITLE)
    lane(ax, y, full, "GPU", x0, x1, size=NOTE)
    kernel_a(y, named_tail=False)
    # B's blocks take the multiprocessors the tail leaves free, above it
    top = full - tail - 0.05
    span(ax, y + tail + 0.05, top, 7.0, 8.7, "prologue", color=AMBER, alpha=0.5,
         size=NOTE)
    span(ax, y + tail + 0.05, top, 8.7, 9.0, color=GREY, alpha=0.15, hatch="..")
    span(ax, y, full, 9.0, 11.6, "kernel B", color=ORANGE, alpha=0.5, size=NOTE)
    # the two instructions that make the overlap safe
    arrow(ax, (6.5, y + full + 0.6), (7.0, y + full + 0.02))
    label(ax, x0, y + full + 0.85, "A: griddepcontrol.launch_dependents", size=NOTE)
    arrow(ax, (9.95, y + full + 0.55), (8.85, y + full + 0.02))
    label(ax, 10.0, y + full + 0.8, "B: griddepcontrol.wait,\nuntil A's writes are visible",
          size=NOTE)
    bracket(ax, 11.6, 14.0, y - 0.12, "", below=True)
    label(ax, 12.8, y - 0.45, r"saved $\leq t_\mathrm{gap} + t_\mathrm{pro}$", size=NOTE,
          ha="center", color="0.25")
    ax.plot([14.0, 14.0], [y - 0.12, 4.6], color="0.6", linewidth=0.8, linestyle=":")
    return fig
