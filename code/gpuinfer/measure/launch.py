"""What a kernel launch costs, and the two ways to stop paying it: fusion and CUDA graphs.

A PyTorch op run eagerly costs the host a few microseconds (Python, the dispatcher, the
CUDA driver) before its kernel is even queued. When the kernel itself is shorter than that,
the GPU idles between kernels and the host's launch rate sets the speed. Two remedies:

- *fusion* (`torch.compile`): K elementwise ops become one kernel, which cuts the launches
  *and* the bytes, since intermediates stay in registers instead of going through memory;
- a *CUDA graph*: the same K kernels, recorded once and replayed by a single host call,
  which cuts the launch cost and nothing else: every kernel still reads and writes memory.

`chain` is the experiment: K dependent elementwise ops, one kernel each when run eagerly.
`chain_sweep` times it eagerly, compiled and replayed from a graph at several K.
`launch_us` is the host cost of one eager launch, the figure Chapters 2 and 3 quote.
`count_ops` counts the operators (about one launch each) that a function dispatches.
"""

from __future__ import annotations

import collections
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from gpuinfer.env import sync
from gpuinfer.measure.timing import Timing, benchmark, capture_graph, wall_seconds


def chain(x: torch.Tensor, k: int) -> torch.Tensor:
    """K dependent elementwise ops on x, alternating a multiply and an add.

    Eagerly each op is its own kernel that reads and writes the whole tensor; compiled, the
    K ops fuse into one kernel that reads x once and writes the result once.
    """
    for i in range(k):
        x = x * 1.0001 if i % 2 == 0 else x + 0.0001
    return x


def _tiny_launches(n_launches: int, device):
    """A function that launches a trivial kernel (`add_` on one float) n_launches times."""
    x = torch.zeros(1, device=device)

    def launches():
        for _ in range(n_launches):
            x.add_(1.0)

    return launches


def launch_cost(n_launches: int = 1000, *, device="cuda", repeats: int = 20) -> dict:
    """Microseconds per launch of a trivial kernel: eagerly from Python, and inside a graph.

    The kernel (`add_` on one float) does no work worth measuring, so the time per launch
    is the overhead: the host's cost to launch it eagerly, or the GPU's cost to start the
    next node of a replayed graph (NaN without CUDA: there are no graphs to replay).
    """
    eager = benchmark(_tiny_launches(n_launches, device), warmup=2, repeats=repeats)
    return {"n_launches": n_launches, "eager_us": eager.median * 1e3 / n_launches,
            "graph_us": graph_launch_us(n_launches, device=device, repeats=repeats)}


def graph_launch_us(n_launches: int = 1000, *, device="cuda", repeats: int = 20) -> float:
    """Microseconds per kernel of `n_launches` trivial kernels (`add_` on one float)
    captured in one CUDA graph and replayed: the GPU's cost to start the next node of a
    graph, the host not involved (NaN without CUDA: there are no graphs to replay)."""
    if torch.device(device).type != "cuda":
        return float("nan")
    launches = _tiny_launches(n_launches, device)  # holds the tensor the graph writes
    graph, _ = capture_graph(launches, warmup=1)
    replays = benchmark(graph.replay, warmup=2, repeats=repeats)
    del graph, launches  # the graph first: it writes into the tensor `launches` holds
    return replays.median * 1e3 / n_launches


@dataclass(frozen=True)
class LaunchCost:
    """Microseconds per eager launch of a tiny kernel, one value per round."""

    per_round_us: tuple[float, ...]
    n_launches: int  # launches per round
    clock: str

    # The spread over the rounds, in µs per launch.
    median = property(lambda self: statistics.median(self.per_round_us))
    low = property(lambda self: min(self.per_round_us))
    high = property(lambda self: max(self.per_round_us))
    rounds = property(lambda self: len(self.per_round_us))

    def __str__(self) -> str:
        return (f"{self.median:.2f} µs per launch ({self.low:.2f}–{self.high:.2f} over "
                f"{self.rounds} rounds of {self.n_launches} launches, {self.clock} clock)")


def launch_us(n_launches: int = 1000, *, device="cuda", rounds: int = 100,
              warmup: int = 5) -> LaunchCost:
    """The host cost of launching a tiny kernel (`add_` on one float) eagerly from Python:
    `rounds` rounds of `n_launches` launches, after `warmup` untimed ones and a sync.

    The figure is host-bound, and a host's pace drifts (other tenants, clocks) for tenths
    of a second at a time: the ten repeats of `launch_cost` gave 8.85 µs in one recording of
    Chapter 2 and 6.45 in the next. A median over 100 rounds spans about a second (1000
    launches of ~9 µs each), longer than such a stretch. It cannot remove what differs from
    one process to the next: on the book's H200 machines, fresh processes' medians ranged
    from 6.6 to 9.8 µs. Chapters 2 and 3 both quote it, with its spread, called with the
    same arguments.
    """
    x = torch.zeros(1, device=device)

    def launches():
        for _ in range(n_launches):
            x.add_(1.0)

    timed = benchmark(launches, warmup=warmup, repeats=rounds)  # syncs before its rounds
    return LaunchCost(tuple(t * 1e3 / n_launches for t in timed.times_ms), n_launches,
                      timed.clock)


def host_us_per_call(fn: Callable[[], object], *, calls: int = 200) -> float:
    """Microseconds of host time per call of fn, its GPU work left out: on a GPU a sleep
    kernel first holds the device, so that the calls only queue work and none of them waits.
    (On the CPU the work runs inside the call and is included.)"""
    for _ in range(5):
        fn()
    sync()
    if torch.cuda.is_available():
        torch.cuda._sleep(200_000_000)  # ~0.1 s at 2 GHz: longer than the calls take
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - t0
    sync()
    return elapsed / calls * 1e6


@dataclass(frozen=True)
class ChainPoint:
    """One timed configuration of the K-op chain."""

    mode: str  # "eager", "compiled" or "graph"
    k: int
    numel: int
    timing: Timing
    compile_s: float | None = None  # first-call time of a compiled chain (host clock)

    @property
    def us_per_op(self) -> float:
        return self.timing.median * 1e3 / self.k


def chain_sweep(
    ks: list[int],
    sizes: list[int],
    *,
    modes: tuple[str, ...] = ("eager", "compiled", "graph"),
    device: torch.device | str = "cuda",
    warmup: int = 3,
    repeats: int = 20,
) -> list[ChainPoint]:
    """Time `chain(x, k)` for every k in `ks` and every tensor size (elements) in `sizes`.

    "eager" launches K kernels from Python; "compiled" runs the torch.compile'd chain (one
    fused kernel); "graph" replays a CUDA graph of the eager chain (K kernels, one host
    call; CUDA only). x is random fp32. Every mode's output is checked against eager's.
    """
    points = []
    for k in ks:
        fused = None
        for numel in sizes:
            x = torch.randn(numel, device=device)
            expected = chain(x, k)
            if "eager" in modes:
                timing = benchmark(lambda: chain(x, k), warmup=warmup, repeats=repeats)
                points.append(ChainPoint("eager", k, numel, timing))
            if "compiled" in modes:
                compile_s = None
                if fused is None:
                    # dynamic=True: one kernel for every size, so one compilation per k.
                    # dynamo specialises on k (it unrolls the loop): every k is a new entry
                    # for the same code object, so the limit of 8 recompilations is raised.
                    with torch._dynamo.config.patch(recompile_limit=max(64, 2 * len(ks))):
                        fused = torch.compile(lambda t, k=k: chain(t, k), fullgraph=True,
                                              dynamic=True)
                        compile_s = wall_seconds(lambda: fused(x))[1]
                # A fused kernel contracts x*a + b into one fma, which rounds once instead
                # of twice: equal up to rounding (measured on the H200: 1.5e-5 relative at
                # worst).
                torch.testing.assert_close(fused(x), expected, rtol=1e-4, atol=1e-4)
                timing = benchmark(lambda: fused(x), warmup=warmup, repeats=repeats)
                points.append(ChainPoint("compiled", k, numel, timing, compile_s))
            if "graph" in modes:
                graph, out = capture_graph(lambda: chain(x, k))
                graph.replay()
                assert torch.equal(out, expected), "a graph replays the eager kernels"
                timing = benchmark(graph.replay, warmup=warmup, repeats=repeats)
                points.append(ChainPoint("graph", k, numel, timing))
                del graph, out
    return points


# Operators that allocate or relabel memory without launching a kernel.
_NO_KERNEL = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::lift_fresh",
              "aten::_unsafe_view"}


def count_ops(fn: Callable[[], object]) -> collections.Counter:
    """Run fn() once and count the ATen operators it dispatches, views excluded.

    Run eagerly, each counted operator is (about) one kernel launch: this is how many
    launches a step costs the host, and how many kernels a CUDA graph of it replays.
    Views (reshape, transpose, slicing) are metadata only and are not counted.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: collections.Counter = collections.Counter()

    class Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.name()
            if not getattr(func, "is_view", False) and name.split(".")[0] not in _NO_KERNEL:
                counts[name] += 1
            return func(*args, **(kwargs or {}))

    with Counter():
        fn()
    return counts
