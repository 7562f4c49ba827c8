"""Record decode steps with torch.profiler and read the numbers off the Chrome trace.

`profile_decode` runs one generation under `torch.profiler`, keeps the last few decode steps
(the loops in `gpuinfer.decode` mark each step with a `decode_step` range) and writes them as
a gzipped Chrome trace, the file a reader can open in ui.perfetto.dev. Everything else in this
module reads such a trace and computes what a person would otherwise read off the timeline by
eye: kernels per step, host syncs per step, how busy the GPU was, and where the CPU time went.

The trace format (Chrome trace events, as Kineto writes them), in the parts used here:
- `ph: "X"` events have a start `ts` and a duration `dur`, both in microseconds.
- `cat: "cpu_op"`: an ATen operator on a CPU thread (`aten::mm`); they nest.
- `cat: "user_annotation"`: a `record_function` range, such as our `decode_step`.
- `cat: "cuda_runtime"` / `"cuda_driver"`: a CUDA API call on a CPU thread
  (`cudaLaunchKernel`, `cudaMemcpyAsync`, `cudaStreamSynchronize`).
- `cat: "kernel"`, `"gpu_memcpy"`, `"gpu_memset"`: work that ran on the GPU. Each carries
  `args.correlation`, the id of the API call that launched it.
"""

from __future__ import annotations

import bisect
import contextlib
import gzip
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field

import torch

STEP = "decode_step"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATS = ("cuda_runtime", "cuda_driver")
# CUDA API calls after which the CPU thread waits for the GPU.
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cudaMemcpy", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize")


# --------------------------------------------------------------------------------------------
# Recording
# --------------------------------------------------------------------------------------------


def profile_decode(fn, model, prompt_ids, new_tokens: int, path: str, *, keep_steps: int = 4,
                   warmup: bool = True) -> dict:
    """Profile one generation of `fn` and write its last `keep_steps` decode steps to `path`.

    `path` should end in `.json.gz`. A warm-up generation first keeps one-time costs (module
    loading, cuBLAS handles, allocator growth) out of the trace. Returns the trimmed trace.
    """
    if warmup:
        fn(model, prompt_ids, new_tokens)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with _native_stderr_muted(), torch.profiler.profile(activities=activities) as prof:
        fn(model, prompt_ids, new_tokens)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(raw)
        trace = load_trace(raw)
    trace = trim_trace(trace, keep_steps)
    save_trace(trace, path)
    return trace


@contextlib.contextmanager
def _native_stderr_muted():
    """Silence what C++ code writes to file descriptor 2 (Kineto's "profiler_start" lines).

    Python's own warnings and exceptions go through sys.stderr and are not affected.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def load_trace(path: str) -> dict:
    """A Chrome trace from a `.json` or `.json.gz` file."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def save_trace(trace: dict, path: str) -> None:
    """Write a trace as JSON, gzipped when `path` ends in `.gz`."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        json.dump(trace, f)


def trim_trace(trace: dict, keep_steps: int, step_name: str = STEP) -> dict:
    """Keep only the last `keep_steps` steps: their CPU events, their GPU work, the metadata."""
    steps = step_events(trace, step_name)[-keep_steps:]
    if not steps:
        raise ValueError(f"no {step_name!r} ranges in the trace: was a decode loop profiled?")
    start = steps[0].ts
    cpu_end = steps[-1].end
    launched = {e.correlation for e in _events(trace, API_CATS) if start <= e.ts <= cpu_end}
    gpu = [e for e in _events(trace, GPU_CATS) if e.correlation in launched]
    end = max([cpu_end] + [e.end for e in gpu])
    overlapping = {e.correlation for e in _events(trace, GPU_CATS) if e.end > start and e.ts < end}
    keep_gpu = launched | overlapping
    kept = []
    for raw in trace["traceEvents"]:
        if raw.get("ph") == "M":  # process and thread names
            kept.append(raw)
        elif raw.get("cat") in GPU_CATS:
            if raw.get("args", {}).get("correlation") in keep_gpu:
                kept.append(raw)
        elif "ts" in raw and start <= float(raw["ts"]) <= end:
            if raw.get("ph") == "X" and float(raw["ts"]) + float(raw.get("dur", 0)) > end:
                continue  # a range that began inside but outlives the window (the profiler's own)
            kept.append(raw)
    out = {k: v for k, v in trace.items() if k != "traceEvents"}
    out["traceEvents"] = kept
    return out


# --------------------------------------------------------------------------------------------
# Reading events
# --------------------------------------------------------------------------------------------


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


def _events(trace: dict, cats) -> list[Event]:
    cats = (cats,) if isinstance(cats, str) else tuple(cats)
    out = [
        Event(e["name"], e["cat"], float(e["ts"]), float(e.get("dur", 0.0)), e.get("pid", 0),
              e.get("tid", 0), e.get("args", {}))
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") in cats
    ]
    return sorted(out, key=lambda e: (e.ts, -e.dur))


def step_events(trace: dict, step_name: str = STEP) -> list[Event]:
    """The CPU-side ranges of the decode steps, in time order."""
    return [e for e in _events(trace, "user_annotation") if e.name == step_name]


def top_level_ops(trace: dict) -> list[Event]:
    """ATen ops not nested inside another op on the same thread: what Python called."""
    tops: list[Event] = []
    last_end: dict = {}
    for e in _events(trace, "cpu_op"):
        if e.ts >= last_end.get(e.tid, float("-inf")):
            tops.append(e)
            last_end[e.tid] = e.end
    return tops


class _Ranges:
    """Time ranges on CPU threads, not overlapping within a thread: which one holds an event?"""

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


def _union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by a set of intervals, overlaps counted once."""
    total, cur_start, cur_end = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_end is None or s > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def _is_sync(name: str) -> bool:
    return name in SYNC_CALLS


def _is_launch(name: str) -> bool:
    return "LaunchKernel" in name or "GraphLaunch" in name


# --------------------------------------------------------------------------------------------
# The numbers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepStats:
    """What the decode steps of a trace did, per step (times in microseconds)."""

    steps: int
    wall_us: float  # first step's start to the end of the last step's GPU work, per step
    cpu_us: float  # time inside the steps' CPU ranges, per step
    op_us: float  # of which inside top-level ATen ops
    python_us: float  # of which outside any op: Python and framework bookkeeping
    ops: float  # top-level ATen ops called, per step
    kernels: float  # GPU kernels launched, per step
    gpu_copies: float  # GPU memcpy and memset operations, per step
    launch_calls: float  # kernel-launch API calls, per step
    syncs: float  # host syncs (cudaStreamSynchronize and friends), per step
    dtoh_copies: float  # device-to-host copies, per step
    kernel_us: float  # summed kernel durations, per step
    busy_us: float  # time the GPU was running something (overlaps counted once), per step
    gpu_busy_fraction: float  # busy time / wall time over the recorded steps
    gpu_span_us: float  # the steps' GPU work, its first start to its last end, per step
    gpu_span_busy_fraction: float  # time that work kept the GPU busy / that span
    queued_ahead: bool  # the host had launched every step before the GPU started the first

    @property
    def cpu_us_per_kernel(self) -> float:
        """CPU time of a step divided by its kernels: the host cost of one kernel."""
        return self.cpu_us / self.kernels if self.kernels else float("nan")


@dataclass
class _StepWork:
    """The decode steps of a trace and what they did, linked up."""

    steps: list[Event]  # the CPU ranges of the steps
    ops: list[Event]  # top-level ATen ops inside them
    api: list[Event]  # CUDA API calls inside them
    gpu: list[Event]  # GPU work those calls launched
    launched_by: dict  # correlation id -> the API call that launched it
    start: float  # first step's start
    end: float  # last step's end, or the end of its GPU work if that is later


def _step_work(trace: dict, step_name: str) -> _StepWork:
    steps = step_events(trace, step_name)
    if not steps:
        raise ValueError(f"no {step_name!r} ranges in the trace")
    in_steps = _Ranges(steps)
    ops = [op for op in top_level_ops(trace) if in_steps.holding(op)]
    api = [e for e in _events(trace, API_CATS) if in_steps.holding(e)]
    launched_by = {e.correlation: e for e in api if e.correlation is not None}
    gpu = [e for e in _events(trace, GPU_CATS) if e.correlation in launched_by]
    end = max([steps[-1].end] + [e.end for e in gpu])
    return _StepWork(steps, ops, api, gpu, launched_by, steps[0].ts, end)


def step_stats(trace: dict, step_name: str = STEP) -> StepStats:
    """Per-step counts and times of the decode steps in a trace (see `StepStats`).

    Wall time runs from the first step's start on the CPU to the end of the last step's work,
    on the CPU or the GPU, whichever is later. The GPU counts as busy whenever any kernel or
    copy runs, whichever step launched it.

    The GPU span looks at the GPU side alone: from the first kernel or copy the steps launched
    to the end of the last, and how much of it they kept the GPU busy. Where the host queued
    every step before the GPU began (`queued_ahead`), the host's pace, profiler overhead
    included, cannot show in it: what idles the GPU there is the steps' own gaps.
    """
    w = _step_work(trace, step_name)
    n = len(w.steps)
    wall = w.end - w.start
    cpu = sum(s.dur for s in w.steps)
    holder = _Ranges(w.steps)
    op_time = _union_length([(op.ts, min(op.end, holder.holding(op).end)) for op in w.ops])
    kernels = [e for e in w.gpu if e.cat == "kernel"]
    busy = _union_length([(max(e.ts, w.start), min(e.end, w.end))
                          for e in _events(trace, GPU_CATS) if e.end > w.start and e.ts < w.end])
    gpu_start = min((e.ts for e in w.gpu), default=0.0)
    span = max((e.end for e in w.gpu), default=0.0) - gpu_start
    own_busy = _union_length([(e.ts, e.end) for e in w.gpu])
    return StepStats(
        steps=n,
        wall_us=wall / n,
        cpu_us=cpu / n,
        op_us=op_time / n,
        python_us=(cpu - op_time) / n,
        ops=len(w.ops) / n,
        kernels=len(kernels) / n,
        gpu_copies=(len(w.gpu) - len(kernels)) / n,
        launch_calls=sum(_is_launch(e.name) for e in w.api) / n,
        syncs=sum(_is_sync(e.name) for e in w.api) / n,
        dtoh_copies=sum(e.cat == "gpu_memcpy" and "DtoH" in e.name for e in w.gpu) / n,
        kernel_us=sum(e.dur for e in kernels) / n,
        busy_us=busy / n,
        gpu_busy_fraction=busy / wall if wall > 0 else 0.0,
        gpu_span_us=span / n,
        gpu_span_busy_fraction=own_busy / span if span > 0 else 0.0,
        queued_ahead=bool(w.gpu) and w.steps[-1].end <= gpu_start,
    )


@dataclass(frozen=True)
class OpRow:
    """One row of the top-ops table: a top-level ATen op, per decode step."""

    name: str
    calls: float
    cpu_us: float  # inclusive CPU time of the op (its children included)
    kernels: float  # GPU kernels and copies the op launched
    gpu_us: float  # their summed GPU time


def top_ops(trace: dict, step_name: str = STEP, n: int = 10) -> list[OpRow]:
    """The top-level ATen ops of the decode steps, by CPU time per step, largest first.

    GPU work is attributed to the top-level op during whose CPU range it was launched, so an
    `aten::linear` row counts the GEMM kernel that its nested `aten::mm` launched.
    """
    w = _step_work(trace, step_name)
    in_ops = _Ranges(w.ops)
    rows: dict[str, list[float]] = {}
    for op in w.ops:
        row = rows.setdefault(op.name, [0, 0.0, 0, 0.0])
        row[0] += 1
        row[1] += op.dur
    for e in w.gpu:
        op = in_ops.holding(w.launched_by[e.correlation])
        row = rows.setdefault(op.name if op else "(outside ATen ops)", [0, 0.0, 0, 0.0])
        row[2] += 1
        row[3] += e.dur
    k = len(w.steps)
    table = [OpRow(name, c / k, cpu / k, kern / k, g / k)
             for name, (c, cpu, kern, g) in rows.items()]
    return sorted(table, key=lambda r: -r.cpu_us)[:n]


def top_ops_markdown(rows: list[OpRow]) -> str:
    """The top-ops table as Markdown, for display in a chapter."""
    lines = ["| op | calls / step | CPU µs / step | GPU kernels / step | GPU µs / step |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| `{r.name}` | {r.calls:.0f} | {r.cpu_us:.1f} | {r.kernels:.0f} | {r.gpu_us:.1f} |"
              for r in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Kernels by name
# --------------------------------------------------------------------------------------------

KERNEL_KINDS = ("matmul (library)", "attention (library)", "generated by Inductor (Triton)",
                "other (ATen)")


def kernel_name(name: str) -> str:
    """A kernel's name without its template arguments, parameter list and return type:
    `void at::native::reduce_kernel<512, 1, ...>(...)` -> `at::native::reduce_kernel`."""
    kept, depth = [], 0
    for ch in name:  # keep only what is outside every <...> and (...)
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(depth - 1, 0)
        elif depth == 0:
            kept.append(ch)
    words = "".join(kept).split()
    return words[-1] if words else name


def kernel_kind(name: str) -> str:
    """Who wrote the kernel, as far as its name tells: a library matrix product (cuBLAS:
    gemv, gemm, nvjet, split-K), a library attention kernel (flash, memory-efficient,
    cuDNN), a kernel Inductor generated (`triton_...`), or an ATen kernel."""
    if name.startswith("triton"):
        return KERNEL_KINDS[2]
    low = name.lower()
    if any(s in low for s in ("gemv", "gemm", "nvjet", "splitk", "cublas", "cutlass::gemm")):
        return KERNEL_KINDS[0]
    if any(s in low for s in ("fmha", "flash", "sdpa", "attention")):
        return KERNEL_KINDS[1]
    return KERNEL_KINDS[3]


@dataclass(frozen=True)
class KernelRow:
    """GPU kernels of one name, per decode step."""

    name: str  # `kernel_name` of the kernels
    kind: str  # `kernel_kind`
    calls: float
    us: float  # summed duration


def kernel_table(trace: dict, step_name: str = STEP) -> list[KernelRow]:
    """The GPU kernels the decode steps launched (directly or through a CUDA graph), grouped
    by `kernel_name`, per step, largest total time first."""
    w = _step_work(trace, step_name)
    by_name: dict[str, list[Event]] = {}
    for e in w.gpu:
        if e.cat == "kernel":
            by_name.setdefault(kernel_name(e.name), []).append(e)
    k = len(w.steps)
    rows = [KernelRow(name, kernel_kind(es[0].name), len(es) / k, sum(e.dur for e in es) / k)
            for name, es in by_name.items()]
    return sorted(rows, key=lambda r: -r.us)


def time_by_kind(rows: list[KernelRow]) -> dict[str, float]:
    """Kernel time per step of each `KERNEL_KINDS`, in that order (µs)."""
    return {kind: sum(r.us for r in rows if r.kind == kind) for kind in KERNEL_KINDS}


def kernel_table_markdown(rows: list[KernelRow], n: int = 8) -> str:
    """The first `n` rows of `kernel_table` as Markdown, the rest summed in a last row."""
    total = sum(r.us for r in rows) or float("nan")
    lines = ["| kernel | kind | calls / step | µs / step | share of kernel time |",
             "|---|---|---:|---:|---:|"]
    lines += [f"| `{r.name[:60]}` | {r.kind} | {r.calls:.0f} | {r.us:.1f} | "
              f"{100 * r.us / total:.0f} % |" for r in rows[:n]]
    rest = rows[n:]
    if rest:
        us = sum(r.us for r in rest)
        lines.append(f"| {len(rest)} other kernels | | {sum(r.calls for r in rest):.0f} | "
                     f"{us:.1f} | {100 * us / total:.0f} % |")
    return "\n".join(lines)
