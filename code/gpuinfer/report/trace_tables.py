"""The tables a chapter shows of a profiler trace: the ops and the kernels of a decode step.

`top_ops` lists the top-level ATen ops of the steps by their CPU time, with the GPU work
each launched; `kernel_table` lists the GPU kernels by name, what each computes and who
wrote it (`gpuinfer.report.kernel_names.kind_of`, `origin`). Both are per decode step, and
both have a Markdown form sized for the page (short names, few columns).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuinfer.measure.steps import STEP
from gpuinfer.measure.trace_events import Ranges
from gpuinfer.report.kernel_names import KINDS, ORIGINS, kernel_name, kind_of, origin
from gpuinfer.report.trace import step_work

NAME_CHARS = 44  # a kernel name longer than this is cut, so that the table fits the column


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 1] + "…"


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
    w = step_work(trace, step_name)
    in_ops = Ranges(w.ops)
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
    lines = ["| op | calls | CPU µs | kernels | GPU µs |", "|---|---:|---:|---:|---:|"]
    lines += [f"| `{r.name}` | {r.calls:.0f} | {r.cpu_us:.1f} | {r.kernels:.0f} | "
              f"{r.gpu_us:.1f} |" for r in rows]
    return "\n".join(lines)


@dataclass(frozen=True)
class KernelRow:
    """GPU kernels of one name, per decode step."""

    name: str  # `kernel_name` of the kernels
    kind: str  # what they compute: `kind_of`
    origin: str  # who wrote them: `origin`
    calls: float
    us: float  # summed duration


def kernel_table(trace: dict, step_name: str = STEP) -> list[KernelRow]:
    """The GPU kernels the decode steps launched (directly or through a CUDA graph), grouped
    by `kernel_name`, per step, largest total time first."""
    w = step_work(trace, step_name)
    by_name: dict[str, list] = {}
    for e in w.gpu:
        if e.cat == "kernel":
            by_name.setdefault(kernel_name(e.name), []).append(e)
    k = len(w.steps)
    rows = [KernelRow(name, kind_of(es[0].name), origin(es[0].name), len(es) / k,
                      sum(e.dur for e in es) / k) for name, es in by_name.items()]
    return sorted(rows, key=lambda r: -r.us)


def time_by_kind(rows: list[KernelRow]) -> dict[str, float]:
    """Kernel time per step of each of `KINDS` that kernels can be, in that order (µs)."""
    return {kind: sum(r.us for r in rows if r.kind == kind) for kind in KINDS}


def time_by_origin(rows: list[KernelRow]) -> dict[str, float]:
    """Kernel time per step by who wrote the kernels (µs), for each of `ORIGINS`."""
    return {who: sum(r.us for r in rows if r.origin == who) for who in ORIGINS}


def kernel_table_markdown(rows: list[KernelRow], n: int = 8) -> str:
    """The first `n` rows of `kernel_table` as Markdown, the rest summed in a last row."""
    total = sum(r.us for r in rows) or float("nan")
    lines = ["| kernel | kind | by | calls | µs | share |", "|---|---|---|---:|---:|---:|"]
    lines += [f"| `{_short(r.name)}` | {r.kind} | {r.origin} | {r.calls:.0f} "
              f"| {r.us:.1f} | {100 * r.us / total:.0f} % |" for r in rows[:n]]
    rest = rows[n:]
    if rest:
        us = sum(r.us for r in rest)
        calls = sum(r.calls for r in rest)
        lines.append(f"| {len(rest)} other kernels | | | {calls:.0f} | {us:.1f} "
                     f"| {100 * us / total:.0f} % |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Timeline:
    """The GPU time of a decode step, each microsecond counted once, per step (µs).

    Under programmatic dependent launch a kernel starts before the one ahead of it has
    ended, so the kernels' durations add up to more than the step. Here every instant
    from the step's first kernel start to its last kernel end goes to one owner: the
    earliest-started of the step's kernels still running then (the one the others wait
    on), by its kind (`kind_of`), or to `idle_us` when none runs. So the parts sum to the
    span: `sum(by_kind.values()) + idle_us == span_us`.
    """

    by_kind: dict[str, float]  # each of `KINDS`, in that order
    idle_us: float  # no kernel of the step running
    span_us: float  # first kernel start to last kernel end
    overlap_us: float  # of the span, time when two or more of the step's kernels ran

    def share(self, kind: str) -> float:
        """The fraction of the span that `kind` owns (NaN for an empty timeline)."""
        return self.by_kind[kind] / self.span_us if self.span_us else float("nan")


def _timeline_of(work: list) -> tuple[dict[str, float], float, float, float]:
    """(owned µs by kind, idle, span, overlap) of one step's GPU work."""
    owned = {kind: 0.0 for kind in KINDS}
    if not work:
        return owned, 0.0, 0.0, 0.0
    work = sorted(work, key=lambda e: (e.ts, -e.dur))  # earliest start first
    cuts = sorted({t for e in work for t in (e.ts, e.end)})
    idle = overlap = 0.0
    for a, b in zip(cuts, cuts[1:]):
        running = [e for e in work if e.ts <= a and e.end >= b]
        if not running:
            idle += b - a
            continue
        owned[kind_of(running[0].name)] += b - a
        if len(running) > 1:
            overlap += b - a
    return owned, idle, cuts[-1] - cuts[0], overlap


def step_timeline(trace: dict, step_name: str = STEP) -> Timeline:
    """The decode steps' GPU work on a non-overlapping timeline (`Timeline`), averaged
    over the steps of the trace. Each step is its own timeline: the work it launched
    (kernels and copies, through a CUDA graph or not)."""
    w = step_work(trace, step_name)
    ranges = Ranges(w.steps)
    per_step: dict[float, list] = {s.ts: [] for s in w.steps}
    for e in w.gpu:
        per_step[ranges.holding(w.launched_by[e.correlation]).ts].append(e)
    parts = [_timeline_of(work) for work in per_step.values()]
    k = len(parts)
    by_kind = {kind: sum(p[0][kind] for p in parts) / k for kind in KINDS}
    return Timeline(by_kind, sum(p[1] for p in parts) / k, sum(p[2] for p in parts) / k,
                    sum(p[3] for p in parts) / k)
