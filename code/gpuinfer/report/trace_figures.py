"""What a figure draws of a profiler trace, and nothing else: a trace small enough for a
recording to keep.

A profiler trace of a few eager decode steps holds tens of thousands of events, most of
which no figure draws (nested ATen ops, flow arrows, metadata, the arguments of every
kernel). `figure_trace` keeps the first decode steps of a trace and what
`gpuinfer.report.traceplot` draws of them, read by `gpuinfer.report.trace` as before: the
steps' ranges, the top-level ATen ops and CUDA API calls inside them, and the GPU work
they launched or that ran meanwhile, each event with only the fields those modules read,
a kernel's long name cut where that leaves its kind (its colour) as it was. Times are
kept relative to the first step's start (the figures' axes are relative anyway).
"""

from __future__ import annotations

from gpuinfer.measure import trace_events as E
from gpuinfer.measure.steps import STEP
from gpuinfer.report.kernel_names import kind_of

NAME_CHARS = 60  # a longer name is cut (a C++ kernel's templates and parameters)


def short_name(name: str) -> str:
    """`name`, cut to NAME_CHARS characters where that leaves what it computes (`kind_of`,
    which colours it in the figures) unchanged."""
    if len(name) <= NAME_CHARS:
        return name
    cut = name[:NAME_CHARS - 1] + "…"
    return cut if kind_of(cut) == kind_of(name) else name


def _slim(e: E.Event, base: float) -> dict:
    raw = {"ph": "X", "cat": e.cat, "name": short_name(e.name), "ts": round(e.ts - base, 3),
           "dur": round(e.dur, 3), "tid": e.tid}
    if e.correlation is not None:
        raw["args"] = {"correlation": e.correlation}
    return raw


def figure_trace(trace: dict, steps: int, step_name: str = STEP) -> dict:
    """The first `steps` decode steps of `trace` as `plot_timeline` and `plot_step_kernels`
    draw them (and `step_kernels` and `handovers` read them): the GPU work those steps
    launched, and from their first start to the end of that work (the window such a
    figure spans), the decode-step ranges, top-level ATen ops, CUDA API calls and GPU work
    that overlap it."""
    first = E.step_events(trace, step_name)[:steps]
    if not first:
        raise ValueError(f"no {step_name!r} ranges in the trace")
    start = first[0].ts
    inside = E.Ranges(first)
    api = E.events(trace, E.API_CATS)
    launched = {e.correlation for e in api if e.correlation is not None and
                inside.holding(e)}
    gpu = E.events(trace, E.GPU_CATS)
    end = max([first[-1].end] + [e.end for e in gpu if e.correlation in launched])

    def overlapping(events):
        return [e for e in events if e.end > start and e.ts < end]

    kept = (overlapping(E.step_events(trace, step_name))
            + overlapping(E.top_level_ops(trace)) + overlapping(api)
            + [e for e in gpu if e.correlation in launched or e.end > start and e.ts < end])
    return {"traceEvents": [_slim(e, start) for e in kept]}
