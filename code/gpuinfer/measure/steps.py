"""Marking the decode steps of a loop: for the profiler, and for a per-step clock.

Every decode loop of the book iterates over `decode_steps(range(...))`. While a profiler
records, each step is a named range (`record_function("decode_step")`) in its trace, which
is how `gpuinfer.measure.trace_events` finds the steps. Inside `step_clock()`, each step boundary
also records a timestamp: a CUDA event on the GPU (recording one does not synchronize, so
the loop runs as it would without the clock), the host clock on a CPU.
"""

from __future__ import annotations

import contextlib
import time

import torch

STEP = "decode_step"  # the name of a step's range in a profiler trace

_marks: list | None = None  # set inside step_clock(): one timestamp per step boundary


def timestamp():
    """A CUDA event recorded on the current stream (no sync), or the host clock on a CPU."""
    if torch.cuda.is_available():
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


@contextlib.contextmanager
def annotate(name: str):
    """A named range in the profiler trace, only while a profiler is recording."""
    if torch.autograd._profiler_enabled():
        with torch.profiler.record_function(name):
            yield
    else:
        yield


def decode_steps(indices: range, name: str = STEP):
    """Iterate over decode steps, marking each one for the profiler and for step_clock."""
    for i in indices:
        if _marks is not None:
            _marks.append(timestamp())
        with annotate(name):
            yield i
    if _marks is not None:
        _marks.append(timestamp())


def durations_ms(pairs) -> list[float]:
    """Each (start, end) pair of timestamps in ms: CUDA events on the GPU's timeline
    (after a sync), else host-clock seconds."""
    pairs = list(pairs)
    if pairs and not isinstance(pairs[0][0], float):
        torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in pairs]
    return [(b - a) * 1e3 for a, b in pairs]


class StepTimes:
    """Timestamps of the step boundaries of the decode loop run inside `step_clock()`."""

    def __init__(self):
        self.marks: list = []

    def times_ms(self) -> list[float]:
        """Each decode step's duration, ms (CUDA events: GPU timeline; else host clock)."""
        return durations_ms(zip(self.marks, self.marks[1:]))


@contextlib.contextmanager
def step_clock():
    """Record a timestamp at every decode-step boundary of the one decode call inside."""
    global _marks
    clock = StepTimes()
    _marks = clock.marks
    try:
        yield clock
    finally:
        _marks = None


def clock_running() -> bool:
    """Whether a step_clock() is recording (a test of the clean-up)."""
    return _marks is not None
