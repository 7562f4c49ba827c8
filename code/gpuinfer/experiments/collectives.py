"""Chapter 7's all-reduce alone: its latency against its message size, by method, in the
processes that `experiments.tensor_parallel.launch` starts (one a GPU; on CPUs, gloo).

- `METHODS`: the functional all-reduce that the split step calls (NCCL on GPUs), and
  PyTorch's symmetric-memory one-shot all-reduce (on GPUs only); `methods_here()`, those
  that run on this machine;
- `collective_sweep`: every method at every size, in interleaved rounds, each timed stretch
  a CUDA graph of back-to-back calls, timed the way every experiment of the chapter is
  (`tensor_parallel.timed_rounds`: the shortest time of the ranks taking part).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from gpuinfer.decode.tensor_parallel import all_reduce
from gpuinfer.experiments.tensor_parallel import rank_device, replays, timed_rounds
from gpuinfer.measure.rounds import Rounds


@dataclass(frozen=True)
class Method:
    """A way to all-reduce a buffer: `prepare(buffer, group)` returns the function that
    runs one all-reduce of it and returns the sum."""

    name: str
    prepare: Callable[[torch.Tensor, dist.ProcessGroup], Callable[[], object]]
    gpu_only: bool = False


def _functional(buffer: torch.Tensor, group: dist.ProcessGroup) -> Callable[[], object]:
    return lambda: all_reduce(buffer, group)


def _one_shot(buffer: torch.Tensor, group: dist.ProcessGroup) -> Callable[[], object]:
    """PyTorch's symmetric-memory one-shot all-reduce: every rank's buffer is mapped into
    every other's address space once (`rendezvous`), and one kernel on each GPU reads all
    of them over NVLink and adds them up (no NVLink multicast)."""
    from torch.distributed import _symmetric_memory as symm_mem

    shared = symm_mem.empty(buffer.shape, dtype=buffer.dtype, device=buffer.device)
    symm_mem.rendezvous(shared, group.group_name)
    shared.copy_(buffer)
    return lambda: torch.ops.symm_mem.one_shot_all_reduce(shared, "sum", group.group_name)


FUNCTIONAL = Method("all_reduce", _functional)  # the split step's: NCCL on GPUs
ONE_SHOT = Method("one-shot (symmetric memory)", _one_shot, gpu_only=True)
METHODS = (FUNCTIONAL, ONE_SHOT)


def methods_here() -> tuple[Method, ...]:
    """The methods that run on this machine: all of them on GPUs, the others on CPUs."""
    return tuple(m for m in METHODS if torch.cuda.is_available() or not m.gpu_only)


@dataclass(frozen=True)
class CollectiveSweep:
    """All-reduce latency by (method name, bytes), in µs per call, over `ranks` ranks;
    `backend` is the process group's (nccl, gloo)."""

    ranks: int
    backend: str
    rounds: Rounds  # keys: (method name, bytes)

    @property
    def methods(self) -> list[str]:
        """The methods measured, in the order they ran."""
        return list(dict.fromkeys(method for method, _ in self.rounds.names))

    def median_us(self, method: str, nbytes: int) -> float:
        return self.rounds[(method, nbytes)].median


def collective_sweep(sizes: list[int], *, methods: Sequence[Method] | None = None,
                     dtype: torch.dtype = torch.bfloat16, calls: int = 100,
                     rounds: int = 10) -> CollectiveSweep:
    """A worker for `launch`: every method (default: `methods_here()`) at every size in
    bytes, in interleaved rounds, each timed stretch a graph of `calls` back-to-back
    all-reduces (on the CPU, a loop of them)."""
    methods = methods_here() if methods is None else methods
    gpu_only = [m.name for m in methods if m.gpu_only and not torch.cuda.is_available()]
    if gpu_only:
        raise ValueError(f"{', '.join(gpu_only)} runs on GPUs only, and there is no CUDA "
                         "device here: leave it out (methods_here() lists what runs)")
    group, ranks, device = dist.group.WORLD, dist.get_world_size(), rank_device()
    calls_by_key = {}
    for method in methods:
        _check_sum(method, group, dtype)
        for nbytes in sizes:
            buffer = torch.randn(nbytes // dtype.itemsize, device=device).to(dtype)
            calls_by_key[(method.name, nbytes)] = replays(method.prepare(buffer, group),
                                                           calls)
    timed = timed_rounds(calls_by_key, dict.fromkeys(calls_by_key, ranks), rounds,
                          dict.fromkeys(calls_by_key, calls))
    return CollectiveSweep(ranks, dist.get_backend(), timed)


def _check_sum(method: Method, group: dist.ProcessGroup, dtype: torch.dtype) -> None:
    """Raise unless `method` sums: rank r gives r + 1 everywhere, and every rank must get
    1 + 2 + ... + N (small integers, exact in any dtype). A timing of a wrong all-reduce
    would be a timing of nothing in particular."""
    ranks, rank = dist.get_world_size(group), dist.get_rank(group)
    mine = torch.full((1024,), rank + 1.0, dtype=dtype, device=rank_device())
    got = method.prepare(mine, group)()
    expected = ranks * (ranks + 1) / 2
    if not torch.equal(got, torch.full_like(mine, expected)):
        raise RuntimeError(f"{method.name}: the all-reduce of {ranks} ranks gave "
                           f"{got.unique().tolist()[:4]}, not {expected} everywhere")
