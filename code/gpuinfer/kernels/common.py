"""What every kernel of the step shares: where it runs, how it is launched, how it
rounds, and how a kernel's programs hand a reduction to the last of them.

Triton reads TRITON_INTERPRET when a kernel is *decorated*: with it set before these
modules are imported (see `interpret.use_interpreter`), every kernel runs on the CPU
under Triton's interpreter (numpy), one program after another. The interpreter cannot
run PTX, so Programmatic Dependent Launch (the `gdc_wait` / `gdc_launch_dependents`
calls and the `launch_pdl` launch option) is off there: `pdl_supported` says when it
may be on.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch
import triton
import triton.language as tl

INTERPRETED = bool(triton.knobs.runtime.interpret)  # how this process decorates kernels


def pdl_supported(device: torch.device | str) -> bool:
    """Programmatic Dependent Launch needs compiled kernels, Hopper (sm_90) or later."""
    device = torch.device(device)
    return (not INTERPRETED and device.type == "cuda"
            and torch.cuda.get_device_capability(device)[0] >= 9)


def launch_options(num_warps: int, num_stages: int, pdl: bool) -> dict:
    """Keyword arguments of a kernel launch. `launch_pdl` is a compile option of Triton
    3.6's CUDA backend (CUDAOptions.launch_pdl): the launcher then sets the programmatic
    stream serialization attribute, which CUDA-graph capture keeps as a programmatic
    edge. The interpreter ignores all three."""
    return {"num_warps": num_warps, "num_stages": num_stages, "launch_pdl": pdl}


COMPILE_THREADS = 16  # kernels compiled at once by `compile_ahead`


def compile_ahead(fn: Callable[[], object], threads: int | None = None) -> int:
    """Compile every kernel that `fn` launches, all at once, without running any: inside,
    a launch hands its kernel's compilation to a pool of threads (Triton's
    AsyncCompileMode: its passes and ptxas let go of the GIL) instead of running it; on
    return the kernels sit in their JIT caches, where fn's own launches find them. fn
    must do nothing but launch kernels (a decode step: it reads no host value), since
    none of them runs. Returns how many kernels were compiled. Interpreted, there is
    nothing to compile and fn is not called. A kernel that fails to compile here is
    compiled again, and fails with its own error, when it is launched."""
    if INTERPRETED:
        return 0
    from concurrent.futures import ThreadPoolExecutor

    from triton.runtime._async_compile import AsyncCompileMode
    from triton.runtime.jit import JITFunction

    own = JITFunction.__dict__.get("__getitem__")  # aot.compile_only's, say

    def compile_only(self, grid):
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=True, **kwargs)

    threads = threads or min(COMPILE_THREADS, os.cpu_count() or 1)
    try:
        with ThreadPoolExecutor(threads) as pool:
            mode = AsyncCompileMode(pool, ignore_errors=True)
            JITFunction.__getitem__ = compile_only
            try:
                with mode:
                    fn()
            finally:
                if own is None:
                    del JITFunction.__getitem__
                else:
                    JITFunction.__getitem__ = own
    except Exception as err:  # noqa: BLE001 - the launches compile them one by one
        warnings.warn(f"kernels not compiled ahead ({type(err).__name__}: {err}); they "
                      "compile when first launched", stacklevel=2)
        return 0
    return sum(f.kernel is not None for f in mode.future_kernels.values())


def check_pow2(**values: int) -> None:
    for name, value in values.items():
        if value < 1 or value & (value - 1):
            raise ValueError(f"{name}={value} is not a power of two (a tl.arange size)")


class Workspace:
    """FP32 scratch for split-K partial sums and int32 arrival counters, allocated once.

    Counters start at zero and the last program to arrive sets its counter back to
    zero, so a workspace is ready for the next kernel (and the next graph replay)
    without a memset. Kernels that run one after another may share one workspace: a
    kernel touches it only after its PDL wait, when the kernel before it has finished.
    """

    def __init__(self, device, partials: int = 1, counters: int = 1):
        self.partials = torch.empty(max(partials, 1), device=device,
                                    dtype=torch.float32)
        self.counters = torch.zeros(max(counters, 1), device=device, dtype=torch.int32)

    def check(self, partials: int, counters: int) -> Workspace:
        if partials > self.partials.numel() or counters > self.counters.numel():
            raise ValueError(f"workspace too small: need {partials} partials and "
                             f"{counters} counters, have {self.partials.numel()}, "
                             f"{self.counters.numel()}")
        return self


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """x (FP32) rounded to DTYPE (to nearest, ties to even), returned as FP32.

    PyTorch rounds the result of every BF16 op to BF16; calling this where it does
    reproduces its numbers. BF16 is rounded with integer arithmetic on the bits:
    Triton's interpreter converts FP32 to BF16 by truncation, and this gives the same
    result compiled and interpreted.
    """
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        y = bits.to(tl.float32, bitcast=True)
    elif DTYPE == tl.float16:
        y = x.to(tl.float16).to(tl.float32)
    else:
        y = x
    return y


@triton.jit
def pdl_launch_next(PDL: tl.constexpr):
    """With PDL: let the next kernel launch now, so that it loads its weights while
    this one runs. Safe anywhere in a program: the next kernel's wait still waits for
    the whole of this one to finish. The products' kernels call it first of all: later,
    after a tile staged before the wait, it came as late as the tile's arrival (the
    target's step 4 % faster, its 5-token pass 7 %, H100: NOTES-57)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def pdl_wait_only(PDL: tl.constexpr):
    """With PDL: wait until the previous kernel has finished and its writes are
    visible, in a program that let the next kernel launch already
    (`pdl_launch_next`). Before it a program may read only what no kernel writes:
    weights."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """`pdl_wait_only`, then let the next kernel launch (it prefetches its weights and
    waits in turn)."""
    pdl_wait_only(PDL)
    pdl_launch_next(PDL)


@triton.jit
def arrive(counter_ptr, expected):
    """Count this program in: True in the last of `expected` programs, which resets
    the count.

    The barrier makes every thread's stores part of this program's release (the
    atomic, acq_rel at GPU scope, runs once per program); the last program's acquire
    then sees every other program's stores. CUTLASS's split-K semaphore, without a
    spin: no program ever waits for another.
    """
    tl.debug_barrier()
    count = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    last = count == expected - 1
    if last:
        tl.store(counter_ptr, 0)
    return last


@triton.jit
def split_k_sum(acc, index, ws_ptr, counter_ptr, block, pid_k, SPLIT_K: tl.constexpr,
                SIZE: tl.constexpr):
    """Sum the SPLIT_K partial results of one block of rows: (sum, is_last_program).
    acc: the program's partial sums, SIZE of them (a pass: a row per token), `index`
    each one's place in the block's partials (0 ... SIZE - 1, acc's shape).

    Each program writes its partial sums to the workspace; the last of the block's
    programs to finish adds all of them, always in split order (deterministic, unlike
    atomic adds), and runs the epilogue. Nonlinear epilogues (SiLU, rotary) need the
    whole sum: that is why the last program, not an atomic add, finishes the block.
    """
    last = pid_k == SPLIT_K - 1  # one split: every program is its block's last
    if SPLIT_K > 1:
        base = ws_ptr + block.to(tl.int64) * (SPLIT_K * SIZE)
        tl.store(base + pid_k * SIZE + index, acc)
        last = arrive(counter_ptr + block, SPLIT_K)
        if last:
            acc = tl.zeros_like(acc)
            for s in tl.static_range(SPLIT_K):
                # .cg: read at L2, never a stale L1 line left from an earlier kernel
                acc += tl.load(base + s * SIZE + index, cache_modifier=".cg")
    return acc, last


@triton.jit
def place_row(y, acc, t, ROWS_P2: tl.constexpr):
    """y (ROWS_P2, n) with row t replaced by acc (n,): a pass's results, gathered in
    registers so that every token's loads are issued before any store (a store could
    alias a later token's input, which would order the loads after it)."""
    r = tl.arange(0, ROWS_P2)[:, None]
    return tl.where(r == t, acc[None, :], y)
