"""The events a timeline of a few decode steps draws, small enough for a recording to keep.

A profiler trace of one of Chapter 2's loops is megabytes of JSON, too much to keep for a
presentation cell (gpuinfer.publish.kept). `gpuinfer.report.traceplot.plot_timeline` draws
the first few decode steps of it from four lanes: the steps, the top-level ATen ops, the
CUDA API calls and the GPU work. `TimelineSlice.of(trace, steps)` keeps those events of
that window only, as columns (each distinct name and category written once, times in
microseconds from the first step's start), and `TimelineSlice.trace()` gives them back as
a trace that `plot_timeline(..., steps=steps)` draws as it draws the whole one.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuinfer.measure import trace_events as E
from gpuinfer.measure.steps import STEP


@dataclass(frozen=True)
class TimelineSlice:
    """The drawn events of the first `steps` decode steps of a trace, column by column:
    event i is `cats[cat[i]]` `names[name[i]]`, from `ts[i]` for `dur[i]` µs (from the
    first step's start) on thread `tid[i]`, launched or launching with `correlation[i]`."""

    steps: int
    step_name: str
    names: list[str]
    cats: list[str]
    name: list[int]
    cat: list[int]
    ts: list[float]
    dur: list[float]
    tid: list
    correlation: list

    @classmethod
    def of(cls, trace: dict, steps: int = 2, step_name: str = STEP) -> TimelineSlice:
        """The events of `trace` that `plot_timeline(trace, steps=steps)` can draw."""
        ranges = E.step_events(trace, step_name)[:steps]
        if not ranges:
            raise ValueError(f"no {step_name!r} ranges in the trace")
        t0 = ranges[0].ts
        gpu_ends = [e.end for e in E.events(trace, E.GPU_CATS) if e.ts < ranges[-1].end]
        t1 = max([ranges[-1].end] + gpu_ends)  # as plot_timeline's window
        lanes = (E.step_events(trace, step_name) + E.top_level_ops(trace)
                 + E.events(trace, E.API_CATS) + E.events(trace, E.GPU_CATS))
        drawn = sorted((e for e in lanes if e.end > t0 and e.ts < t1),
                       key=lambda e: (e.ts, -e.dur))
        names = list(dict.fromkeys(e.name for e in drawn))
        cats = list(dict.fromkeys(e.cat for e in drawn))
        index_name = {n: i for i, n in enumerate(names)}
        index_cat = {c: i for i, c in enumerate(cats)}
        return cls(steps, step_name, names, cats,
                   [index_name[e.name] for e in drawn], [index_cat[e.cat] for e in drawn],
                   [round(e.ts - t0, 3) for e in drawn], [round(e.dur, 3) for e in drawn],
                   [e.tid for e in drawn], [e.correlation for e in drawn])

    def trace(self) -> dict:
        """The kept events as a Chrome trace (times from the first step's start)."""
        events = []
        for i, ts in enumerate(self.ts):
            event = {"ph": "X", "cat": self.cats[self.cat[i]],
                     "name": self.names[self.name[i]], "ts": ts, "dur": self.dur[i],
                     "pid": 0, "tid": self.tid[i]}
            if self.correlation[i] is not None:
                event["args"] = {"correlation": self.correlation[i]}
            events.append(event)
        return {"traceEvents": events}
