"""Probe helper (issue 57): x's RMSNorm in a pass's programs costs almost all of its
growth from 2 to 5 tokens (`PASS_NO_NORM=1 pass_breakdown.py`, H100). Per element the
norm rounds twice to BF16 (`tile.normed`), each rounding five integer operations on
the bits (`common.round_to`, written so that Triton's interpreter rounds as the GPU
does). Compiled, one conversion instruction (cvt.rn.bf16.f32, to nearest, ties to
even) rounds an element the same way. `patch()` gives `tile.normed` that rounding (the
norm only: the epilogues keep `round_to`), `patch(pass_only=True)` only the pass's
norm (`mma_dot`'s); on a GPU either first asserts (`check`) that it gives `round_to`'s
bits on ~33 M values, half of them ties.

    PASS_HW_ROUND=1 PYTHONPATH=code python scripts/probes/pass_breakdown.py ...
    cd scripts/probes && PYTHONPATH=../../code python pass_order.py --hw-round ...
"""
import torch
import triton
import triton.language as tl

from gpuinfer.kernels import tile
from gpuinfer.kernels.common import round_to


@triton.jit
def round_hw(x, DTYPE: tl.constexpr):
    """`common.round_to`, BF16 by the conversion instruction (compiled only)."""
    if DTYPE == tl.bfloat16:
        y = x.to(tl.bfloat16).to(tl.float32)
    else:
        y = round_to(x, DTYPE)  # FP16 converts already; FP32 stays
    return y


@triton.jit
def both_kernel(x_ptr, a_ptr, b_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    tl.store(a_ptr + i, round_to(x, tl.bfloat16), mask=i < n)
    tl.store(b_ptr + i, round_hw(x, tl.bfloat16), mask=i < n)


def check(device="cuda"):
    g = torch.Generator(device=device).manual_seed(0)
    bits = torch.randint(-2**31, 2**31 - 1, (1 << 24,), device=device, generator=g,
                         dtype=torch.int64).to(torch.int32)
    ties = (bits & ~0xFFFF) | 0x8000  # exactly halfway between two BF16 values
    bits = torch.cat([bits, ties])
    x = bits.view(torch.float32)
    x = x[torch.isfinite(x) & (x.abs() < 3.0e38)]  # the last binade overflows alike
    a, b = torch.empty_like(x), torch.empty_like(x)
    both_kernel[(triton.cdiv(x.numel(), 1024),)](x, a, b, x.numel(), BLOCK=1024)
    same = (a.view(torch.int32) == b.view(torch.int32))
    assert bool(same.all()), f"{int((~same).sum())} of {x.numel()} differ"
    return x.numel()


@triton.jit
def normed_hw(x, g, rstd, dt):
    """`tile.normed` rounded by the conversion instruction."""
    return round_hw(g * round_hw(x * rstd, dt), dt)


def patch(pass_only: bool = False):
    """Before any kernel compiles: tile.normed's rounding by cvt, or with pass_only
    only the pass's norm (`mma_dot`'s products; the step's kernels as they are)."""
    if torch.cuda.is_available():
        print(f"hw_round: the conversion gives round_to's bits on {check()} values",
              flush=True)
    if pass_only:
        from gpuinfer.kernels import mma_dot
        mma_dot.normed = normed_hw
    else:
        tile.round_to = round_hw
