"""The events of a profiler trace: the complete events by category, the decode steps' CPU
ranges, the top-level ATen ops, which range holds an event, and the idle time between
intervals; `gpuinfer.report.trace` reads the decode steps out of them.

A trace is the Chrome-trace JSON that `torch.profiler` writes (`gpuinfer.measure.profiling`
records them), loaded as a dict. The parts used here:
- `ph: "X"` events have a start `ts` and a duration `dur`, both in microseconds;
- `cat: "cpu_op"`: an ATen operator on a CPU thread (`aten::mm`); they nest;
- `cat: "user_annotation"`: a `record_function` range, such as a `decode_step`;
- `cat: "cuda_runtime"` / `"cuda_driver"`: a CUDA API call on a CPU thread
  (`cudaLaunchKernel`, `cudaMemcpyAsync`, `cudaStreamSynchronize`);
- `cat: "kernel"`, `"gpu_memcpy"`, `"gpu_memset"`: work that ran on the GPU, each with
  `args.correlation`, the id of the API call that launched it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from gpuinfer.measure.steps import STEP

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATS = ("cuda_runtime", "cuda_driver")
# CUDA API calls after which the CPU thread waits for the GPU.
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cudaMemcpy", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize")


@dataclass(frozen=True)
class Event:
    """One complete (`ph: "X"`) trace event; times in microseconds."""

    name: str
    cat: str
    ts: float
    dur: float
    pid: object = 0
    tid: object = 0
    args: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def correlation(self):
        return self.args.get("correlation")


def events(trace: dict, cats) -> list[Event]:
    """The complete events of these categories, by start time (longest first on a tie)."""
    cats = (cats,) if isinstance(cats, str) else tuple(cats)
    out = [
        Event(e["name"], e["cat"], float(e["ts"]), float(e.get("dur", 0.0)),
              e.get("pid", 0), e.get("tid", 0), e.get("args", {}))
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") in cats
    ]
    return sorted(out, key=lambda e: (e.ts, -e.dur))


def step_events(trace: dict, step_name: str = STEP) -> list[Event]:
    """The CPU-side ranges of the decode steps, in time order."""
    return [e for e in events(trace, "user_annotation") if e.name == step_name]


def top_level_ops(trace: dict) -> list[Event]:
    """ATen ops not nested inside another op on the same thread: what Python called."""
    tops: list[Event] = []
    last_end: dict = {}
    for e in events(trace, "cpu_op"):
        if e.ts >= last_end.get(e.tid, float("-inf")):
            tops.append(e)
            last_end[e.tid] = e.end
    return tops


class Ranges:
    """Time ranges on CPU threads, not overlapping within a thread: which holds an event?"""

    def __init__(self, ranges: list[Event]):
        self.by_tid: dict = {}
        for r in sorted(ranges, key=lambda r: r.ts):
            self.by_tid.setdefault(r.tid, []).append(r)
        self.starts = {tid: [r.ts for r in rs] for tid, rs in self.by_tid.items()}

    def holding(self, e: Event) -> Event | None:
        """The range on e's thread that contains e's start, if any."""
        rs = self.by_tid.get(e.tid)
        if not rs:
            return None
        i = bisect.bisect_right(self.starts[e.tid], e.ts) - 1
        return rs[i] if i >= 0 and e.ts <= rs[i].end else None


def gaps(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The idle stretches (start, end) between a set of intervals, overlaps merged."""
    idle, busy_until = [], None
    for start, end in sorted(intervals):
        if busy_until is not None and start > busy_until:
            idle.append((busy_until, start))
        busy_until = end if busy_until is None else max(busy_until, end)
    return idle


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by a set of intervals, overlaps counted once."""
    if not intervals:
        return 0.0
    span = max(e for _, e in intervals) - min(s for s, _ in intervals)
    return span - sum(b - a for a, b in gaps(intervals))


def is_sync(name: str) -> bool:
    return name in SYNC_CALLS


def is_launch(name: str) -> bool:
    return "LaunchKernel" in name or "GraphLaunch" in name
