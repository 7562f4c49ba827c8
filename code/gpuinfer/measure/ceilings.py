"""The ceilings of this GPU, measured: how fast it moves bytes, and how fast it multiplies.

A datasheet quotes the pin rate of the memory and the tensor cores' peak at the boost clock;
no kernel reaches either. The roofline of this book is drawn from measured ceilings instead,
and every chapter that needs one re-measures it in its own run, with these functions:

- `copy_bandwidth`: bytes/s of a device-to-device copy, the simplest memory-bound kernel;
- `time_matmul`: the kernel time of one matrix product over fresh inputs;
- `matmul_peak`: FLOP/s of a square product, the compute ceiling.

The third limit of a decode step, the host's cost to launch a kernel, is
`gpuinfer.measure.launch` (`launch_us`; Chapter 3 puts it beside its remedies).
"""

from __future__ import annotations

import torch

from gpuinfer import roofline as rl
from gpuinfer.measure.timing import Timing, benchmark, benchmark_graph, fresh_inputs

# A small copy rotates over buffer pairs that touch 512 MiB together, over eight times the
# 60 MB L2 of an H100/H200: by the time a pair comes round again, it has left the cache.
ROTATION_BYTES = 2**29
# A product of at least this many FLOPs runs for tens of microseconds or more even at the
# tensor cores' peak (50 µs at 1 PFLOP/s): longer than its launch, so it is timed call
# by call.
LONG_MATMUL_FLOPS = 5e10


def copy_bandwidth(nbytes: int = 1 << 30, *, device, repeats: int = 20,
                   same_buffer: bool = False) -> tuple[float, Timing]:
    """Bytes/s of a device-to-device copy of `nbytes`, counting the bytes read and the bytes
    written, and its timing: the memory ceiling, set by the simplest memory-bound kernel.

    A large copy (one pair of buffers fills the rotation: 256 MiB or more, such as the 1 GiB
    default) is timed call by call: it runs far longer than its launch and reads memory, not
    the cache. A small one is timed from back-to-back CUDA-graph replays, so that its launch
    does not count, rotating over buffer pairs that touch `ROTATION_BYTES` together, so that
    it reads memory too. `same_buffer=True` replays the copy of one pair instead: after the
    first pass it measures the L2 cache, the trap Chapter 1 shows. Without CUDA the host
    clock times one pair (a smoke test of the code path: there is no graph to replay).
    """
    def pair():
        src = torch.randn(nbytes // 4, device=device)
        return src, torch.empty_like(src)

    def copy(src, dst):
        dst.copy_(src)

    moved = 2 * (nbytes // 4) * 4  # bytes read + bytes written
    if torch.device(device).type != "cuda" or moved >= ROTATION_BYTES:
        src, dst = pair()
        timing = benchmark(lambda: dst.copy_(src), repeats=repeats)
    else:
        pairs = fresh_inputs(pair, moved, min_total_bytes=ROTATION_BYTES)
        calls = max(len(pairs), 8)  # copies enough per replay to hide the replay's launch
        if same_buffer:
            del pairs[1:]  # every call copies the first pair again
        timing = benchmark_graph(copy, calls=calls, inputs=pairs, repeats=repeats)
        del pairs
    return moved / (timing.median / 1e3), timing


def time_matmul(m: int, n: int, k: int, *, dtype: torch.dtype = torch.bfloat16, device,
                tf32: bool = False, repeats: int = 20, eager: bool = False) -> Timing:
    """Kernel time of (m x k) @ (k x n), rotating over fresh inputs so that they come from
    memory, not from the cache.

    A short product (under `LONG_MATMUL_FLOPS`, ~50 µs) is timed from back-to-back
    CUDA-graph replays, since timed call by call it would measure its launch; a long one is
    timed call by call, its launch hidden behind the kernel before it. `eager=True` times
    call by call always: what an eager loop pays, launch included. `tf32=True` lets FP32
    products run on the tensor cores, rounding their inputs to TF32 (the previous setting
    is restored).
    """
    itemsize = torch.finfo(dtype).bits // 8
    inputs = fresh_inputs(lambda: (torch.randn(m, k, device=device, dtype=dtype),
                                   torch.randn(k, n, device=device, dtype=dtype)),
                          (m * k + k * n) * itemsize)
    allowed = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        if eager or 2 * m * n * k >= LONG_MATMUL_FLOPS:
            return benchmark(torch.matmul, inputs=inputs, repeats=repeats)
        return benchmark_graph(torch.matmul, calls=max(len(inputs), 16), inputs=inputs,
                               repeats=repeats)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed


def matmul_peak(n: int = 8192, *, dtype: torch.dtype = torch.bfloat16, device,
                repeats: int = 10) -> tuple[float, Timing]:
    """FLOP/s of an n x n x n product (2n³ FLOPs) over fresh inputs, and its timing: the
    compute ceiling, which the tensor cores approach only on large products (Chapter 1).
    FP32 stays strict FP32 (no TF32). A host clock on the CPU."""
    timing = time_matmul(n, n, n, dtype=dtype, device=device, repeats=repeats)
    work = rl.matmul(f"{n}³", n, n, n, torch.finfo(dtype).bits // 8)
    return work.flops / (timing.median / 1e3), timing
