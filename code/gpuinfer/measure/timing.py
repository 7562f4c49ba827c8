"""Timing GPU work correctly.

GPU launches are asynchronous: the host returns long before the kernel finishes, so a host
clock around a launch measures the launch, not the work. `benchmark` records a pair of CUDA
events around every repeat, excludes warm-up runs (module loading, cuBLAS handle creation,
autotuning), and reports the median with its spread. `inputs` rotates over several input
sets, so a working set smaller than the L2 cache is not simply re-read from the cache.

Without a CUDA device it falls back to a host clock and warns: the numbers are then a smoke
test of the code path, not a measurement of a GPU.
"""

from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from gpuinfer.env import sync


class HostClockWarning(UserWarning):
    """Timing fell back to the host clock because no CUDA device is available."""


@dataclass(frozen=True)
class Timing:
    """Repeated timings of one piece of work, in milliseconds."""

    times_ms: tuple[float, ...]
    clock: str  # "cuda-event" or "host"

    @property
    def median(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def min(self) -> float:
        return min(self.times_ms)

    @property
    def max(self) -> float:
        return max(self.times_ms)

    @property
    def q1(self) -> float:
        return _quantile(self.times_ms, 0.25)

    @property
    def q3(self) -> float:
        return _quantile(self.times_ms, 0.75)

    @property
    def repeats(self) -> int:
        return len(self.times_ms)

    def __str__(self) -> str:
        return (
            f"{_fmt_ms(self.median)} median (IQR {_fmt_ms(self.q1)} - {_fmt_ms(self.q3)}, "
            f"n={self.repeats}, {self.clock} clock)"
        )


def _quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile, the same as numpy's default."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _fmt_ms(ms: float) -> str:
    return f"{ms * 1e3:.1f} µs" if ms < 1 else f"{ms:.3f} ms"


def benchmark(
    fn: Callable,
    *,
    inputs: Sequence[tuple] | None = None,
    warmup: int = 5,
    repeats: int = 50,
) -> Timing:
    """Time `fn` with CUDA events: `warmup` untimed calls, then `repeats` timed ones.

    With `inputs`, call i runs `fn(*inputs[i % len(inputs)])`, rotating over input sets so
    that each repeat reads buffers the previous repeats did not touch; without it, `fn()`.
    Each repeat is bracketed by its own pair of events, so the spread is real.
    """
    if warmup < 0 or repeats < 1:
        raise ValueError(f"need warmup >= 0 and repeats >= 1, got {warmup=} {repeats=}")
    if inputs is not None and len(inputs) == 0:
        raise ValueError("inputs is empty: pass None to call fn() with no arguments")

    def call(i: int):
        return fn(*inputs[i % len(inputs)]) if inputs is not None else fn()

    for i in range(warmup):
        call(i)

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for i in range(repeats):
            starts[i].record()
            call(warmup + i)
            ends[i].record()
        torch.cuda.synchronize()
        times = tuple(s.elapsed_time(e) for s, e in zip(starts, ends))
        return Timing(times, "cuda-event")

    warnings.warn(
        "no CUDA device: timing with the host clock (smoke mode, not a GPU measurement)",
        HostClockWarning,
        stacklevel=2,
    )
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        call(warmup + i)
        times.append((time.perf_counter() - t0) * 1e3)
    return Timing(tuple(times), "host")


def capture_graph(fn: Callable[[], object], *,
                  warmup: int = 3) -> tuple[torch.cuda.CUDAGraph, object]:
    """Record the kernels `fn()` launches into a CUDA graph; return it and fn's outputs.

    The warm-up runs on a side stream, as the CUDA-graph docs prescribe: it triggers the
    one-time work (cuBLAS handles and workspaces, lazy module loading, the caching
    allocator's first blocks) that must not happen during capture. Capture then records the
    kernels without running them. The returned outputs are static tensors: every
    `graph.replay()` rewrites them in place, reading whatever `fn`'s inputs hold by then.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    torch.cuda.synchronize()
    return graph, outputs


def benchmark_graph(
    fn: Callable,
    *,
    calls: int = 20,
    inputs: Sequence[tuple] | None = None,
    warmup: int = 3,
    repeats: int = 20,
) -> Timing:
    """Time one call of a short kernel from back-to-back replays of a CUDA graph.

    A kernel that runs for a few microseconds is shorter than the host's launch cost, so
    timing it launch by launch measures the launches. Capturing `calls` calls (rotating over
    `inputs`) into one CUDA graph and timing its replays puts the kernels back to back; the
    result is the time per call. Without CUDA it falls back to `benchmark` (host clock).
    """
    if not torch.cuda.is_available():
        return benchmark(fn, inputs=inputs, warmup=warmup, repeats=repeats)

    def calls_in_a_row():
        for i in range(calls):
            fn(*inputs[i % len(inputs)]) if inputs is not None else fn()

    graph, _ = capture_graph(calls_in_a_row, warmup=1)
    per_replay = benchmark(graph.replay, warmup=warmup, repeats=repeats)
    return Timing(tuple(t / calls for t in per_replay.times_ms), "cuda-graph")


def graphed(fn: Callable[[], object], keep: object) -> Callable[[], None]:
    """fn captured in a CUDA graph (no CUDA: fn itself); a call replays it. The replay
    holds `keep`, what the graph reads and writes: freed, it would be reused under it."""
    if not torch.cuda.is_available():
        return fn
    graph, _ = capture_graph(fn, warmup=1)

    def replay():
        graph.replay()

    replay.buffers = keep
    return replay


def wall_seconds(fn: Callable[[], object]) -> tuple[object, float]:
    """fn() and its wall-clock seconds, its GPU work included: the device is drained before
    and after (for a compile time, or a first call that compiles)."""
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t0


def fresh_inputs(make: Callable[[], tuple], bytes_per_set: int, *,
                 min_total_bytes: int = 2**28, max_sets: int = 1000) -> list[tuple]:
    """Enough independent input sets that rotating over them touches `min_total_bytes`
    (default 256 MiB, four times the 60 MB L2 of an H100/H200), so repeats read HBM."""
    count = max(1, min(max_sets, -(-min_total_bytes // max(bytes_per_set, 1))))
    return [make() for _ in range(count)]
