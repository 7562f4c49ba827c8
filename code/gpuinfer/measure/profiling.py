"""Recording profiler traces with torch.profiler; `gpuinfer.report.trace` reads them.

Every trace of the book is recorded inside `session()`: CPU activity, and CUDA activity when
there is a GPU, exported as a Chrome trace (the JSON that ui.perfetto.dev opens) and loaded
as a dict. `profile_decode` traces one generation of a Chapter 2 loop and keeps its last few
decode steps; `profiled_kernel_ms` reads kernel durations, the cross-check of CUDA-event
timing; `profile_steps` traces single decode steps (a graph replay each, say), with the
host given a head start if asked.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from gpuinfer.env import sync
from gpuinfer.measure.steps import STEP, decode_steps
from gpuinfer.measure.trace_events import (API_CATS, GPU_CATS, Ranges, events, is_launch,
                                           step_events, top_level_ops)

BODY = "profiled code"  # the range around the code a session() profiles


@contextlib.contextmanager
def _native_stderr_muted():
    """Silence what C++ code writes to file descriptor 2 (Kineto's "profiler_start")."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class Recorded:
    """What a `session()` recorded: `trace`, the Chrome trace as a dict, once it ended."""

    trace: dict | None = None


@contextlib.contextmanager
def session():
    """Profile what runs inside; afterwards the yielded object's `trace` holds the trace.

    The GPU is synchronized on entry and exit, so the trace holds all the work launched
    inside. Two things are kept out of the traced code: Kineto's start and stop messages
    (muted, only while the profiler starts and stops), and the ~2 ms that CUPTI takes, at
    the first kernel launch it sees, to request its activity buffer: a one-element fill is
    launched first, so that the first step of the code is not charged with it. The code
    inside runs in a range named `BODY`.
    """
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with _profiled(activities) as recorded:
        with torch.profiler.record_function(BODY):
            yield recorded
            sync()


@contextlib.contextmanager
def _profiled(activities: list):
    """torch.profiler recording `activities` around what runs inside, as `session()` says:
    the GPU synchronized on entry and exit, Kineto's messages muted, CUPTI's buffer request
    made before the code runs; the yielded `Recorded` holds the trace once it ended."""
    recorded = Recorded()
    prof = torch.profiler.profile(activities=activities)
    sync()
    with _native_stderr_muted():
        prof.__enter__()
    try:
        if torch.cuda.is_available():
            torch.empty(1, device="cuda").fill_(1.0)  # CUPTI's buffer request lands here
            sync()
        yield recorded
        sync()
    finally:
        with _native_stderr_muted():
            prof.__exit__(None, None, None)
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(raw)
        recorded.trace = load_trace(raw)


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
    """Keep the last `keep_steps` steps only: their CPU events, GPU work and metadata."""
    steps = step_events(trace, step_name)[-keep_steps:]
    if not steps:
        raise ValueError(f"no {step_name!r} ranges in the trace: was a decode loop "
                         "profiled?")
    start = steps[0].ts
    cpu_end = steps[-1].end
    launched = {e.correlation for e in events(trace, API_CATS) if start <= e.ts <= cpu_end}
    gpu = [e for e in events(trace, GPU_CATS) if e.correlation in launched]
    end = max([cpu_end] + [e.end for e in gpu])
    overlapping = {e.correlation for e in events(trace, GPU_CATS)
                   if e.end > start and e.ts < end}
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
                continue  # a range begun inside that outlives the window (the profiler's)
            kept.append(raw)
    out = {k: v for k, v in trace.items() if k != "traceEvents"}
    out["traceEvents"] = kept
    return out


def profile_decode(fn, model, prompt_ids, new_tokens: int, path: str | None = None, *,
                   keep_steps: int = 4, warmup: bool = True) -> dict:
    """Profile one generation of `fn` and return its last `keep_steps` decode steps, also
    written to `path` if given (it should end in `.json.gz`).

    A warm-up generation first keeps one-time costs (module loading, cuBLAS handles,
    allocator growth) out of the trace.
    """
    if warmup:
        fn(model, prompt_ids, new_tokens)
    with session() as recorded:
        fn(model, prompt_ids, new_tokens)
    trace = trim_trace(recorded.trace, keep_steps)
    if path is not None:
        save_trace(trace, path)
    return trace


# GPU clock cycles of a head start: about 50 ms at an H200's 1.98 GHz, far longer than the
# host needs to launch 20 graph replays under the profiler (a few hundred µs each).
HEAD_START_CYCLES = 100_000_000


def profile_steps(step: Callable[[], object], *, steps: int = 20,
                  head_start: bool = False) -> dict:
    """A trace of `steps` calls of `step`, each marked as a decode step (so that
    `gpuinfer.report.trace` reads them), from a state the caller has prepared.

    The profiler slows the host, a graph launch most of all, so that in its trace a short
    graphed step waits for its own launch. With `head_start`, a sleep kernel first holds the
    GPU (`HEAD_START_CYCLES`) while the host launches every step; the GPU then runs the
    steps back to back, as it does at speed, and the trace's GPU lane shows the steps' own
    gaps (`StepStats.queued_ahead` says whether the head start was long enough). The sleep
    kernel overlaps the steps' CPU ranges: in such a trace only the GPU-span figures of
    `StepStats` describe the steps.
    """
    with session() as recorded:
        if head_start and torch.cuda.is_available():
            torch.cuda._sleep(HEAD_START_CYCLES)  # a spin kernel, from PyTorch's own tests
        for _ in decode_steps(range(steps)):
            step()
    return recorded.trace


def profiled_kernels(fn: Callable, *, repeats: int = 20,
                     warmup: int = 3) -> list[tuple[str, float]]:
    """(name, duration in ms) of every device kernel `fn` launches, as torch.profiler
    records them, `repeats` calls after `warmup` untimed ones. Without CUDA: the top-level
    ATen ops instead (smoke mode)."""
    for _ in range(warmup):
        fn()
    with session() as recorded:
        for _ in range(repeats):
            fn()
    trace = recorded.trace
    body = Ranges([e for e in events(trace, "user_annotation") if e.name == BODY])
    if torch.cuda.is_available():
        launched = {e.correlation for e in events(trace, API_CATS) if body.holding(e)}
        found = [e for e in events(trace, "kernel") if e.correlation in launched]
    else:
        found = [e for e in top_level_ops(trace)
                 if e.name.startswith("aten::") and body.holding(e)]
    return [(e.name, e.dur / 1e3) for e in found]


def profiled_kernel_ms(fn: Callable, *, repeats: int = 20, warmup: int = 3) -> list[float]:
    """Durations (ms) of the device kernels `fn` launches (`profiled_kernels`).

    The cross-check of `gpuinfer.measure.timing.benchmark`: for a kernel long enough that
    launch gaps do not matter, the CUDA-event time and the profiler's kernel time must
    agree.
    """
    return [ms for _, ms in profiled_kernels(fn, repeats=repeats, warmup=warmup)]


@dataclass(frozen=True)
class CallAnatomy:
    """Where the time of an eager call goes, timed as `timing.benchmark` times calls (an
    event recorded before and after each, the calls back to back, no sync between them),
    read from a trace of the GPU's activity and the CUDA API calls (CUPTI only, no CPU
    profiling, so the host is barely slowed): medians over the calls, in µs."""

    calls: int
    event_us: float  # the call as its two events time it, in the traced run
    kernel_us: float  # the call's kernels, first start to last end
    gap_us: float  # the previous call's last kernel end to this call's first kernel start
    queued_us: float  # the launch call's start to its kernel's start: > 0, the host ahead
    host_us: float  # host time per call: one call's first event record to the next one's


def call_anatomy(fn: Callable[[], object], *, calls: int = 30,
                 warmup: int = 3) -> CallAnatomy | None:
    """The anatomy of `calls` eager calls of fn (`CallAnatomy`); None without CUDA. fn
    must record no CUDA event of its own: the calls are found by theirs."""
    if not torch.cuda.is_available():
        return None
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    with _profiled([torch.profiler.ProfilerActivity.CUDA]) as recorded:
        for i in range(calls):
            starts[i].record()
            fn()
            ends[i].record()
    trace = recorded.trace
    api = sorted(events(trace, API_CATS), key=lambda e: e.ts)
    kernels = {e.correlation: e for e in events(trace, "kernel")}
    records = [e for e in api if e.name.startswith("cudaEventRecord")]
    if len(records) != 2 * calls:
        raise RuntimeError(f"the trace holds {len(records)} event records for {calls} "
                           "calls: fn must record no CUDA event of its own")
    per_call = []  # (first event record, the call's kernels in launch order)
    for start, end in zip(records[::2], records[1::2]):
        launched = [e for e in api if start.ts < e.ts < end.ts and is_launch(e.name)
                    and e.correlation in kernels]
        if not launched:
            raise RuntimeError("the profiler recorded no kernel launched by a call")
        per_call.append((start, launched))
    elapsed = [1e3 * s.elapsed_time(e) for s, e in zip(starts, ends)]
    parts = []
    for i in range(1, calls):
        (before, previous), (start, launched) = per_call[i - 1], per_call[i]
        first, last = kernels[launched[0].correlation], kernels[launched[-1].correlation]
        parts.append((elapsed[i], last.end - first.ts,
                      first.ts - kernels[previous[-1].correlation].end,
                      first.ts - launched[0].ts, start.ts - before.ts))
    med = [float(np.median([p[j] for p in parts])) for j in range(5)]
    return CallAnatomy(len(parts), *med)
