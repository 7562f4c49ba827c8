"""Chapter 1's diagrams: the roofline's two regions, and what a host clock and a pair of
CUDA events see of work the host hands to the GPU.

- `roofline_regions`: the roofline of one GPU on log-log axes, drawn from its measured
  ceilings: the memory region left of the ridge, the compute region right of it, the ridge
  between them, and a few kernels marked at their intensity.
- `async_launch`: one large product on a host lane and a GPU lane. The host enqueues the
  kernel and returns at once, so a host clock read without a synchronize times the enqueue;
  the kernel runs later, between two events the GPU timestamps itself.
- `eager_handover`: eager calls timed back to back, each between two events: (a) at a
  given host time per call, (b) from a traced run's medians. Each panel is drawn in the
  regime its numbers give. A host faster than the kernel runs ahead and queues the next
  launch, so each pair of events brackets only its kernel (and the events themselves). A
  host slower than the kernel leaves the GPU idle: each pair then holds the host's work
  before the launch, the launch's latency and the kernel.

Every function takes the measured numbers it shows and returns a matplotlib figure; the
chapter turns it into an image with alt text (`gpuinfer.report.diagrams.image`).
"""

from __future__ import annotations

import math

from gpuinfer.report.diagrams import (BLUE, GREEN, GREY, ORANGE, arrow, bracket, canvas,
                                      label, lane, span)

# Points, as drawn on a 7.5-inch canvas. The page shows a diagram at about 0.6 of that
# size, so 11 pt is the smallest text that stays legible there (about 9 px).
SMALL = 11  # the annotations
LARGE = 12  # axis titles, roof names, panel titles, lane names


def roofline_regions(bandwidth: float, peak: float, *,
                     points: tuple[tuple[str, float], ...] = ()):
    """The roofline P = min(peak, bandwidth × I) on log-log axes, in SI units (bytes/s,
    FLOP/s), its two regions shaded and the ridge I* = peak / bandwidth marked; `points`
    are (name, intensity) of kernels, marked on the roof at their intensity."""
    fig, ax = canvas(10, 6.0)
    # Axes in decades: intensity from 0.1 FLOP/B to two decades past the ridge (10^4 on a
    # data-centre GPU), rate from the memory roof at 0.1 FLOP/B to a little above the peak.
    # One unit of canvas is the same length across and up, so the slope of the memory roof
    # (one decade up per decade across) is drawn at its true angle.
    x_dec = (-1.0, max(4.0, math.ceil(math.log10(peak / bandwidth) + 1.5)))
    y_dec = (math.floor(math.log10(bandwidth / 10)), math.log10(peak) + 0.3)
    left, right, bottom, top = 1.25, 9.5, 0.95, 5.6  # room for the last tick's label
    sx = (right - left) / (x_dec[1] - x_dec[0])
    sy = (top - bottom) / (y_dec[1] - y_dec[0])

    def at(intensity: float, rate: float) -> tuple[float, float]:
        return (left + (math.log10(intensity) - x_dec[0]) * sx,
                bottom + (math.log10(rate) - y_dec[0]) * sy)

    ridge = peak / bandwidth
    i_lo, i_hi = 10 ** x_dec[0], 10 ** x_dec[1]
    (x0, y0), (xr, yr) = at(i_lo, bandwidth * i_lo), at(ridge, peak)
    x1 = at(i_hi, peak)[0]

    # The two regions: everything under the roof, split at the ridge. A kernel in the
    # blue one cannot be compute-bound however well it is written.
    ax.fill([x0, xr, xr, x0], [y0, yr, bottom, bottom], color=BLUE, alpha=0.13, lw=0)
    ax.fill([xr, x1, x1, xr], [yr, yr, bottom, bottom], color=ORANGE, alpha=0.13, lw=0)
    ax.plot([x0, xr], [y0, yr], color=BLUE, lw=2.4, solid_capstyle="round")
    ax.plot([xr, x1], [yr, yr], color=ORANGE, lw=2.4, solid_capstyle="round")
    ax.plot([xr, xr], [bottom, yr], color="0.3", lw=1.1, ls="--")

    # Axes with a tick a decade.
    ax.plot([left, right], [bottom, bottom], color="0.2", lw=1)
    ax.plot([left, left], [bottom, top], color="0.2", lw=1)
    for d in range(int(x_dec[0]), int(x_dec[1]) + 1):
        x = left + (d - x_dec[0]) * sx
        ax.plot([x, x], [bottom, bottom - 0.07], color="0.2", lw=1)
        label(ax, x, bottom - 0.13, f"{10.0 ** d:g}", size=SMALL, ha="center", va="top")
    for d in range(int(math.ceil(y_dec[0])), int(y_dec[1]) + 1):
        y = bottom + (d - y_dec[0]) * sy
        ax.plot([left, left - 0.07], [y, y], color="0.2", lw=1)
        label(ax, left - 0.12, y, f"{10.0 ** (d - 12):g}", size=SMALL, ha="right")
    label(ax, (left + right) / 2, 0.42, "arithmetic intensity I (FLOP per byte, log scale)",
          size=LARGE, ha="center")
    ax.text(0.22, (bottom + top) / 2, "attainable rate P (TFLOP/s, log scale)", rotation=90,
            ha="center", va="center", fontsize=LARGE, color="0.1")

    # The roofs, named with this GPU's numbers.
    angle = math.degrees(math.atan2(sy, sx))
    i_mid = 10 ** ((x_dec[0] + math.log10(ridge)) / 2)  # the middle of the sloped roof
    xm, ym = at(i_mid, bandwidth * i_mid)
    ax.text(xm - 0.05, ym + 0.12,
            f"memory roof  P = βI,  β = {bandwidth / 1e12:.2f} TB/s", rotation=angle,
            rotation_mode="anchor", ha="center", va="bottom", fontsize=LARGE, color=BLUE)
    # Ended at the roof's right end: longer than the flat roof, it runs on over the empty
    # space above the sloped one.
    label(ax, x1, yr + 0.14,
          f"compute roof  P = π = {peak / 1e12:,.3g} TFLOP/s", size=LARGE, ha="right",
          va="bottom", color=ORANGE)
    label(ax, xr + 0.08, bottom + 0.22,
          f"ridge  I* = π/β = {ridge:,.0f} FLOP/B", size=SMALL, color="0.2")

    # What each region means, inside it.
    label(ax, left + 0.32 * (xr - left), bottom + 0.75,  # clear of the sloped roof
          "memory-bound\ntime = bytes / β\nmore arithmetic is free", size=SMALL,
          ha="center", color=BLUE)
    label(ax, (xr + x1) / 2, bottom + 1.05,  # above the ridge's label
          "compute-bound\ntime = FLOPs / π\nfewer bytes do not help", size=SMALL,
          ha="center", color="#9a4400")

    # Kernels at their intensity, on the roof: where they could be at best.
    for name, intensity in points:
        x, y = at(intensity, min(peak, bandwidth * intensity))
        ax.plot([x], [y], "o", color="0.1", ms=6, zorder=4)
        below_ridge = intensity < ridge
        label(ax, x + (0.12 if below_ridge else -0.12), y + (-0.1 if below_ridge else -0.2),
              name, size=SMALL, ha="left" if below_ridge else "right", va="top")
    return fig


def async_launch(host_ms: float, kernel_ms: float):
    """A host clock around a launch without a synchronize (Trap 2): the host enqueues the
    kernel in `host_ms` and reads its clock; the GPU runs the kernel, `kernel_ms` long
    between its two events, afterwards."""
    fig, ax = canvas(10, 3.3)
    t0, width = 1.9, 7.3  # where the timeline starts, and the kernel's length on it
    scale = width / kernel_ms  # canvas units per ms
    enqueue_end = t0 + host_ms * scale
    start = enqueue_end + 0.12  # the GPU picks the work up a moment after it is queued
    end = start + width
    host_y, gpu_y, h = 2.05, 0.75, 0.55
    lane(ax, host_y, h, "host", t0, end + 0.1, size=LARGE)
    lane(ax, gpu_y, h, "GPU", t0, end + 0.1, size=LARGE)

    # The host: the enqueue (a short bar), then a synchronize that waits for the GPU.
    span(ax, host_y, h, t0, enqueue_end, color=BLUE, alpha=0.55)
    span(ax, host_y, h, enqueue_end, end, "synchronize: the host waits for the GPU",
         color=GREY, alpha=0.12, size=SMALL)
    # The host clock's reading: a bracket over the enqueue, too short for its text, which
    # runs on to its right.
    y = host_y + h + 0.15
    ax.plot([t0, t0, enqueue_end, enqueue_end], [y - 0.08, y, y, y - 0.08], color="0.25",
            lw=1)
    label(ax, enqueue_end + 0.12, y, f"host clock without a sync: {host_ms:.3f} ms, "
          "the enqueue", size=SMALL, color="0.25")
    # The GPU: the kernel between its two events, which the GPU stamps when it gets there.
    span(ax, gpu_y, h, start, end, "the kernel: a @ b", color=ORANGE, alpha=0.35,
         size=LARGE)
    for x in (start, end):
        ax.plot([x], [gpu_y + h / 2], marker="D", color=GREEN, ms=7, zorder=4)
    label(ax, start + 0.1, gpu_y - 0.12, "start event", size=SMALL, va="top", color=GREEN)
    label(ax, end - 0.1, gpu_y - 0.12, "end event", size=SMALL, va="top", ha="right",
          color=GREEN)
    bracket(ax, start, end, gpu_y + h + 0.12, f"CUDA events: {kernel_ms:.2f} ms",
            size=SMALL)
    arrow(ax, (enqueue_end, host_y), (start, gpu_y + h), color="0.35")
    return fig


def eager_handover(host_us: float, kernel_us: float, traced: dict[str, float]):
    """Eager calls timed back to back, each between its own pair of events, in two panels
    (the module docstring). (a) The host needs `host_us` a call, the kernel `kernel_us`.
    (b) A traced run's medians (µs): `host` a call, `kernel`, `queued` (the launch call's
    start to its kernel's start) and `event` (a call's pair of events). Each panel is
    drawn in the regime its numbers give: a host faster than the kernel runs ahead and the
    kernels run back to back; a slower one leaves the GPU idle between kernels."""
    fig, ax = canvas(10, 6.0)
    host, kernel, queued, event = (traced[k] for k in ("host", "kernel", "queued", "event"))
    ahead = host < kernel
    before = max(event - kernel - queued, 0.0)  # start event to the launch call, derived
    # Where the kernels queue, a call's events sit between its kernel and the next one
    events = max(event - kernel, 0.0) if ahead else 0.0
    # (b) ends with its second kernel or the host's last call: the third, with room for a
    # label after it, where the host runs ahead; the second where the GPU waits for it.
    b_end = (max(before + queued + events + 2 * kernel, 3 * host / 0.8) if ahead else
             max(host + before + queued + kernel, 2 * host))
    # One time scale for both panels, wide enough for the longer of them
    across = 1.05 * max(host_us + 4 * max(host_us, kernel_us), b_end)  # µs
    t0, scale = 1.1, 8.7 / across  # canvas units per µs
    tx = lambda us: t0 + us * scale  # noqa: E731

    # (a) Calls that cost the host `host_us` each, each launch at the end of its call
    _title(ax, 5.8, f"(a) If a timed call cost the host {host_us:.1f} µs", host_us,
           kernel_us)
    lanes = _lanes(ax, 4.85, 3.95, t0, tx(across))
    done = _run(ax, lanes, tx, [(i * host_us, (i + 1) * host_us) for i in range(4)],
                [(i + 1) * host_us for i in range(4)], kernel_us)
    if host_us < kernel_us:
        _under(ax, tx(done[-1][0]), tx(done[-1][1]) - 0.03, 3.85,
               f"timed call = its kernel: {kernel_us:.1f} µs")
        label(ax, tx(4 * host_us) + 0.1, 5.125, "the host runs ahead", size=SMALL,
              color="0.3")

    # (b) The traced run. Where the kernels queue, the first one drawn starts behind those
    # of earlier calls, and each call's events hold its kernel alone; where the GPU waits,
    # they hold the host's work before the launch, the launch's latency and the kernel.
    _title(ax, 2.95, f"(b) The traced run: the host needs {host:.1f} µs a call", host,
           kernel)
    lanes = _lanes(ax, 1.95, 1.0, t0, tx(across))
    calls = [(i * host, (i + 1) * host) for i in range(3 if ahead else 2)]
    done = _run(ax, lanes, tx, calls, [c + before for c, _ in calls[:2]], kernel,
                queued=queued, events=events, before=before, arrows=1 if ahead else 2,
                idle_from=None if ahead else 0.0)
    label(ax, tx(done[0][0]) + 0.1, 1.78, f"launch → kernel: {queued:.1f} µs",
          size=SMALL, color="0.3")
    if ahead:
        earlier = tx(done[0][0] - events) - 0.03  # where the kernels of earlier calls end
        if earlier > t0:
            span(ax, 1.0, 0.55, t0, earlier, "kernels of earlier calls" * (earlier > 3.4),
                 color=ORANGE, alpha=0.15, size=SMALL)
        label(ax, tx(calls[-1][1]) + 0.1, 2.225, "the host runs ahead", size=SMALL,
              color="0.3")
        _under(ax, tx(done[0][0]), tx(done[0][0] + event), 0.9,
               f"timed call: {event:.1f} µs, its kernel and the events")
    else:
        _under(ax, t0, tx(event), 0.9, f"timed call: {event:.1f} µs")
    label(ax, (t0 + tx(across)) / 2, 0.15, "time →", size=LARGE, ha="center", color="0.3")
    return fig


def _title(ax, y: float, text: str, host: float, kernel: float) -> None:
    """A panel's title: `text`, which gives the host's µs a call, and how they compare
    with the kernel's, as printed."""
    shown = round(host, 1), round(kernel, 1)
    than = ("less than" if shown[0] < shown[1] else
            "more than" if shown[0] > shown[1] else "the same as")
    label(ax, 0.15, y, f"{text}, {than} the kernel's {kernel:.1f} µs",
          size=SMALL, weight="bold", va="center")


def _lanes(ax, host_y: float, gpu_y: float, x0: float, x1: float) -> tuple[float, float]:
    """A host lane at height host_y above a GPU lane at gpu_y, from x0 to x1; the two
    heights."""
    lane(ax, host_y, 0.55, "host", x0, x1, size=LARGE)
    lane(ax, gpu_y, 0.55, "GPU", x0, x1, size=LARGE)
    return host_y, gpu_y


def _run(ax, lanes, tx, calls, launches, kernel: float, *, queued: float = 0.0,
         events: float = 0.0, before: float = 0.0, arrows: int = 0,
         idle_from: float | None = None) -> list[tuple[float, float]]:
    """Draw `calls` ((start, end) in µs) on the host lane and the kernels of `launches`
    (µs) on the GPU lane: each starts `queued` after its launch or `events` after the
    kernel before it, whichever is later, and a longer wait is drawn as idle (before the
    first kernel too, from `idle_from`, unless None); an arrow from each of the first
    `arrows` launches to its kernel. The kernels' (start, end), in µs."""
    (host_y, gpu_y), h = lanes, 0.55
    for i, (c0, c1) in enumerate(calls):
        if before > 0:
            span(ax, host_y, h, tx(c0), tx(c0 + before), "before\nthe launch",
                 color=BLUE, alpha=0.35, size=SMALL)
        span(ax, host_y, h, tx(c0 + before), tx(c1) - 0.03,
             "the rest of the call" if before > 0 else f"call {i + 1}",
             color=BLUE, alpha=0.15 if before > 0 else 0.35, size=SMALL)
    done: list[tuple[float, float]] = []
    for i, launched in enumerate(launches):
        after = done[-1][1] + events if done else None  # the kernel before and its events
        start = max(launched + queued, 0.0 if after is None else after)
        free = idle_from if after is None else after  # the GPU's idle from here
        if free is not None and start > free:
            span(ax, gpu_y, h, tx(free), tx(start), "idle" * (tx(start) - tx(free) > 0.6),
                 color=GREY, alpha=0.08, size=SMALL, hatch="///")
        span(ax, gpu_y, h, tx(start), tx(start + kernel) - 0.03, f"kernel {i + 1}",
             color=ORANGE, alpha=0.35, size=SMALL)
        if i < arrows:
            arrow(ax, (tx(launched), host_y), (tx(start), gpu_y + h), color="0.35")
        done.append((start, start + kernel))
    return done


def _under(ax, x0: float, x1: float, y: float, text: str) -> None:
    """A measure from x0 to x1 hung below a lane at height y, its ticks up, `text` below."""
    ax.plot([x0, x0, x1, x1], [y + 0.08, y, y, y + 0.08], color="0.25", lw=1)
    label(ax, (x0 + x1) / 2, y - 0.06, text, size=SMALL, ha="center", va="top",
          color="0.25")
