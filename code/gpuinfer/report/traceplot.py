"""A profiler timeline drawn from a Chrome trace, in the spirit of a Perfetto view.

`plot_timeline` draws a few decode steps of a trace (read with `gpuinfer.report.trace`)
as lanes sharing one time axis: the decode steps, the ATen ops the Python code called
(CPU), the CUDA API calls they made (CPU), and the kernels and copies that ran on the GPU.
A second panel zooms into a short window, where single launches, the kernels they start
(joined by a line, like Perfetto's flow arrows) and the idle gaps between them can be seen.
`plot_step_kernels` puts the GPU lane of one step of several traces one above the other, to
compare their gaps. Slices are coloured by what they compute
(`gpuinfer.report.kernel_names.kind_of`).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from gpuinfer.measure import trace_events as E
from gpuinfer.measure.steps import STEP
from gpuinfer.report import trace as T
from gpuinfer.report.kernel_names import KINDS, kind_of
from gpuinfer.report.plots import PALETTE

COLORS = dict(zip(KINDS, [PALETTE[0], PALETTE[3], PALETTE[5], PALETTE[2], PALETTE[4],
                            "#D7191C", "#7F7F7F", "#BBBBBB"]))
IDLE = "#D7191C"  # the GPU running nothing, in plot_step_kernels

LANES = ["decode step", "CPU: ATen ops", "CPU: CUDA API", "GPU: kernels"]


def _lane_slices(trace: dict, t0: float, t1: float, step_name: str):
    """The slices of each lane that overlap [t0, t1] (microseconds, trace clock)."""
    def overlapping(events):
        return [e for e in events if e.end > t0 and e.ts < t1]

    steps = overlapping(E.step_events(trace, step_name))
    ops = overlapping(E.top_level_ops(trace))
    api = overlapping(E.events(trace, E.API_CATS))
    gpu = overlapping(E.events(trace, E.GPU_CATS))
    return {"decode step": steps, "CPU: ATen ops": ops, "CPU: CUDA API": api,
            "GPU: kernels": gpu}


def _draw(ax, trace: dict, t0: float, t1: float, step_name: str, flows: bool, unit: str):
    scale = 1e-3 if unit == "ms" else 1.0  # trace times are microseconds
    step_numbers = {e.ts: i for i, e in enumerate(E.step_events(trace, step_name), start=1)}
    lanes = _lane_slices(trace, t0, t1, step_name)
    width_px = ax.get_window_extent().width or 800
    min_width = (t1 - t0) / width_px  # a thinner slice is drawn a pixel wide (as Perfetto)
    height = 0.7
    for row, lane in enumerate(LANES):
        y = len(LANES) - 1 - row
        events = lanes[lane]
        if lane == "decode step":
            for e in events:
                x0, x1 = max(e.ts, t0), min(e.end, t1)
                k = step_numbers[e.ts]
                ax.broken_barh([((x0 - t0) * scale, (x1 - x0) * scale)],
                               (y - height / 2, height),
                               facecolors="#E4E4E4" if k % 2 else "#CFCFCF",
                               edgecolors="white")
                wide = (x1 - x0) / (t1 - t0) * width_px  # the bar's width in pixels
                label = f"step {k}" if wide > 45 else f"{k}" if wide > 14 else ""
                ax.text(((x0 + x1) / 2 - t0) * scale, y, label, ha="center", va="center",
                        fontsize=8, clip_on=True)
            continue
        bars = [((e.ts - t0) * scale, max(e.dur, min_width) * scale) for e in events]
        colors = [COLORS[kind_of(e.name)] for e in events]
        ax.broken_barh(bars, (y - height / 2, height), facecolors=colors, linewidth=0,
                       antialiased=False)
        if lane == "CPU: CUDA API":  # mark host syncs, however short, as Perfetto does
            syncs = [(e.ts - t0) * scale for e in events if E.is_sync(e.name)]
            if syncs:
                ax.plot(syncs, [y + height / 2 + 0.12] * len(syncs), "v", ms=5, zorder=5,
                        color=COLORS["host sync"])
    joined = 0
    if flows:
        by_corr = {e.correlation: e for e in lanes["CPU: CUDA API"]
                   if e.correlation is not None}
        y_api, y_gpu = len(LANES) - 3, len(LANES) - 4
        for k in lanes["GPU: kernels"]:
            launch = by_corr.get(k.correlation)
            if launch is not None:
                ax.plot([(launch.ts - t0) * scale, (k.ts - t0) * scale],
                        [y_api - height / 2, y_gpu + height / 2], color="#555555", lw=0.5,
                        alpha=0.6)
                joined += 1
    ax.set_yticks(range(len(LANES)))
    ax.set_yticklabels(list(reversed(LANES)))
    ax.set_ylim(-0.6, len(LANES) - 0.4)
    ax.set_xlim(0, (t1 - t0) * scale)
    ax.set_xlabel(f"time ({'ms' if unit == 'ms' else 'µs'}) from the start of the window")
    ax.grid(axis="y", visible=False)
    return joined


def plot_timeline(trace: dict, *, steps: int = 2, zoom: tuple[float, float] | None = None,
                  step_name: str = STEP, title: str | None = None):
    """Lanes of CPU ops, CUDA API calls and GPU work over `steps` decode steps, plus a zoom.

    `zoom` is a (start, end) window in microseconds from the first drawn step's start; by
    default the last fifth of the first step and the start of the next, where one step hands
    over to the next (and where a naive loop waits for the GPU).
    """
    step_ranges = E.step_events(trace, step_name)[:steps]
    if not step_ranges:
        raise ValueError(f"no {step_name!r} ranges in the trace")
    t0 = step_ranges[0].ts
    gpu_ends = [e.end for e in E.events(trace, E.GPU_CATS) if e.ts < step_ranges[-1].end]
    t1 = max([step_ranges[-1].end] + gpu_ends)
    if zoom is None:
        first = step_ranges[0]
        span = first.dur * 0.25
        zoom = (first.dur - span * 0.8, first.dur + span * 0.2)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 5.6), height_ratios=[1, 1])
    fig.canvas.draw()  # sizes the axes, so one pixel can be converted to microseconds
    _draw(top, trace, t0, t1, step_name, flows=False, unit="ms")
    z0, z1 = t0 + zoom[0], t0 + zoom[1]
    joined = _draw(bottom, trace, z0, z1, step_name, flows=True, unit="us")
    top.axvspan(zoom[0] / 1e3, zoom[1] / 1e3, color="#FFE680", alpha=0.6, lw=0, zorder=-1)
    top.set_title(title or f"{len(step_ranges)} decode steps", loc="left")
    lines = "; lines join a launch to its kernel" if joined else ""
    bottom.set_title(f"zoom: {zoom[1] - zoom[0]:.0f} µs (the shaded window above){lines}",
                     loc="left", fontweight="normal", fontsize=9)
    drawn = _lane_slices(trace, t0, t1, step_name)
    used = {kind_of(e.name) for lane, events in drawn.items() if lane != "decode step"
            for e in events}
    handles = [Patch(color=c, label=k) for k, c in COLORS.items() if k in used]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4),
               fontsize=8)
    return fig


def plot_step_kernels(traces: dict[str, dict], *, step: int = 2, step_name: str = STEP,
                      title: str | None = None):
    """The GPU lane of one decode step of each trace, one row per trace, on a common time
    axis (microseconds from the step's first kernel), with the time the GPU sat idle between
    the step's kernels marked in red beneath it. Overlapping kernels: the later on top."""
    fig, ax = plt.subplots(figsize=(7.5, 0.8 * len(traces) + 1.4))
    used = set()
    labels = list(traces)
    for row, label in enumerate(labels):
        y = len(labels) - 1 - row
        work = T.step_kernels(traces[label], step, step_name)
        t0 = work[0].ts if work else 0.0
        kinds = [kind_of(e.name) for e in work]
        used.update(kinds)
        # one call in start order: where kernels overlap (an early start under PDL), the
        # later one is drawn on top, the same in every build
        ax.broken_barh([(e.ts - t0, e.dur) for e in work], (y - 0.2, 0.5),
                       facecolors=[COLORS[k] for k in kinds], linewidth=0,
                       antialiased=False)
        idle = [(a - t0, b - a) for a, b in E.gaps([(e.ts, e.end) for e in work])]
        ax.broken_barh(idle, (y - 0.36, 0.12), facecolors=IDLE, linewidth=0,
                       antialiased=False)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(list(reversed(labels)))
    ax.set_ylim(-0.6, len(labels) - 0.4)
    ax.set_xlim(left=0)
    ax.set_xlabel(f"time (µs) from the first kernel of decode step {step}")
    ax.grid(axis="y", visible=False)
    ax.set_title(title or f"the GPU lane of decode step {step}", loc="left")
    handles = [Patch(color=c, label=k) for k, c in COLORS.items() if k in used]
    handles.append(Patch(color=IDLE, label="GPU idle"))
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 5),
               fontsize=8)
    return fig
