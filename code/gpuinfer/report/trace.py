"""Reading a profiler trace: what the decode steps did, computed rather than read off by
eye.

The trace's events, by category, and the ranges that hold them are
gpuinfer.measure.trace_events. From them: the steps and the work each launched
(`step_work`, `step_kernels`), per-step counts and times (`step_stats`), and how the GPU
hands over from one kernel to the next (`handovers`, `between_steps`). What each slice is,
by its name, is gpuinfer.report.kernel_names; the tables of ops and kernels are
gpuinfer.report.trace_tables.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuinfer.measure.steps import STEP
from gpuinfer.measure.trace_events import (API_CATS, GPU_CATS, Event, Ranges, events, gaps,
                                           is_launch, is_sync, step_events, top_level_ops,
                                           union_length)
from gpuinfer.report.kernel_names import kernel_name


# --- the decode steps and what they did --------------------------------------------------

@dataclass
class StepWork:
    """The decode steps of a trace and what they did, linked up."""

    steps: list[Event]  # the CPU ranges of the steps
    ops: list[Event]  # top-level ATen ops inside them
    api: list[Event]  # CUDA API calls inside them
    gpu: list[Event]  # GPU work those calls launched (directly, or in a graph they did)
    launched_by: dict  # correlation id -> the API call that launched it
    start: float  # first step's start
    end: float  # last step's end, or the end of its GPU work if that is later


def step_work(trace: dict, step_name: str = STEP) -> StepWork:
    steps = step_events(trace, step_name)
    if not steps:
        raise ValueError(f"no {step_name!r} ranges in the trace: was a decode loop "
                         "profiled?")
    in_steps = Ranges(steps)
    ops = [op for op in top_level_ops(trace) if in_steps.holding(op)]
    api = [e for e in events(trace, API_CATS) if in_steps.holding(e)]
    launched_by = {e.correlation: e for e in api if e.correlation is not None}
    gpu = [e for e in events(trace, GPU_CATS) if e.correlation in launched_by]
    end = max([steps[-1].end] + [e.end for e in gpu])
    return StepWork(steps, ops, api, gpu, launched_by, steps[0].ts, end)


def step_kernels(trace: dict, step: int = 2, step_name: str = STEP) -> list[Event]:
    """The GPU work (kernels, copies) launched inside decode step number `step` (1-based),
    in the order it started on the GPU."""
    w = step_work(trace, step_name)
    if not 1 <= step <= len(w.steps):
        raise ValueError(f"step {step} is not among the trace's {len(w.steps)} steps")
    ranges = Ranges(w.steps)
    target = w.steps[step - 1]
    mine = (e for e in w.gpu if ranges.holding(w.launched_by[e.correlation]) is target)
    return sorted(mine, key=lambda e: e.ts)


@dataclass(frozen=True)
class Handovers:
    """How the GPU went from one kernel to the next within one step (times in µs)."""

    kernels: int
    overlapping: int  # kernels that started before the one ahead of them had ended
    late: int  # kernels that started after the one ahead of them had ended
    idle_us: float  # time between the step's first start and last end with nothing running
    span_us: float  # the step's first start to its last end
    # (kernel ahead, hand-overs from it where the next kernel started before it ended, all
    # hand-overs from it), for each kernel ahead of an early start, the most early first:
    # under PDL a kernel starts early only where the one ahead lets its dependents launch
    early_after: tuple[tuple[str, int, int], ...] = ()


def handovers(work: list[Event]) -> Handovers:
    """The hand-overs between the consecutive kernels of one step (`step_kernels`)."""
    work = sorted(work, key=lambda e: e.ts)
    pairs = list(zip(work, work[1:]))
    intervals = [(e.ts, e.end) for e in work]
    span = max(e.end for e in work) - work[0].ts if work else 0.0
    # each hand-over read once: the early starts are counted here, and the step's total
    # is their sum, so the two can never disagree
    after: dict[str, list[int]] = {}  # kernel ahead: [early starts after it, hand-overs]
    late = 0
    for a, b in pairs:
        counts = after.setdefault(kernel_name(a.name), [0, 0])
        counts[0] += b.ts < a.end
        counts[1] += 1
        late += b.ts > a.end
    early_after = sorted(((name, early, n) for name, (early, n) in after.items() if early),
                         key=lambda t: (-t[1], t[0]))
    return Handovers(len(work), sum(early for _, early, _ in early_after), late,
                     sum(b - a for a, b in gaps(intervals)), span, tuple(early_after))


def between_steps(trace: dict, step: int, step_name: str = STEP) -> float:
    """µs from the end of step `step`'s last GPU work to the start of the next step's first:
    in a graphed loop, the hand-over from one replay to the next."""
    this = step_kernels(trace, step, step_name)
    after = step_kernels(trace, step + 1, step_name)
    return min(e.ts for e in after) - max(e.end for e in this)


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

    @property
    def launches(self) -> float:
        """Kernels launched per step; in a trace with no GPU work (a CPU run), the top-level
        ATen ops, each of which would launch about one kernel on a GPU."""
        return self.kernels or self.ops


def step_stats(trace: dict, step_name: str = STEP) -> StepStats:
    """Per-step counts and times of the decode steps in a trace (see `StepStats`).

    Wall time runs from the first step's start on the CPU to the end of the last step's
    work, on the CPU or the GPU, whichever is later. The GPU counts as busy whenever any
    kernel or copy runs, whichever step launched it.

    The GPU span looks at the GPU side alone: from the first kernel or copy the steps
    launched to the end of the last, and how much of it they kept the GPU busy. Where the
    host queued every step before the GPU began (`queued_ahead`), the host's pace, profiler
    overhead included, cannot show in it: what idles the GPU there is the steps' own gaps.
    """
    w = step_work(trace, step_name)
    n = len(w.steps)
    wall = w.end - w.start
    cpu = sum(s.dur for s in w.steps)
    holder = Ranges(w.steps)
    op_time = union_length([(op.ts, min(op.end, holder.holding(op).end)) for op in w.ops])
    kernels = [e for e in w.gpu if e.cat == "kernel"]
    busy = union_length([(max(e.ts, w.start), min(e.end, w.end))
                         for e in events(trace, GPU_CATS)
                         if e.end > w.start and e.ts < w.end])
    gpu_start = min((e.ts for e in w.gpu), default=0.0)
    span = max((e.end for e in w.gpu), default=0.0) - gpu_start
    own_busy = union_length([(e.ts, e.end) for e in w.gpu])
    return StepStats(
        steps=n,
        wall_us=wall / n,
        cpu_us=cpu / n,
        op_us=op_time / n,
        python_us=(cpu - op_time) / n,
        ops=len(w.ops) / n,
        kernels=len(kernels) / n,
        gpu_copies=(len(w.gpu) - len(kernels)) / n,
        launch_calls=sum(is_launch(e.name) for e in w.api) / n,
        syncs=sum(is_sync(e.name) for e in w.api) / n,
        dtoh_copies=sum(e.cat == "gpu_memcpy" and "DtoH" in e.name for e in w.gpu) / n,
        kernel_us=sum(e.dur for e in kernels) / n,
        busy_us=busy / n,
        gpu_busy_fraction=busy / wall if wall > 0 else 0.0,
        gpu_span_us=span / n,
        gpu_span_busy_fraction=own_busy / span if span > 0 else 0.0,
        queued_ahead=bool(w.gpu) and w.steps[-1].end <= gpu_start,
    )
